"""Excess storage, bounds and curves: the ordering bound's searches, the rate-memory corners,
and Elmahdy-Mohajer's permutation split against the bound."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.distributed.delivery import Delivery, WorkerStore
from coded_shuffle.math import rate_memory
from coded_shuffle.math.assignment import (
    random_assignment,
    shuffle_matrix,
)
from coded_shuffle.math.plan import plan_load
from coded_shuffle.math.rate_memory import (
    _exact,
    _local_search,
    _types,
    at_corners,
    em_load,
    em_worst_case,
    envelope,
    placement_lower_bound,
)
from coded_shuffle.math.schemes import get_scheme
from coded_shuffle.math.schemes.elmahdy_mohajer import (
    cycles_of,
    em_initial_state,
    em_plan,
    improve_split,
    permutation_split,
    split_load,
    split_rows,
)

# ---------------------------------------------------------------- bounds and curves


def test_ordering_bound_local_search_never_exceeds_the_exact_search():
    rng = np.random.default_rng(5)
    for _ in range(6):
        k, q, t = 6, 3, int(rng.integers(1, 4))
        state = em_initial_state(random_assignment(k * q, k, rng), k, t)
        new = random_assignment(k * q, k, rng)
        dem, mask, wts = _types(state, new, 1 / state.splits)
        exact = _exact(k, dem, mask, wts)
        assert _local_search(k, dem, mask, wts) <= exact + 1e-9
        assert exact <= em_plan(state, new, "em").load_points + 1e-9


def test_curves_match_the_corner_points():
    assert at_corners(4, 4) == [(1.0, 3.0), (1.75, 1.5), (2.5, 2 / 3), (3.25, 0.25), (4.0, 0.0)]
    assert em_worst_case(4, 8, [1, 2, 3, 4]).tolist() == pytest.approx([6, 2, 2 / 3, 0])
    assert float(envelope([(1, 4), (2, 3), (3, 0)], 2.0)) == 2.0  # a non-convex corner drops
    # K=4: the A-T corners lie on E-M's optimal curve (Attia & Tandon 2019 Theorem 4 closes the gap)
    for s, r in at_corners(4, 4):
        assert float(em_worst_case(4, 4, s)) == pytest.approx(r)


@settings(max_examples=15, deadline=None)
@given(k=st.integers(2, 6), q=st.integers(1, 8), seed=st.integers(0, 10**6))
def test_no_excess_side_is_never_worse_than_cycles(k, q, seed):
    """``t = 1`` (E-M) and ``p = 0`` (A-T), alone and as the no-excess part of memory sharing
    (``T = 1.5``): the delivery of that part is never above ``cycles`` on the same shuffle,
    and decodes byte-exactly at every worker from its own store."""
    n = k * q
    rng = np.random.default_rng(seed)
    old, new = random_assignment(n, k, rng), random_assignment(n, k, rng)
    cycles = get_scheme("cycles")
    plain = cycles.plan(cycles.initial_state(old, k, 1.0), new).load_points
    data = torch.from_numpy(rng.integers(0, 256, (n, 48), dtype=np.uint8))
    for name in ("elmahdy-mohajer", "attia-tandon-excess"):
        for storage in (1.0, 1.5):
            scheme = get_scheme(name, 48)
            state = scheme.initial_state(old, k, storage)
            plan = scheme.plan(state, new)
            no_excess = plan.plans[0]  # parts in increasing storage: the no-excess one first
            assert no_excess.load_points <= plain + 1e-9, (name, storage)
            delivery = Delivery.prepare(plan, 48)
            symbols = delivery.encode(data)
            for w in range(k):
                store = WorkerStore.from_master(data, delivery, w)
                batch, _ = delivery.decode(w, symbols, store)
                assert torch.equal(batch, data[torch.from_numpy(plan.plans[0].new_batches[w])])


@pytest.mark.parametrize("k", [3, 4, 6, 8])
def test_seed_004_theorem_3_gap_is_reproduced_for_the_published_scheme(k):
    """The published A-T curve (``p = 0`` corner ``(1, N)``, Example 1's ``(1, 4)`` at
    ``K = N = 4``) over the worst-case optimum peaks at ``T = 1`` at exactly ``K/(K-1)``;
    the project's ``p = 0`` delivery lowers the peak below it."""
    n = 10 * k
    assert rate_memory.at_corners(4, 4, paper=True)[0] == (1.0, 4.0)
    assert rate_memory.at_corners(4, 4)[0] == (1.0, 3.0)
    ratio, at = rate_memory.gap_to_optimum(k, n, paper=True)
    assert ratio == pytest.approx(k / (k - 1)) and at == 1.0
    ours, _ = rate_memory.gap_to_optimum(k, n, paper=False)
    assert ours < k / (k - 1) - 1e-6


def _best_split_load(s: np.ndarray, t: int) -> float:
    """The lowest E-M load over every split of ``s`` into permutations, enumerated here:
    every multiset of ``q`` permutations of the support, kept when it sums to ``s``."""
    k, q = s.shape[0], int(s[0].sum())
    perms = [p for p in itertools.permutations(range(k)) if all(s[i, p[i]] for i in range(k))]
    best = math.inf
    for combo in itertools.combinations_with_replacement(perms, q):
        total = np.zeros_like(s)
        for p in combo:
            total[np.arange(k), list(p)] += 1
        if np.array_equal(total, s):
            load = sum(em_load(k, t, len(cycles_of(np.array(p)))) for p in combo)
            best = min(best, load)
    return best


@settings(max_examples=40, deadline=None)
@given(k=st.integers(2, 5), q=st.integers(1, 3), t=st.integers(2, 5), seed=st.integers(0, 10**6))
def test_em_reaches_the_best_permutation_split_where_enumerable(k, q, t, seed):
    """``K <= 5, q <= 3``: the E-M delivery's load equals the best split an exhaustive search
    finds (issue 10: 4.25 where the best split gives 4 at ``K = 5, N = 15, T = 2``)."""
    t = min(t, k)
    rng = np.random.default_rng(seed)
    old, new = random_assignment(k * q, k, rng), random_assignment(k * q, k, rng)
    plan = em_plan(em_initial_state(old, k, t), new, "elmahdy-mohajer")
    s = shuffle_matrix(old, new, k)
    want = _best_split_load(s, t)
    assert split_load(split_rows(s, t), t) == pytest.approx(want)
    assert plan.load_points <= want + 1e-9  # the clique cover may go lower still


def test_the_issues_split_example_reaches_the_bound():
    """``K = 5, N = 15, T = 2`` with assignments from ``default_rng(44)``: 4 (was 4.25), the
    lower bound the project reports."""
    rng = np.random.default_rng(44)
    old, new = random_assignment(15, 5, rng), random_assignment(15, 5, rng)
    scheme = get_scheme("elmahdy-mohajer", 80)
    state = scheme.initial_state(old, 5, 2.0)
    plan = scheme.plan(state, new)
    bound, _ = placement_lower_bound(state, new)
    assert plan_load(plan) == pytest.approx(4.0) and bound == pytest.approx(4.0)
    assert list(plan.breakdown) == ["t=2 (split enumerated)"]


@pytest.mark.parametrize(
    ("k", "n", "key"),
    [(4, 4, "t=2"), (5, 15, "t=2 (split enumerated)"), (13, 26, "t=2 (split searched)")],
)
def test_the_breakdown_says_how_the_shuffle_was_split(k, n, key):
    """One permutation needs no split; an enumerated split and a searched one say so (at
    ``K = 13``, above the clique cover's workers, where no code across permutations wins)."""
    rng = np.random.default_rng(1)
    old, new = random_assignment(n, k, rng), random_assignment(n, k, rng)
    plan = em_plan(em_initial_state(old, k, 2), new, "elmahdy-mohajer")
    assert list(plan.breakdown) == [key]


def test_the_split_search_never_loses_to_its_start():
    """Above the enumerable sizes the local search starts from the packed/greedy split and
    keeps the best it saw: never a higher load, and the rows still rebuild the shuffle."""
    rng = np.random.default_rng(5)
    for k, q, t in ((6, 10, 2), (8, 10, 3), (7, 12, 2)):
        s = shuffle_matrix(random_assignment(k * q, k, rng), random_assignment(k * q, k, rng), k)
        start = np.concatenate([np.tile(p, (m, 1)) for p, m in permutation_split(s)])
        better = improve_split(start, t)
        total = np.zeros_like(s)
        for row in better:
            assert sorted(row) == list(range(k))
            total[np.arange(k), row] += 1
        assert np.array_equal(total, s)
        before = sum(em_load(k, t, len(cycles_of(r))) for r in start)
        after = sum(em_load(k, t, len(cycles_of(r))) for r in better)
        assert after <= before + 1e-9


def test_the_old_owners_groups_lower_the_issues_attia_tandon_example(monkeypatch):
    """Issue 10: ``-K 5 -N 20 -T 1.8 -E 4 -B 80`` gave 6.8, 5.4, 6.6, 5.8 (eq. (57) alone)
    against placement bounds 5.2, 4, 4.8, 4.8; groups of ``p + 2`` with the points' old
    processors give 6, 5, 5.6, 5.4, and the clique cover 5.6, 4.2, 4.8, 4.8 (two epochs at the
    bound), verified byte for byte."""
    from coded_shuffle.math.schemes import attia_tandon_excess
    from coded_shuffle.tools.evaluate import Evaluation, run

    ev = Evaluation("attia-tandon-excess", 5, 20, 1.8, epochs=4, seed=0, point_bytes=80)
    reports = list(run(ev))
    assert [r.load_points for r in reports] == pytest.approx([5.6, 4.2, 4.8, 4.8])
    assert [r.lower_bound_points for r in reports] == pytest.approx([5.2, 4, 4.8, 4.8])
    assert all(r.verified and "p=1 (clique cover)" in r.breakdown for r in reports)
    # the scheme's own delivery (without the clique cover): the old owners' groups
    monkeypatch.setattr(attia_tandon_excess, "lower_with_clique_cover", lambda *a: a[1:3])
    reports = list(run(ev))
    assert [r.load_points for r in reports] == pytest.approx([6, 5, 5.6, 5.4])
    assert all(r.verified and "p=1 (owner groups)" in r.breakdown for r in reports)
