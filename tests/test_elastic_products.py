"""``job=elastic_matmul``'s master loop with simulated workers (one process): every method is
exact under random events, moves what it must and nothing more, and bad sizes fail in one line."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.elastic.encoding import block_rows
from coded_shuffle.elastic.product_runner import (
    PRODUCT_METHODS,
    make_product_problem,
    simulate_products,
)
from coded_shuffle.elastic.settings import make_settings
from coded_shuffle.errors import UsageError

KEYS = {
    "method",
    "step",
    "workers_available",
    "result_rel_error",
    "step_seconds",
    "compute_seconds",
    "compute_cpu_seconds",
    "decode_seconds",
    "comm_seconds",
    "comm_bytes",
    "moved_bytes",
    "placement_bytes",
    "events",
    "rows_used_max",
    "rows_used_min",
}


def run(rows: int, cols: int, rhs: int, p: int, size: int, steps: int, events, methods=None):
    problem = make_product_problem(rows, cols, rhs, p, size, seed=rows + rhs)
    methods = methods or PRODUCT_METHODS
    s = make_settings(p, size, steps, events, methods, max_workers=p, valid_methods=PRODUCT_METHODS)
    with tempfile.TemporaryDirectory() as root:
        return simulate_products(problem, s, root)


@settings(max_examples=12, deadline=None)
@given(
    p=st.integers(3, 6),
    data=st.data(),
    rhs=st.sampled_from([1, 3]),
)
def test_every_method_is_exact_under_random_departures_and_joins(p, data, rhs):
    """Random ``L``, a random departure of up to ``P - L`` workers, then a join: every product
    of every method equals ``A x`` / ``A B`` to rounding error; coded moves nothing on the
    departure; every worker's share is ``L b / n`` rows (coded) or ``b`` (non-adaptive)."""
    size = data.draw(st.integers(1, p - 1))
    gone = data.draw(st.lists(st.integers(1, p), unique=True, max_size=p - size))
    events = [{"step": 1, "leave": gone}, {"step": 2, "join": len(gone)}] if gone else None
    records = run(7 * p * size, 5 * p * size, rhs, p, size, 3, events)
    assert {r["method"] for r in records} == set(PRODUCT_METHODS)
    for r in records:
        assert set(r) >= KEYS, KEYS - set(r)
        assert r["result_rel_error"] < 1e-10, r
    coded = [r for r in records if r["method"] == "coded"]
    assert [r["workers_available"] for r in coded] == [p, p - len(gone), p][: len(coded)]
    assert coded[1]["moved_bytes"] == 0
    b = block_rows(7 * p * size if rhs == 1 else 5 * p * size, size)
    for r in coded:
        n = r["workers_available"]
        assert r["rows_used_max"] - r["rows_used_min"] <= size
        assert abs(r["rows_used_max"] - size * b / n) <= size
    assert all(
        r["rows_used_max"] == block_rows(7 * p * size, size)
        for r in records
        if r["method"] == "nonadaptive"
    )
    if gone:
        uncoded = [r for r in records if r["method"] == "uncoded"]
        assert uncoded[1]["moved_bytes"] > 0  # the departed rows are re-sent


def test_the_papers_setting_p6_l3_two_pre_empted_then_a_join():
    """``P = 6, L = 3``: machines 2 and 4 leave (sec. 3.1's example), one joins back."""
    events = [{"step": 2, "leave": [2, 4]}, {"step": 4, "join": 1}]
    records = run(600, 90, 1, 6, 3, 6, events)
    coded = [r for r in records if r["method"] == "coded"]
    assert [r["workers_available"] for r in coded] == [6, 6, 4, 4, 5, 5]
    assert [r["rows_used_max"] for r in coded] == [100, 100, 150, 150, 120, 120]  # N / n
    assert coded[2]["moved_bytes"] == 0 and coded[4]["moved_bytes"] > 0
    non = [r for r in records if r["method"] == "nonadaptive"]
    assert all(r["rows_used_max"] == 200 for r in non)  # N / L whatever n is
    assert max(r["result_rel_error"] for r in records) < 1e-12


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((10, 50, 1, 6, 3), r"job.problem.rows=10 does not split: .* need rows >= 18"),
        ((50, 10, 4, 6, 3), r"job.problem.cols=10 does not split: .* need cols >= 18"),
        ((50, 50, 0, 6, 3), r"job.problem.rhs_cols=0 must be an integer >= 1"),
    ],
)
def test_sizes_that_do_not_split_are_refused(args, match):
    with pytest.raises(UsageError, match=match):
        make_product_problem(*args)


def test_unknown_baseline_and_too_many_departures_are_refused():
    with pytest.raises(UsageError, match=r"methods=\['coded', 'distr'\] must list distinct names"):
        make_settings(6, 3, 4, methods=["coded", "distr"], valid_methods=PRODUCT_METHODS)
    with pytest.raises(UsageError, match="fewer than the recovery threshold L=3"):
        make_settings(
            6,
            3,
            4,
            [{"step": 1, "leave": [1, 2, 3, 4]}],
            PRODUCT_METHODS,
            valid_methods=PRODUCT_METHODS,
        )


def test_a_b_matches_the_product_at_every_step():
    """``rhs_cols > 1`` runs sec. 3.1 (column blocks): the same exactness, fresh ``B`` per step."""
    records = run(40, 120, 4, 4, 2, 3, [{"step": 1, "leave": [3]}], methods=["coded"])
    assert [r["workers_available"] for r in records] == [4, 3, 3]
    assert max(r["result_rel_error"] for r in records) < 1e-12
    assert np.all(np.array([r["rows_used_max"] for r in records]) == [30, 40, 40])
