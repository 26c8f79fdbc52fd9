"""Shuffle policies (``full``, ``partial``, ``none``): deterministic from the seed, balanced,
``none`` moves nothing, ``partial`` frees exactly its share of every worker's points, and at
``Q = 1`` has the distribution of ``full``; every scheme decodes partial shuffles exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.errors import UsageError
from coded_shuffle.math.policies import (
    ShufflePolicy,
    by_label_assignment,
    check_placement,
    full_assignment,
)


def start(n: int = 120, k: int = 4, seed: int = 1) -> np.ndarray:
    return full_assignment(seed, 1, n, k)


@given(
    k=st.integers(1, 8),
    q=st.integers(1, 30),
    fraction=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**20),
    epoch=st.integers(2, 50),
)
@settings(max_examples=80, deadline=None)
def test_partial_frees_exactly_its_share_of_every_worker_and_stays_balanced(
    k, q, fraction, seed, epoch
):
    old = full_assignment(seed, 1, k * q, k)
    policy = ShufflePolicy("partial", fraction)
    m = policy.moved_per_worker(q)
    assert m == min(q, max(1, int(np.floor(fraction * q + 0.5))))
    freed = policy.freed_points(old, seed, epoch, k)
    assert np.array_equal(np.bincount(old[freed], minlength=k), np.full(k, m))
    new = policy.next_assignment(old, seed, epoch, k)
    assert np.array_equal(np.bincount(new, minlength=k), np.full(k, q))  # balanced
    kept = np.setdiff1d(np.arange(k * q), freed)
    assert np.array_equal(new[kept], old[kept])  # only freed points may change owner
    assert np.array_equal(new, policy.next_assignment(old, seed, epoch, k))  # deterministic


def test_none_moves_nothing_and_full_is_todays_assignment():
    old = start()
    assert np.array_equal(ShufflePolicy("none").next_assignment(old, 0, 2, 4), old)
    assert ShufflePolicy("none").moved_per_worker(30) == 0
    again = ShufflePolicy("full").next_assignment(old, 7, 3, 4)
    assert np.array_equal(again, full_assignment(7, 3, 120, 4))


def test_partial_moves_about_its_fraction_of_what_full_moves():
    """Uncoded load: points that change worker. Over 400 epochs, ``partial`` at ``Q = 0.25``
    moves 0.25 of what ``full`` moves, within 2% (both ``(K-1)/K`` of what they free)."""
    k, q = 4, 200
    old = start(k * q, k)
    full = partial = 0
    for e in range(2, 402):
        full += int(np.sum(ShufflePolicy("full").next_assignment(old, 5, e, k) != old))
        partial += int(np.sum(ShufflePolicy("partial", 0.25).next_assignment(old, 5, e, k) != old))
    assert abs(partial / full - 0.25) < 0.02 * 0.25


def test_partial_at_one_has_the_distribution_of_full():
    """Fixed seed: over 3,000 epochs the number of a worker's points that stay with it has
    the same law under ``partial`` at ``Q = 1`` and ``full`` (hypergeometric: mean q/K);
    a two-sample Kolmogorov-Smirnov test does not reject at the 1% level."""
    from scipy.stats import ks_2samp

    k, q = 4, 12
    old = start(k * q, k, seed=3)
    stay_full, stay_partial = [], []
    for e in range(2, 3002):
        stay_full.append(
            int(np.sum(ShufflePolicy("full").next_assignment(old, 9, e, k)[old == 0] == 0))
        )
        new = ShufflePolicy("partial", 1.0).next_assignment(old, 9, e, k)
        stay_partial.append(int(np.sum(new[old == 0] == 0)))
    assert ks_2samp(stay_full, stay_partial).pvalue > 0.01
    assert abs(np.mean(stay_partial) - q / k) < 0.1


SCHEMES = [
    ("uncoded", 1.0),
    ("attia-tandon", 1.0),
    ("cycles", 1.0),
    ("best", 1.0),
    ("elmahdy-mohajer", 2.0),
    ("elmahdy-mohajer", 1.5),
    ("attia-tandon-excess", 1.5),
]


@given(
    which=st.sampled_from(SCHEMES),
    k=st.integers(2, 5),
    q=st.integers(1, 6),
    fraction=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=40, deadline=None)
def test_every_scheme_decodes_partial_shuffles_byte_exactly(which, k, q, fraction, seed):
    """Workers decode with their own caches only, byte for byte; lower bound <= load <=
    uncoded; ``none`` (the same assignment again) costs nothing."""
    from coded_shuffle.tools.evaluate import Evaluation, run

    name, storage = which
    storage = min(storage, float(k))
    old = full_assignment(seed, 1, k * q, k)
    for policy in (ShufflePolicy("partial", fraction), ShufflePolicy("none")):
        new = policy.next_assignment(old, seed, 2, k)
        (report,) = run(Evaluation(name, k, k * q, storage, seed=seed, old=old, new=new))
        assert report.verified
        assert report.lower_bound_points <= report.load_points + 1e-9
        assert report.load_points <= report.uncoded_points + 1e-9
        if policy.name == "none":
            assert report.load_points == 0 and report.broadcast_bytes == 0


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (ShufflePolicy("sometimes"), "shuffle='sometimes' unknown; valid: full, partial, none"),
        (ShufflePolicy("partial", 0.0), "fraction=0.0 out of range (0, 1]"),
        (ShufflePolicy("partial", 1.5), "fraction=1.5 out of range (0, 1]"),
    ],
)
def test_bad_policies_are_one_line(policy, message):
    with pytest.raises(UsageError) as err:
        policy.check()
    assert str(err.value) == message


def test_a_placement_by_label_deals_the_points_in_label_order():
    labels = np.array([2, 0, 1, 0, 2, 1, 1, 0, 2, 2, 0, 1])
    first = by_label_assignment(labels, 3)
    assert np.array_equal(np.bincount(first), [4, 4, 4])
    assert sorted(labels[first == 0]) == [0, 0, 0, 0]  # worker 0: the first class only
    assert np.array_equal(first[np.argsort(labels, kind="stable")], np.repeat([0, 1, 2], 4))
    with pytest.raises(
        UsageError, match=r"^data\.placement='sorted' unknown; valid: random, by_label$"
    ):
        check_placement("sorted", "data.placement")
