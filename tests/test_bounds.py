"""Lower bounds (Attia & Tandon 2016, Theorems 2 and 3): exact DP, local search, worst case."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from coded_shuffle.errors import UsageError
from coded_shuffle.math import bounds
from coded_shuffle.math.assignment import random_assignment, shuffle_matrix
from coded_shuffle.math.shuffles import cyclic_shuffle


def random_shuffle(k: int, q: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return shuffle_matrix(random_assignment(k * q, k, rng), random_assignment(k * q, k, rng), k)


def brute_force(s: np.ndarray) -> int:
    k = s.shape[0]
    return max(bounds.ordering_value(s, np.array(p)) for p in itertools.permutations(range(k)))


@st.composite
def square_matrices(draw, low: int, high: int):
    k = draw(st.integers(low, high))
    return draw(arrays(np.int64, (k, k), elements=st.integers(0, 40)))


@settings(max_examples=60, deadline=None)
@given(s=square_matrices(1, 6))
def test_dp_matches_brute_force(s):
    value, exact, order = bounds.ordering_bound(s)
    assert exact
    assert sorted(order.tolist()) == list(range(s.shape[0]))
    assert value == bounds.ordering_value(s, order) == brute_force(s)


def test_paper_example_bound():
    s = np.array([[2, 1, 2], [2, 1, 2], [1, 3, 1]])
    value, exact, order = bounds.ordering_bound(s)
    assert (value, exact, order.tolist()) == (6, True, [2, 1, 0])


@pytest.mark.parametrize("k", range(10, 15))
def test_local_search_finds_the_dp_optimum(k):
    for seed in range(2):
        s = random_shuffle(k, 50, seed)
        exact_value = bounds.ordering_bound(s)[0]
        order = bounds._search_ordering(bounds.off_diagonal(s))
        assert bounds.ordering_value(s, order) == exact_value


@settings(max_examples=10, deadline=None)
@given(s=square_matrices(10, 12))
def test_local_search_on_arbitrary_matrices_is_valid_and_near_exact(s):
    exact_value = bounds.ordering_bound(s)[0]
    order = bounds._search_ordering(bounds.off_diagonal(s))
    assert sorted(order.tolist()) == list(range(s.shape[0]))
    value = bounds.ordering_value(s, order)
    assert 0.99 * exact_value <= value <= exact_value


def test_large_k_uses_local_search_and_says_so():
    s = random_shuffle(24, 20, 1)
    value, exact, order = bounds.ordering_bound(s)
    assert not exact
    assert value == bounds.ordering_value(s, order)
    assert sorted(order.tolist()) == list(range(24))
    # deterministic
    assert bounds.ordering_bound(s)[0] == value


@pytest.mark.parametrize(("k", "q"), [(2, 5), (7, 3), (16, 2), (20, 3)])
def test_the_cyclic_shifts_bound_is_theorem_3(k, q):
    old = random_assignment(k * q, k, np.random.default_rng(0))
    s = shuffle_matrix(old, cyclic_shuffle(old, k), k)
    assert bounds.ordering_bound(s)[0] == bounds.worst_case_optimum(k * q, k) == (k - 1) * q


def test_diagonal_never_counts():
    s = np.diag([5, 7, 9])
    assert bounds.ordering_bound(s)[0] == 0
    assert bounds.ordering_value(s + np.eye(3, dtype=int), np.arange(3)) == 0


def test_bad_input_is_a_usage_error():
    with pytest.raises(UsageError, match="square"):
        bounds.ordering_bound(np.zeros((2, 3)))
    with pytest.raises(UsageError, match="multiple of workers"):
        bounds.worst_case_optimum(10, 3)
