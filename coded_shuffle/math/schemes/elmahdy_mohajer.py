"""Elmahdy-Mohajer coded shuffling with excess storage (Elmahdy & Mohajer 2018;
docs/excess-storage.md).

Placement (Elmahdy & Mohajer 2018, Section III): the point processed by worker ``h`` is split into
``C(K-1, t-1)`` sub-points labelled by the ``(t-1)``-subsets ``L`` of the other workers;
worker ``k != h`` caches the sub-points whose label contains ``k``. Every sub-point is known by
``L + {h}``: exactly ``t`` workers, and every worker stores ``t * q`` points.

Delivery for general ``N = q*K`` (Section VI-A): the shuffle's worker-to-worker multigraph is
``q``-regular, so it splits into ``q`` permutations (a maximum-cycle Birkhoff split, fixed points
first); each permutation is a canonical ``N = K`` problem on its own ``K`` points. For one
permutation in which worker ``k`` needs the point of worker ``pi(k)``, the sub-message of a
``t``-subset ``S`` is (the case checked by hand in docs/excess-storage.md, generalised)::

    X_S = XOR_{k in S} ( F_{pi(k)}^{S - k}  XOR  F_k^{S - k} )

where ``F_j^L`` with ``j in L`` is the *virtual* sub-point ``XOR_{a not in L} F_j^{L - j + a}``
(so ``F_k^{S-k}`` and ``F_{pi(k)}^{S-k}`` are both known to every member of ``S`` but ``k``, and
``k`` gets one equation in its own unknowns). With one representative per cycle of ``pi``
(fixed points are cycles) and ``u`` one of them (the *ignored worker*), the master sends
``X_S`` for every ``S`` of the other ``K-1`` workers except the subsets of the other
representatives: ``C(K-1, t) - C(g-1, t)`` sub-messages (Theorem 2; ``(K-t)/t`` points for a
single cycle, Theorem 1). Every plan is proved by the generic index decoder before use.

The project's additions (not in the paper): on random shuffles the delivery is the lowest of
the split above, the clique cover (:mod:`.clique_cover`: XOR multicasts across the
permutations) and, up to ``K = 8``, a mix of every permutation's code with the cliques
(:func:`permutations_and_cliques`: an LP by column generation, then whole uses by a MILP).

Update (Section IV, cache update and relabelling): the new processor ``h'`` keeps the point
whole; in the labels of a moved point ``h'`` is replaced by ``h``, so the old processor keeps
exactly the sub-points it must cache, and the structure is the same in every epoch.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from itertools import combinations
from math import comb

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csc_matrix, csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from coded_shuffle.math.assignment import points_by_pair, shuffle_matrix
from coded_shuffle.math.bounds import off_diagonal
from coded_shuffle.math.plan import DeliveryPlan
from coded_shuffle.math.rate_memory import em_load
from coded_shuffle.math.schemes.base import batch_plan_fields
from coded_shuffle.math.schemes.clique_cover import (
    CoverProblem,
    DemandTypes,
    cover_columns,
    cover_lp_with_prices,
    cover_problem,
    cover_rows,
    lower_with_clique_cover,
)
from coded_shuffle.math.schemes.cycle_plan import greedy_cycles
from coded_shuffle.math.schemes.cycles import Cycles
from coded_shuffle.math.schemes.memory_sharing import CornerScheme, grouped_blocks
from coded_shuffle.math.state import CacheState

RANK_TABLE_WORKERS = 16  # label ranks are looked up in a (K, 2^K) table up to this K
SHORT_CYCLE_MAX = 3  # the greedy split packs cycles up to this length before completing
PACK_ATTEMPTS = 6  # seeded tie orders tried when packing cycles into permutations ...
PACK_UNITS_MAX = 5_000  # ... when the cycles are at most this many (each try is O(cycles * q))
EXACT_SPLIT_WORKERS = 5  # the best split is enumerated up to this K ...
EXACT_SPLIT_ROWS = 3  # ... and this q
SEARCH_SPLIT_ROWS = 256  # the local search runs up to this q (rows of K-permutations)
SPLIT_SEARCH_ROUNDS = 6000  # trades tried by the local search at most ...
SPLIT_SEARCH_PATIENCE = 1500  # ... stopping after this many without a better split
SPLIT_SEARCH_SEED = 0
PERMUTATION_CODE_WORKERS = 8  # E-M's permutation codes join the cover up to this K (8! priced)
PRICED_PER_ROUND = 100  # column generation: codes added per LP at most
PERMUTATION_MILP_NODES = 100  # branch-and-bound nodes of the whole uses' MILP at most


@dataclass(frozen=True)
class EMLabels:
    """The E-M placement: ``masks[x, j]`` = label bitmask of sub-point ``j`` of point ``x``.

    Labels are ``(t-1)``-subsets of the workers other than the point's processor; relabelling
    changes which label a stored sub-point carries, never its bytes.
    """

    t: int
    masks: np.ndarray  # (N, splits) int64


def em_splits(num_workers: int, t: int) -> int:
    """Sub-points per point: ``C(K-1, t-1)`` (Elmahdy & Mohajer 2018, eq. (7))."""
    return comb(num_workers - 1, t - 1)


def _comb_table(n: int) -> np.ndarray:
    table = np.zeros((n + 1, n + 2), dtype=np.int64)
    for a in range(n + 1):
        for b in range(a + 1):
            table[a, b] = comb(a, b)
    return table


def label_rank(masks: np.ndarray, owner: np.ndarray, num_workers: int) -> np.ndarray:
    """Colex rank of every label among the ``(t-1)``-subsets of ``[K] - {owner}`` (vectorised;
    read from a table of every ``(owner, mask)`` up to :data:`RANK_TABLE_WORKERS` workers)."""
    if num_workers <= RANK_TABLE_WORKERS:
        return _rank_table(num_workers)[owner, masks]
    return _label_rank(masks, owner, num_workers)


@functools.cache
def _rank_table(num_workers: int) -> np.ndarray:
    masks = np.arange(1 << num_workers, dtype=np.int64)
    return _label_rank(masks[None, :], np.arange(num_workers)[:, None], num_workers)


def _label_rank(masks: np.ndarray, owner: np.ndarray, num_workers: int) -> np.ndarray:
    masks, owner = np.broadcast_arrays(
        np.asarray(masks, dtype=np.int64), np.asarray(owner, dtype=np.int64)
    )
    table = _comb_table(num_workers)
    rank = np.zeros(masks.shape, dtype=np.int64)
    seen = np.zeros(masks.shape, dtype=np.int64)
    for b in range(num_workers):
        bit = (masks >> b) & 1
        seen += bit
        pos = b - (owner < b)
        rank += bit * table[np.maximum(pos, 0), seen]
    return rank


def label_table(num_workers: int, t: int) -> np.ndarray:
    """``table[h, j]`` = the label of rank ``j`` for points processed by ``h`` (initial slots)."""
    s = em_splits(num_workers, t)
    table = np.zeros((num_workers, s), dtype=np.int64)
    for h in range(num_workers):
        others = [w for w in range(num_workers) if w != h]
        masks = np.array([sum(1 << w for w in c) for c in combinations(others, t - 1)], np.int64)
        table[h, label_rank(masks, np.full(masks.size, h), num_workers)] = masks
    return table


def em_caches(assignment: np.ndarray, masks: np.ndarray, num_workers: int) -> tuple:
    """Worker ``k`` caches its batch whole and every sub-point whose label contains ``k``."""
    caches = []
    for k in range(num_workers):
        held = ((masks >> k) & 1).astype(bool) | (assignment == k)[:, None]
        caches.append(np.flatnonzero(held.reshape(-1)).astype(np.int64))
    return tuple(caches)


def em_state(assignment: np.ndarray, num_workers: int, t: int, masks: np.ndarray) -> CacheState:
    return CacheState(
        assignment=np.asarray(assignment, dtype=np.int64),
        num_workers=num_workers,
        splits=em_splits(num_workers, t),
        caches=em_caches(assignment, masks, num_workers),
        labels=EMLabels(t, masks),
    )


def em_initial_state(assignment: np.ndarray, num_workers: int, t: int) -> CacheState:
    """Algorithms 1-2 of Elmahdy & Mohajer 2018: canonical labels, slot
    ``j`` = label of rank ``j``."""
    assignment = np.asarray(assignment, dtype=np.int64)
    masks = label_table(num_workers, t)[assignment]
    return em_state(assignment, num_workers, t, masks)


def em_next_state(state: CacheState, new_assignment: np.ndarray) -> CacheState:
    """Algorithm 5 of Elmahdy & Mohajer 2018: relabel moved points (``h'``
    in a label becomes ``h``)."""
    old, new = state.assignment, np.asarray(new_assignment, dtype=np.int64)
    masks = state.labels.masks
    has_new = ((masks >> new[:, None]) & 1).astype(bool) & (old != new)[:, None]
    swap = (np.int64(1) << new) | (np.int64(1) << old)
    masks = np.where(has_new, masks ^ swap[:, None], masks)
    return em_state(new, state.num_workers, state.labels.t, masks)


# ---------------------------------------------------------------- permutation split


def _extendable(counts: np.ndarray, free: np.ndarray) -> np.ndarray | None:
    """A perfect matching of the ``free`` workers in the support of ``counts``, or ``None``."""
    idx = np.flatnonzero(free)
    if idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    sub = csr_matrix((counts[np.ix_(idx, idx)] > 0).astype(np.int8))
    match = maximum_bipartite_matching(sub, perm_type="column")
    if np.any(match < 0):
        return None
    return idx[match]


def _short_cycles(counts: np.ndarray, free: np.ndarray, length: int):
    """Directed cycles of ``length`` among ``free`` workers in the support of ``counts``."""
    k = counts.shape[0]
    support = counts > 0
    for start in range(k):
        if not free[start]:
            continue
        stack = [(start, [start])]
        while stack:
            v, path = stack.pop()
            if len(path) == length:
                if support[v, start]:
                    yield path
                continue
            for w in range(start + 1, k):
                if free[w] and support[v, w] and w not in path:
                    stack.append((w, [*path, w]))


def max_cycle_permutation(counts: np.ndarray) -> np.ndarray:
    """A permutation in the support of ``counts`` with many cycles (fixed points, short cycles).

    Greedy: every available fixed point, then cycles of length 2..SHORT_CYCLE_MAX while the rest
    still has a perfect matching (checked with scipy's bipartite matching), then any completion.
    """
    k = counts.shape[0]
    sigma = np.full(k, -1, dtype=np.int64)
    free = np.ones(k, dtype=bool)

    def take(cycle: list[int]) -> bool:
        trial = free.copy()
        trial[cycle] = False
        if _extendable(counts, trial) is None:
            return False
        for a, b in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
            sigma[a] = b
        free[cycle] = False
        return True

    for v in range(k):
        if counts[v, v] > 0:
            take([v])
    for length in range(2, SHORT_CYCLE_MAX + 1):
        for cycle in _short_cycles(counts, free, length):
            if all(free[cycle]):
                take(cycle)
    rest = _extendable(counts, free)
    sigma[np.flatnonzero(free)] = rest
    return sigma


def permutation_split(shuffle: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """The shuffle matrix as permutations with multiplicities (Birkhoff-von Neumann).

    Row and column sums are equal, so every support has a perfect matching (Konig); each step
    takes a maximum-cycle permutation as often as its smallest entry allows.
    """
    counts = np.array(shuffle, dtype=np.int64)
    out = []
    while counts.any():
        sigma = max_cycle_permutation(counts)
        rows = np.arange(counts.shape[0])
        mult = int(counts[rows, sigma].min())
        counts[rows, sigma] -= mult
        out.append((sigma, mult))
    return out


def cycles_of(sigma: np.ndarray) -> list[list[int]]:
    """The cycles of a permutation (fixed points included), each from its smallest worker."""
    seen = np.zeros(sigma.size, dtype=bool)
    cycles = []
    for v in range(sigma.size):
        if seen[v]:
            continue
        cycle, w = [], v
        while not seen[w]:
            seen[w] = True
            cycle.append(w)
            w = int(sigma[w])
        cycles.append(cycle)
    return cycles


def cycle_decomposition(shuffle: np.ndarray) -> list[tuple[list[int], int]]:
    """Off-diagonal arcs as directed cycles with multiplicities, shortest first (docs/schemes.md,
    cycles; the decomposition of :func:`~coded_shuffle.math.schemes.cycle_plan.greedy_cycles`)."""
    return [(list(c.workers), c.multiplicity) for c in greedy_cycles(off_diagonal(shuffle))]


def _first_fit(k: int, q: int, cycles: list[tuple[list[int], int]]) -> np.ndarray | None:
    sigmas = np.tile(np.arange(k, dtype=np.int64), (q, 1))
    free = np.ones((k, q), dtype=bool)
    for cycle, mult in cycles:
        rows = np.flatnonzero(free[cycle].all(axis=0))[:mult]
        if rows.size < mult:
            return None
        free[np.ix_(cycle, rows)] = False
        sigmas[np.ix_(rows, cycle)] = np.roll(np.array(cycle), -1)
    return sigmas


def pack_cycles(shuffle: np.ndarray, attempts: int = PACK_ATTEMPTS) -> np.ndarray | None:
    """``q`` permutations (rows) made of the shortest-first cycles, or ``None``.

    First fit, longest cycles first (ties in a few seeded orders, for at most
    :data:`PACK_UNITS_MAX` cycles: above, one order only). A worker left out of a row
    keeps one of its diagonal points there (a fixed point); first fit concentrates the cycles
    in the first rows, which the E-M load favours (``C(g-1, t)`` is convex in ``g``).
    """
    k = shuffle.shape[0]
    q = int(shuffle[0].sum())
    cycles = cycle_decomposition(shuffle)
    units = [(c, 1) for c, m in cycles for _ in range(m)]
    for attempt in range(attempts if len(units) <= PACK_UNITS_MAX else 1):
        if attempt == 0:
            order = sorted(cycles, key=lambda c: -len(c[0]))
        else:
            perm = np.random.default_rng(attempt).permutation(len(units))
            order = sorted((units[i] for i in perm), key=lambda c: -len(c[0]))
        sigmas = _first_fit(k, q, order)
        if sigmas is not None:
            return sigmas
    return None


def split_rows(shuffle: np.ndarray, t: int = 1) -> np.ndarray:
    """The shuffle as ``q`` permutations (rows) with the lowest E-M load at ``t`` found.

    Exact (every split enumerated) for ``K <= EXACT_SPLIT_WORKERS`` and
    ``q <= EXACT_SPLIT_ROWS``; otherwise the lower of the cycle packing and the greedy
    Birkhoff split, improved by :func:`improve_split` (``q <= SEARCH_SPLIT_ROWS``).
    Deterministic: master and workers derive the same rows.
    """
    k = shuffle.shape[0]
    q = int(shuffle[0].sum())
    if k <= EXACT_SPLIT_WORKERS and q <= EXACT_SPLIT_ROWS:
        return best_split(shuffle, t)
    rows = heuristic_split(shuffle, t)
    if q <= SEARCH_SPLIT_ROWS:
        rows = improve_split(rows, t)
    return rows


def split_method(num_workers: int, q: int) -> str | None:
    """How :func:`split_rows` splits a shuffle of ``q`` points per worker (``None``: one
    permutation, nothing to split); the plan's breakdown says it."""
    if q <= 1:
        return None
    if num_workers <= EXACT_SPLIT_WORKERS and q <= EXACT_SPLIT_ROWS:
        return "split enumerated"
    return "split searched" if q <= SEARCH_SPLIT_ROWS else "split heuristic"


def heuristic_split(shuffle: np.ndarray, t: int) -> np.ndarray:
    """The cycle packing or the greedy Birkhoff split, whichever has the lower E-M load at
    ``t`` (the local search's start)."""
    greedy = np.concatenate(
        [np.tile(sigma, (mult, 1)) for sigma, mult in permutation_split(shuffle)]
    )
    packed = pack_cycles(shuffle)
    return greedy if packed is None else min((packed, greedy), key=lambda r: split_load(r, t))


def split_load(sigmas: np.ndarray, t: int) -> float:
    """E-M load of a split into permutations (rows), in points (Elmahdy &
    Mohajer 2018, Theorems 1-3)."""
    uniq, counts = np.unique(sigmas, axis=0, return_counts=True)
    k = sigmas.shape[1]
    return sum(c * em_load(k, t, len(cycles_of(u))) for u, c in zip(uniq, counts, strict=True))


def _saving(sigma: np.ndarray, t: int) -> int:
    """``C(g-1, t)``: what a permutation with ``g`` cycles saves (Elmahdy &
    Mohajer 2018, Theorem 4)."""
    return comb(len(cycles_of(sigma)) - 1, t)


def best_split(shuffle: np.ndarray, t: int) -> np.ndarray:
    """The split into permutations with the largest total saving, by enumeration."""
    k = shuffle.shape[0]
    q = int(shuffle[0].sum())
    support = [np.flatnonzero(shuffle[v]) for v in range(k)]
    perms = [np.array(p, dtype=np.int64) for p in itertools.product(*support) if len(set(p)) == k]
    savings = [_saving(p, t) for p in perms]
    best: tuple[int, list[int]] = (-1, [])
    rows = np.arange(k)

    def search(start: int, left: np.ndarray, chosen: list[int], total: int) -> None:
        nonlocal best
        if not left.any():
            if total > best[0]:
                best = (total, list(chosen))
            return
        for i in range(start, len(perms)):
            p = perms[i]
            if np.all(left[rows, p] > 0):
                left[rows, p] -= 1
                chosen.append(i)
                search(i, left, chosen, total + savings[i])
                chosen.pop()
                left[rows, p] += 1

    search(0, np.array(shuffle, dtype=np.int64), [], 0)
    assert len(best[1]) == q
    return np.stack([perms[i] for i in best[1]])


def _swap_orbits(s1: np.ndarray, s2: np.ndarray) -> list[np.ndarray]:
    """Sets ``A`` of workers on which rows ``s1`` and ``s2`` can trade images and both stay
    permutations (the orbits of ``k -> s1^-1(s2(k))`` where the rows differ)."""
    inv = np.empty_like(s1)
    inv[s1] = np.arange(s1.size)
    step = inv[s2]
    seen = s1 == s2
    orbits = []
    for v in range(s1.size):
        if seen[v]:
            continue
        orbit, w = [], v
        while not seen[w]:
            seen[w] = True
            orbit.append(w)
            w = int(step[w])
        orbits.append(np.array(orbit, dtype=np.int64))
    return orbits


def improve_split(rows: np.ndarray, t: int, rounds: int = SPLIT_SEARCH_ROUNDS) -> np.ndarray:
    """Local search over splits: two rows trade their images on one orbit (or two), which
    keeps the sum and both rows permutations; a trade is kept when the total saving does not
    drop (sideways moves let it cross plateaus); it stops after ``20 q K`` trades (at most
    ``SPLIT_SEARCH_PATIENCE``) without a better split. Seeded: the same rows give the same
    result."""
    rows = rows.copy()
    q = rows.shape[0]
    if q < 2:
        return rows
    rng = np.random.default_rng(SPLIT_SEARCH_SEED)
    saving = [_saving(r, t) for r in rows]
    best_total, best_rows = sum(saving), rows.copy()
    patience = min(SPLIT_SEARCH_PATIENCE, 20 * q * rows.shape[1])  # small splits settle fast
    since = 0
    for _ in range(rounds):
        since += 1
        if since > patience:
            break
        a, b = rng.choice(q, 2, replace=False)
        orbits = _swap_orbits(rows[a], rows[b])
        if not orbits:
            continue
        pick = [orbits[int(rng.integers(len(orbits)))]]
        if len(orbits) > 1 and rng.random() < 0.5:
            pick.append(orbits[int(rng.integers(len(orbits)))])
        moved = np.unique(np.concatenate(pick))
        ra, rb = rows[a].copy(), rows[b].copy()
        ra[moved], rb[moved] = rows[b][moved], rows[a][moved]
        new_a, new_b = _saving(ra, t), _saving(rb, t)
        if new_a + new_b >= saving[a] + saving[b]:
            rows[a], rows[b] = ra, rb
            saving[a], saving[b] = new_a, new_b
            if sum(saving) > best_total:
                best_total, best_rows, since = sum(saving), rows.copy(), 0
    return best_rows


@dataclass(frozen=True)
class SubProblems:
    """``q`` canonical problems: row ``m`` has points ``points[m, i]`` (processed by ``i``)."""

    points: np.ndarray  # (q, K): the point worker i processes in sub-problem m
    needs: np.ndarray  # (q, K): pi[m, k] = worker whose point k needs
    ignored: np.ndarray  # (q,): the ignored worker u
    others: np.ndarray  # (q,): bitmask of the other cycle representatives
    cycles: np.ndarray  # (q,): number of cycles g


def sub_problems(old: np.ndarray, new: np.ndarray, num_workers: int, t: int = 1) -> SubProblems:
    """Splits the transition into permutations and takes concrete points for every row."""
    k = num_workers
    sigmas = split_rows(shuffle_matrix(old, new, k), t)
    return rows_with_points(old, new, k, sigmas, fixed=True)


def rows_with_points(
    old: np.ndarray, new: np.ndarray, num_workers: int, sigmas: np.ndarray, fixed: bool
) -> SubProblems:
    """Sub-problems for the permutation rows ``sigmas`` (worker ``i``'s point goes to
    ``sigmas[m, i]``): each takes the next point that moves so, or ``-1`` (a zero point, known
    to everyone) when none is left; a fixed point is a real point that stays only if ``fixed``.
    """
    k = num_workers
    order, offsets = points_by_pair(old, new, k)
    keys = (np.arange(k)[None, :] * k + sigmas).reshape(-1)
    by_key = np.argsort(keys, kind="stable")
    rank = np.empty_like(by_key)
    ordered = keys[by_key]
    rank[by_key] = np.arange(keys.size) - np.searchsorted(ordered, ordered, side="left")
    real = rank < offsets[keys + 1] - offsets[keys]
    if not fixed:
        real &= (sigmas != np.arange(k)[None, :]).reshape(-1)
    points = np.where(real, order[np.minimum(offsets[keys] + rank, order.size - 1)], -1)
    points = points.reshape(sigmas.shape)
    needs = np.empty_like(sigmas)
    np.put_along_axis(needs, sigmas, np.broadcast_to(np.arange(k), sigmas.shape), 1)
    uniq, inverse = np.unique(sigmas, axis=0, return_inverse=True)
    ignored, others, cycles = [], [], []
    for sigma in uniq:
        cyc = cycles_of(sigma)
        reps = [min(c) for c in cyc]
        u = reps[int(np.argmax([len(c) for c in cyc]))]
        ignored.append(u)
        others.append(sum(1 << r for r in reps if r != u))
        cycles.append(len(cyc))
    inverse = inverse.reshape(-1)
    return SubProblems(
        points=points,
        needs=needs,
        ignored=np.array(ignored, dtype=np.int64)[inverse],
        others=np.array(others, dtype=np.int64)[inverse],
        cycles=np.array(cycles, dtype=np.int64)[inverse],
    )


# ---------------------------------------------------------------- delivery


def _subpoint_ids(
    state: CacheState,
    inv: np.ndarray,
    points: np.ndarray,
    owner: np.ndarray,
    masks: np.ndarray,
    valid: np.ndarray | bool = True,
) -> np.ndarray:
    """Sub-point ids of label ``masks`` of ``points`` (processed by ``owner``); -1 if not valid
    or the point is ``-1``."""
    valid = valid & (points >= 0)  # -1: a zero point (a row's missing point), no term
    points = np.where(points >= 0, points, 0)
    ranks = np.where(valid, label_rank(masks, owner, state.num_workers), 0)
    return np.where(valid, points * state.splits + inv[points, ranks], -1)


def em_symbol_rows(state: CacheState, new_assignment: np.ndarray) -> list[np.ndarray]:
    """Terms of every sub-message, as ``(rows, width)`` matrices padded with ``-1``.

    Loops over the ``t``-subsets ``S`` and their members; vectorised over the ``q`` rows.
    """
    new = np.asarray(new_assignment, dtype=np.int64)
    sp = sub_problems(state.assignment, new, state.num_workers, state.labels.t)
    return sub_message_rows(state, sp)


def sub_message_rows(state: CacheState, sp: SubProblems) -> list[np.ndarray]:
    """``X_S`` for every sent ``S`` of every sub-problem row (see the module docstring)."""
    k, t, s = state.num_workers, state.labels.t, state.splits
    if t >= k:
        return []
    masks = state.labels.masks
    inv = np.empty_like(masks)
    ranks = label_rank(masks, state.assignment[:, None], k)
    np.put_along_axis(inv, ranks, np.broadcast_to(np.arange(s), masks.shape), 1)
    rows_out = []
    workers = np.arange(k)
    for members in combinations(range(k), t):
        smask = sum(1 << w for w in members)
        send = (((smask >> sp.ignored) & 1) == 0) & ((smask & ~sp.others) != 0)
        rows = np.flatnonzero(send)
        if rows.size == 0:
            continue
        cols = []
        for kk in members:
            lab = smask & ~(1 << kk)
            p_rows = sp.points[rows]
            # F_k^{S-k}: a real sub-point of k's own point, known to all of S
            cols.append(_subpoint_ids(state, inv, p_rows[:, kk], np.full(rows.size, kk), lab))
            # F_{pi(k)}^{S-k}: real if pi(k) not in S, else virtual (a sum over a not in S-k)
            j = sp.needs[rows, kk]
            xj = p_rows[np.arange(rows.size), j]
            virtual = ((smask >> j) & 1).astype(bool) & (j != kk)
            cols.append(_subpoint_ids(state, inv, xj, j, lab, ~virtual))
            for a in workers[((lab >> workers) & 1) == 0]:
                vmask = (lab & ~(np.int64(1) << j)) | (1 << int(a))
                cols.append(_subpoint_ids(state, inv, xj, j, vmask, virtual))
        rows_out.append(_cancel_pairs(np.stack(cols, axis=1)))
    return rows_out


def _cancel_pairs(terms: np.ndarray) -> np.ndarray:
    """XOR semantics: a sub-point named twice in a symbol cancels (rows padded with ``-1``)."""
    terms = np.sort(terms, axis=1)
    dup = (terms[:, 1:] == terms[:, :-1]) & (terms[:, 1:] >= 0)
    # multiplicities are at most two, so equal neighbours form disjoint pairs
    kill = np.zeros(terms.shape, dtype=bool)
    kill[:, 1:] |= dup
    kill[:, :-1] |= dup
    return np.where(kill, -1, terms)


@functools.cache
def _all_needs(num_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Every permutation of the workers but the identity, as ``needs`` (worker ``k`` needs the
    point of ``needs[k]``), and its number of cycles (fixed points included)."""
    needs = np.array(list(itertools.permutations(range(num_workers)))[1:], dtype=np.int64)
    return needs, np.array([len(cycles_of(p)) for p in needs], dtype=np.int64)


def permutation_uses(types: DemandTypes, needs: np.ndarray) -> csr_matrix:
    """``(types, permutations)``: the sub-points of each type that one use of a permutation's
    code serves (one point per arc ``needs[k] -> k``: one sub-point of each of its types)."""
    workers = np.arange(needs.shape[1])
    holds = ((types.others[None, :] >> workers[:, None]) & 1).astype(bool)  # (K, types)
    uses = np.zeros((needs.shape[0], types.demander.size), dtype=np.int8)
    for k in workers:
        mine = types.demander == k
        moving = needs[:, k] != k
        uses[moving] += (holds[needs[moving, k]] & mine[None, :]).astype(np.int8)
    return csr_matrix(uses.T)


@dataclass(frozen=True)
class PermutationCodes:
    """E-M's code of every permutation of the workers as a column of the cover."""

    needs: np.ndarray  # (codes, K): worker k needs the point of needs[c, k]
    uses: csc_matrix  # (types, codes): sub-points of each type one use serves
    costs: np.ndarray  # (codes,): symbols per use, C(K-1,t) - C(g-1,t) for g cycles


def permutation_codes(types: DemandTypes, num_workers: int, t: int) -> PermutationCodes:
    """The codes of all ``K! - 1`` permutations (Theorem 2 of Elmahdy &
    Mohajer 2018 for their costs)."""
    needs, cycles = _all_needs(num_workers)
    costs = comb(num_workers - 1, t) - _comb_table(num_workers)[cycles - 1, t]
    return PermutationCodes(needs, permutation_uses(types, needs).tocsc(), costs.astype(float))


def priced_permutations(problem: CoverProblem, codes: PermutationCodes) -> np.ndarray:
    """The permutations the LP over cliques, single sub-points and every permutation code
    uses, found by column generation: start from the fractional clique cover and add the
    :data:`PRICED_PER_ROUND` codes of least negative reduced cost (cost minus the LP's
    prices of the sub-points a use serves) until none is negative, when the LP is optimal
    over all codes. Ties go to the first permutation in lexicographic order."""
    types = problem.types
    n, c = types.demander.size, problem.member.shape[0]
    chosen = np.zeros(0, dtype=np.int64)
    while True:
        cover = cover_columns(problem.member, n, codes.uses[:, chosen])
        costs = np.concatenate([np.ones(c + n), codes.costs[chosen]])
        solved = cover_lp_with_prices(types.counts, cover, costs)
        if solved is None:
            return np.zeros(0, dtype=np.int64)
        amounts, prices = solved
        reduced = codes.costs - codes.uses.T @ prices
        reduced[chosen] = 0.0
        more = np.flatnonzero(reduced < -1e-9)
        if more.size == 0:
            return np.sort(chosen[amounts[c + n :] > 1e-9])
        more = more[np.argsort(reduced[more], kind="stable")[:PRICED_PER_ROUND]]
        chosen = np.concatenate([chosen, more])


def integer_uses(problem: CoverProblem, codes: PermutationCodes, used: np.ndarray) -> np.ndarray:
    """Whole uses of the permutations ``used``: a MILP (HiGHS, at most
    :data:`PERMUTATION_MILP_NODES` branch-and-bound nodes, deterministic) over those codes'
    integer uses and the cliques' and single sub-points' amounts, relaxed (the clique cover
    rounds them after); zeros if HiGHS finds no integer point."""
    types = problem.types
    n, c = types.demander.size, problem.member.shape[0]
    cover = cover_columns(problem.member, n, codes.uses[:, used])
    costs = np.concatenate([np.ones(c + n), codes.costs[used]])
    integer = np.concatenate([np.zeros(c + n), np.ones(used.size)])
    res = milp(
        costs, integrality=integer, bounds=Bounds(0, np.inf),
        constraints=LinearConstraint(cover, lb=types.counts.astype(float)),
        options={"node_limit": PERMUTATION_MILP_NODES, "disp": False},
    )  # fmt: skip
    if res.x is None:
        return np.zeros(used.size, dtype=np.int64)
    return np.round(res.x[c + n :]).astype(np.int64)


def permutations_and_cliques(
    state: CacheState, new_assignment: np.ndarray, problem: CoverProblem | None
) -> list[np.ndarray] | None:
    """E-M's permutation codes and XOR multicasts to cliques, mixed (the project's).

    One use of a permutation's code sends one point per arc (E-M's sub-messages,
    ``C(K-1,t) - C(g-1,t)`` symbols for ``g`` cycles; a missing point is a zero point). The
    LP over every maximal clique of ``problem`` (:func:`~.clique_cover.cover_problem`), every
    single sub-point and every permutation (:func:`priced_permutations`) names the codes
    worth using; a MILP gives them whole uses (:func:`integer_uses`), they get points, and
    the clique cover serves every other demand. ``None`` above
    :data:`PERMUTATION_CODE_WORKERS` workers, where the clique cover is not tried, or when no
    permutation is used.
    """
    k, t = state.num_workers, state.labels.t
    if k > PERMUTATION_CODE_WORKERS or not 2 <= t < k or problem is None:
        return None
    types = problem.types
    if problem.member is None or types.demander.size == 0:
        return None
    codes = permutation_codes(types, k, t)
    used = priced_permutations(problem, codes)
    uses = integer_uses(problem, codes, used) if used.size else used
    if not uses.any():
        return None
    rows = np.repeat(codes.needs[used[uses > 0]], uses[uses > 0], axis=0)
    sigmas = np.argsort(rows, axis=1)  # worker i's point goes to sigmas[m, i]
    sp = rows_with_points(state.assignment, np.asarray(new_assignment), k, sigmas, fixed=False)
    real = sp.points[sp.points >= 0]
    served = (real[:, None] * state.splits + np.arange(state.splits)).reshape(-1)
    return sub_message_rows(state, sp) + cover_rows(types.without(served), problem)


def _symbols(blocks: tuple) -> int:
    return int(sum(b.shape[0] for b in blocks))


def em_plan(
    state: CacheState, new_assignment: np.ndarray, scheme: str, key: str | None = None
) -> DeliveryPlan:
    """The cycle-aware E-M delivery (Theorems 2 and 4 of Elmahdy & Mohajer 2018) for one transition.

    At ``t = 1`` (no excess storage) the lower of it and the project's ``cycles`` delivery
    of the same placement (``key (cycles)`` in the breakdown when that one is used): never
    worse than ``cycles``. At ``t >= 2`` the lowest of it, the clique cover, which codes
    across the permutations (:mod:`.clique_cover`), and the mix of permutation codes and
    cliques (:func:`permutations_and_cliques`); not tried when the shuffle is one permutation
    (``q = 1``), where E-M's code meets the lower bound of Theorem 3. The breakdown's key says
    how the shuffle was split into permutations (:func:`split_method`), or ``clique cover``
    or ``permutations + cliques``.
    """
    key = key or f"t={state.labels.t}"
    method = split_method(state.num_workers, new_assignment.size // state.num_workers)
    blocks = grouped_blocks(em_symbol_rows(state, new_assignment))
    count = int(sum(b.shape[0] for b in blocks))
    fields = batch_plan_fields(state, new_assignment)
    if state.labels.t == 1:
        plain = Cycles().plan(state, new_assignment)
        if plain.num_symbols < count:
            return DeliveryPlan(
                scheme=scheme,
                symbols=plain.symbols,
                breakdown={f"{key} (cycles)": plain.num_symbols},
                **fields,
            )
    named = f"{key} ({method})" if method else key
    breakdown = {named: count}
    if state.labels.t >= 2 and new_assignment.size > state.num_workers:  # q = 1: Theorem 3
        problem = cover_problem(state, new_assignment)
        blocks, breakdown = lower_with_clique_cover(problem, blocks, breakdown, key)
        mixed = permutations_and_cliques(state, new_assignment, problem)
        mixed = grouped_blocks(mixed) if mixed is not None else None
        if mixed is not None and _symbols(mixed) < _symbols(blocks):
            blocks, breakdown = mixed, {f"{key} (permutations + cliques)": _symbols(mixed)}
    return DeliveryPlan(scheme=scheme, symbols=blocks, breakdown=breakdown, **fields)


class ElmahdyMohajer(CornerScheme):
    """Elmahdy-Mohajer: optimal worst-case load ``q(K-t)/t`` at integer ``T = t``."""

    name = "elmahdy-mohajer"
    summary = "excess storage T: cycle-aware E-M delivery, memory sharing between integer T"

    def corners(self, num_workers: int) -> list[tuple[int, float, int, float]]:
        k = num_workers
        return [(t, float(t), em_splits(k, t), (k - t) / t) for t in range(1, k + 1)]

    def corner_state(self, assignment: np.ndarray, num_workers: int, param: int) -> CacheState:
        return em_initial_state(assignment, num_workers, param)

    def corner_plan(self, state: CacheState, new_assignment: np.ndarray) -> DeliveryPlan:
        return em_plan(state, new_assignment, self.name)

    def corner_next(self, state: CacheState, new_assignment: np.ndarray) -> CacheState:
        return em_next_state(state, new_assignment)
