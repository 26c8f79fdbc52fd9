"""Excess storage, properties: random schemes decode within their storage budget, memory
sharing over byte parts, subpacketization refused with the numbers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import (
    random_assignment,
)
from coded_shuffle.math.plan import SharedPlan, plan_load
from coded_shuffle.math.rate_memory import (
    at_worst_case,
    em_worst_case,
)
from coded_shuffle.math.schemes import get_scheme
from coded_shuffle.math.schemes.memory_sharing import check_subpacketization
from coded_shuffle.math.shuffles import cyclic_shuffle
from tests.excess_helpers import run_epochs

# ---------------------------------------------------------------- properties, memory sharing


@given(
    name=st.sampled_from(["elmahdy-mohajer", "attia-tandon-excess"]),
    k=st.integers(2, 7),
    q=st.integers(1, 3),
    storage_frac=st.floats(0, 1),
    worst=st.booleans(),
    byte_exact=st.booleans(),
    seed=st.integers(0, 2**31),
)
@settings(max_examples=40, deadline=None)
def test_random_schemes_decode_within_budget(name, k, q, storage_frac, worst, byte_exact, seed):
    """Every worker decodes from its own store; no worker exceeds ``T q`` (points) nor, with
    byte-exact parts, ``T q B`` bytes; E-M never exceeds its worst-case load; load >= bound."""
    storage = 1 + storage_frac * (k - 1)
    point_bytes = 8 * 35 if byte_exact else 23
    epochs = run_epochs(
        name,
        k,
        k * q,
        storage,
        3,
        point_bytes=point_bytes,
        worst=worst,
        seed=seed,
        byte_exact=byte_exact,
    )
    for e in epochs:
        assert e.stored_points_max <= storage * q + 1e-9
        assert e.bound <= e.ideal_load + 1e-9  # no scheme beats the cut-set bound
        assert e.load <= e.uncoded + 1e-9
        assert e.load <= e.mix_cap + 1e-9  # never above the corners' worst case
        if byte_exact:
            assert e.load == pytest.approx(e.ideal_load)  # parts are whole bytes: no rounding
            assert e.stored_bytes_max <= storage * q * point_bytes + 1e-9
            assert e.effective_storage <= storage + 1e-9
        elif name == "elmahdy-mohajer":
            assert e.ideal_load <= em_worst_case(k, k * q, storage) + 1e-9
        if worst and not byte_exact:
            want = em_worst_case if name == "elmahdy-mohajer" else at_worst_case
            assert e.ideal_load == pytest.approx(float(want(k, k * q, storage)))


def test_memory_sharing_returns_a_shared_plan_on_byte_fractions():
    scheme = get_scheme("elmahdy-mohajer")
    state = scheme.initial_state(random_assignment(12, 4, np.random.default_rng(0)), 4, 2.25)
    plan = scheme.plan(state, cyclic_shuffle(state.assignment, 4))
    assert isinstance(plan, SharedPlan)
    assert plan.fractions == pytest.approx((0.75, 0.25))
    assert [p.splits for p in plan.plans] == [3, 3]
    assert plan_load(plan) == pytest.approx(0.75 * 3 + 0.25 * 3 * 1 / 3)
    assert scheme.stored_points_max(state) == pytest.approx(2.25 * 3)


def test_byte_exact_parts_have_no_padding_and_fit_the_budget():
    scheme = get_scheme("elmahdy-mohajer")
    parts = check_subpacketization(scheme, 4, 2, 64)  # t=2 has 3 sub-points: 63 + 1 bytes
    assert parts == [(1, 1, 1), (2, 63, 3)]
    epochs = run_epochs("elmahdy-mohajer", 4, 8, 2, 2, point_bytes=64, worst=True, byte_exact=True)
    for e in epochs:
        assert e.stored_bytes_max <= 2 * 2 * 64
        assert e.payload_bytes == round(e.load * 64)  # no padding on the link either
    # without the point size the codec pads 64 bytes to 3 x 22: counted, over the budget
    padded = run_epochs("elmahdy-mohajer", 4, 8, 2, 1, point_bytes=64, worst=True)
    assert padded[0].stored_bytes_max == 2 * 2 * 66
    assert padded[0].payload_bytes == 6 * 22


def test_tiny_subpoints_are_refused_with_the_numbers():
    with pytest.raises(UsageError, match=r"20 sub-points of 3\.20 bytes.*T <= 2 or points of"):
        check_subpacketization(get_scheme("elmahdy-mohajer"), 7, 4, 64)
    with pytest.raises(UsageError, match=r"at least 80 bytes"):
        check_subpacketization(get_scheme("attia-tandon-excess"), 5, 2.2, 64)
    scheme = get_scheme("elmahdy-mohajer", 16)
    with pytest.raises(UsageError, match="sub-points of"):
        scheme.initial_state(np.arange(7), 7, 4)


@pytest.mark.parametrize(
    ("name", "n", "k", "storage", "match"),
    [
        ("elmahdy-mohajer", 10, 4, 2, "multiple of workers"),
        ("elmahdy-mohajer", 8, 4, 4.5, r"T=4\.5 out of range 1\.\.4"),
        ("attia-tandon-excess", 8, 4, 0.5, r"out of range 1\.\.4"),
        ("elmahdy-mohajer", 1 << 20, 16, 8, "exceeds"),
    ],
)
def test_check_refuses_bad_parameters(name, n, k, storage, match):
    with pytest.raises(UsageError, match=match):
        get_scheme(name).check(n, k, storage)
