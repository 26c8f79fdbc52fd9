"""Excess storage, scheme by scheme: Attia-Tandon's structural invariant against its formula and
the paper's table, and Elmahdy-Mohajer's hand-checked case, worst case and cycle formula."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.errors import UndecodableError
from coded_shuffle.math.assignment import (
    random_assignment,
    shuffle_matrix,
)
from coded_shuffle.math.index_decoder import decode_plan
from coded_shuffle.math.rate_memory import (
    em_load,
    placement_lower_bound,
)
from coded_shuffle.math.schemes.elmahdy_mohajer import (
    SubProblems,
    cycle_decomposition,
    cycles_of,
    em_initial_state,
    em_plan,
    pack_cycles,
    permutation_split,
    split_rows,
    sub_message_rows,
)
from tests.excess_helpers import run_epochs

# ----------------------------------------------------------------
# Attia-Tandon (Attia & Tandon 2019)


def test_zero_byte_part_still_decodes():
    """A tiny sharing fraction rounds to a 0-byte part (ideal fractions, 23-byte points)."""
    for e in run_epochs("elmahdy-mohajer", 2, 2, 1.015625, 2, point_bytes=23, worst=True):
        assert e.load == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("storage", "load"),
    [
        (Fraction(1), Fraction(3)),
        (Fraction(7, 4), Fraction(3, 2)),
        (Fraction(5, 2), Fraction(2, 3)),
        (Fraction(13, 4), Fraction(1, 4)),
        (Fraction(4), Fraction(0)),
    ],
)
def test_attia_tandon_2019_table_k4_n4(storage, load):
    """Attia & Tandon 2019, Example 1: (storage, load) pairs measured on
    worst shuffles, byte-exactly."""
    for e in run_epochs("attia-tandon-excess", 4, 4, float(storage), 3, worst=True):
        assert e.load == pytest.approx(float(load), abs=1e-12)
        assert e.stored_points_max == pytest.approx(float(storage))
        assert e.bound <= e.load + 1e-9


def group_load(needs: list[int], k: int, p: int) -> float:
    """Eq. (57) of Attia & Tandon 2019 for any needs, by enumerating every (p+1)-subset G of the
    workers: sum over G of max_{k in G} n_k symbols, each 1/C(K, p) of a point."""
    groups = itertools.combinations(range(k), p + 1)
    return sum(max(needs[w] for w in g) for g in groups) / math.comb(k, p)


@given(
    k=st.integers(2, 6),
    q=st.integers(1, 3),
    p_frac=st.floats(0, 1),
    seed=st.integers(0, 2**31),
)
@settings(max_examples=25, deadline=None)
def test_attia_tandon_excess_equals_its_formula(k, q, p_frac, seed):
    """Any shuffle: at most eq. (57)'s ``sum_G max n_k / C(K,p)`` (the old owners' groups
    only lower it); worst case exactly ``q(K-p)/(p+1)`` (Theorem 1)."""
    p = 1 + round(p_frac * (k - 1))
    storage = 1 + p * (k - 1) / k
    for e in run_epochs("attia-tandon-excess", k, k * q, storage, 2, seed=seed):
        assert e.load <= group_load(list(e.needs), k, p) + 1e-9
        assert e.stored_points_max <= storage * q + 1e-9
    for e in run_epochs("attia-tandon-excess", k, k * q, storage, 2, seed=seed, worst=True):
        assert e.load == pytest.approx(q * (k - p) / (p + 1))


# ----------------------------------------------------------------
# Elmahdy-Mohajer (Elmahdy & Mohajer 2018)


def test_hand_checked_case_k4_t2():
    """docs/excess-storage.md: K=4, t=2, demand w1<-w4, w2<-w1, w3<-w2, w4<-w3,
    ignored w4: X_12, X_13, X_23."""
    k, t = 4, 2
    state = em_initial_state(np.arange(4), k, t)  # worker j processes point j

    def f(j: int, a: int) -> int:  # F_j^(a): sub-point of w_j's point cached by w_a (1-based)
        row = state.labels.masks[j - 1]
        return (j - 1) * state.splits + int(np.flatnonzero(row == 1 << (a - 1))[0])

    pi = np.array([3, 0, 1, 2])  # w1 needs w4's point, w2 needs w1's, ...
    sp = SubProblems(
        points=np.arange(4)[None, :],
        needs=pi[None, :],
        ignored=np.array([3]),
        others=np.array([0]),
        cycles=np.array([1]),
    )
    got = {frozenset(r[r >= 0].tolist()) for r in np.concatenate(sub_message_rows(state, sp))}
    want = {
        frozenset([f(4, 2), f(1, 3), f(1, 4), f(2, 1)]),
        frozenset([f(4, 3), f(2, 1), f(1, 3), f(3, 1)]),
        frozenset([f(2, 1), f(2, 4), f(3, 2), f(1, 3)]),
    }
    assert got == want
    plan = em_plan(state, np.array([1, 2, 3, 0]), "elmahdy-mohajer")
    assert plan.load_points == 1.0 == (k - t) / t
    decode_plan(plan)


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_worst_case_load_every_t_over_epochs(k):
    """Worst shuffle: ``q(K-t)/t`` at every integer t, epoch after epoch, byte-exactly."""
    q = 2
    for t in range(1, k + 1):
        for e in run_epochs("elmahdy-mohajer", k, k * q, t, 3, worst=True, seed=t):
            assert e.load == pytest.approx(q * (k - t) / t)
            assert e.stored_points_max == pytest.approx(t * q)
            assert e.bound == pytest.approx(e.load)  # the ordering bound meets it
    # t = 1 is the no-excess optimum (K-1)N/K; t = K sends nothing
    assert em_load(k, 1) * q == (k - 1) * k * q / k
    assert em_load(k, k) == 0


@pytest.mark.parametrize("k", [3, 4, 5])
def test_cycle_formula_is_achieved_and_optimal_for_every_permutation(k):
    """``(C(K-1,t) - C(g-1,t))/C(K-1,t-1)`` (Theorem 2), checked exactly: the plan decodes, has
    that load, and the ordering cut-set bound of the placement (valid for any code) equals it."""
    for t in range(1, k + 1):
        for perm in itertools.permutations(range(k)):
            new = np.array(perm)
            state = em_initial_state(np.arange(k), k, t)
            plan = em_plan(state, new, "elmahdy-mohajer")
            g = len(cycles_of(new))
            assert plan.load_points == pytest.approx(em_load(k, t, g))
            assert placement_lower_bound(state, new)[0] == pytest.approx(em_load(k, t, g))
            if k <= 4:
                decode_plan(plan)


def test_split_rows_are_permutations_that_rebuild_the_shuffle():
    """Both splits (cycle packing and greedy Birkhoff) reproduce the shuffle matrix exactly."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        k, q = int(rng.integers(2, 8)), int(rng.integers(1, 12))
        s = shuffle_matrix(random_assignment(k * q, k, rng), random_assignment(k * q, k, rng), k)
        greedy = [np.tile(sigma, (m, 1)) for sigma, m in permutation_split(s)]
        for rows in (split_rows(s, 2), np.concatenate(greedy), pack_cycles(s)):
            if rows is None:
                continue
            assert rows.shape == (q, k)
            assert np.all(np.sort(rows, axis=1) == np.arange(k))
            total = np.zeros_like(s)
            np.add.at(total, (np.tile(np.arange(k), q), rows.reshape(-1)), 1)
            assert np.array_equal(total, s)


def test_cycle_packing_reaches_the_bound_on_random_shuffles_at_t1():
    """At t = 1 the E-M delivery is the cycle scheme: moves - cycles, near the ordering bound."""
    rng = np.random.default_rng(0)
    k, n = 8, 800
    old, new = random_assignment(n, k, rng), random_assignment(n, k, rng)
    state = em_initial_state(old, k, 1)
    plan = em_plan(state, new, "elmahdy-mohajer")
    s = shuffle_matrix(old, new, k)
    cycles = sum(m for _, m in cycle_decomposition(s))
    assert plan.load_points == s.sum() - np.trace(s) - cycles
    bound, exact = placement_lower_bound(state, new)
    assert exact and bound <= plan.load_points <= 1.01 * bound


def test_dropping_a_symbol_makes_the_plan_undecodable():
    """The decoder really checks: one sub-message fewer and some worker fails."""
    state = em_initial_state(np.arange(5), 5, 2)
    plan = em_plan(state, np.array([1, 2, 3, 4, 0]), "elmahdy-mohajer")
    decode_plan(plan)
    first, *rest = plan.symbols
    cut = replace(plan, symbols=(first[1:], *rest))
    with pytest.raises(UndecodableError):
        decode_plan(cut)
