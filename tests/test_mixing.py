"""What a cheaper shuffle gives up, per epoch: ``coverage_min`` (the smallest share of the data
set any worker has trained on so far) and ``label_tv_max`` (the largest total-variation
distance of a worker's batch's labels from the data set's), computed here by sets and counts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.math.mixing import Mixing
from coded_shuffle.math.policies import ShufflePolicy, by_label_assignment, full_assignment


def by_sets(labels: np.ndarray, assignments: list[np.ndarray], k: int) -> tuple[float, float]:
    """Both figures after the given epochs, with Python sets and dictionaries."""
    seen = [set() for _ in range(k)]
    for a in assignments:
        for point, worker in enumerate(a):
            seen[worker].add(point)
    n, last = labels.size, assignments[-1]
    overall = {c: np.mean(labels == c) for c in set(labels.tolist())}
    tvs = []
    for w in range(k):
        mine = labels[last == w]
        tvs.append(0.5 * sum(abs(np.mean(mine == c) - p) for c, p in overall.items()))
    return min(len(s) for s in seen) / n, max(tvs)


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(2, 6),
    q=st.integers(1, 12),
    classes=st.integers(1, 5),
    epochs=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_both_figures_are_those_of_sets_and_counts(k, q, classes, epochs, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, k * q)
    mixing = Mixing(labels, k)
    assignments = [rng.permutation(np.arange(k * q) % k) for _ in range(epochs)]
    coverage = []
    for e, a in enumerate(assignments, start=1):
        got = mixing.add(a)
        want = by_sets(labels, assignments[:e], k)
        assert got["coverage_min"] == pytest.approx(want[0])
        assert got["label_tv_max"] == pytest.approx(want[1])
        coverage.append(got["coverage_min"])
    assert coverage == sorted(coverage) and 1 / k <= coverage[0] <= coverage[-1] <= 1


def test_full_reshuffles_cover_as_fast_as_they_can_and_none_stays_at_one_batch():
    k, n = 4, 40_000
    labels = np.arange(n) % 10
    full, none = Mixing(labels, k), Mixing(labels, k)
    first = full_assignment(0, 1, n, k)
    policy = ShufflePolicy("none")
    current = first
    for epoch in range(1, 9):
        a = first if epoch == 1 else full_assignment(0, epoch, n, k)
        covered = full.add(a)["coverage_min"]
        assert covered == pytest.approx(1 - (1 - 1 / k) ** epoch, abs=0.01)
        current = current if epoch == 1 else policy.next_assignment(current, 0, epoch, k)
        assert none.add(current)["coverage_min"] == pytest.approx(1 / k)


def test_a_by_label_placement_starts_far_from_the_data_set_and_full_reshuffles_mix_it():
    k, n = 4, 8_000
    labels = np.arange(n) % 8  # 8 classes: each worker starts with 2 of them
    mixing = Mixing(labels, k)
    start = mixing.add(by_label_assignment(labels, k))["label_tv_max"]
    assert start == pytest.approx(1 - 2 / 8)
    after = mixing.add(full_assignment(0, 2, n, k))["label_tv_max"]
    assert after < 0.05


def test_a_checkpointed_state_goes_on_where_it_stopped():
    labels = np.arange(100) % 3
    a, b = np.arange(100) % 4, (np.arange(100) // 25) % 4
    one = Mixing(labels, 4)
    one.add(a)
    resumed = Mixing(labels, 4, one.seen.copy())
    assert resumed.add(b) == one.add(b)
    with pytest.raises(ValueError, match="seen bits of shape"):
        Mixing(labels, 3, one.seen)
