"""Attia-Tandon structural-invariant scheme with excess storage (Attia &
Tandon 2019, Theorem 1, App. A).

Corner ``p`` (``T = 1 + p(K-1)/K``): every point is split into ``C(K, p)`` sub-points, one per
``p``-subset ``W`` of the workers (slot ``j`` = the ``j``-th subset, the same for every point).
Worker ``k`` stores its batch whole and, of every other point, the sub-points with ``k in W``
(A.1): ``q (1 + p(K-1)/K)`` points.

Delivery (A.2, eq. (57)): worker ``k`` needs, of each of the ``n_k`` new points it does not
hold, exactly the sub-points whose label misses ``k`` -- one for every ``(p+1)``-subset ``G``
containing ``k`` (label ``G - k``, known to every other member of ``G``). For every ``G`` the
master sends, for ``m = 1 .. max_{k in G} n_k``, the XOR over the members ``k`` with
``n_k >= m`` of (``k``'s ``m``-th needed point, sub-point ``G - k``). That reconciles the
paper's worst case (``n_k = q`` for all ``k``, load ``q(K-p)/(p+1)``) with any shuffle: a member
with fewer needs drops out of the later symbols of ``G``; the load is
``sum_G max_{k in G} n_k / C(K, p)``. The project adds groups of ``p + 2`` with the points'
old processors (:func:`owner_routing`), which never raise the load and leave the worst case
unchanged.

Update (A.3): keep the new batch whole; of every point that left, keep only the sub-points whose
label contains you; the rest is unchanged, so the structure is the same in every epoch.

Corner ``p = 0`` is the no-excess placement, delivered by the cycle-aware scheme of
docs/schemes.md, cycles (the Elmahdy-Mohajer delivery at ``t = 1``); corner ``p =
K`` stores everything (load 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import comb

import numpy as np

from coded_shuffle.math.assignment import batches, shuffle_matrix
from coded_shuffle.math.plan import DeliveryPlan
from coded_shuffle.math.schemes.base import batch_plan_fields
from coded_shuffle.math.schemes.clique_cover import cover_problem, lower_with_clique_cover
from coded_shuffle.math.schemes.elmahdy_mohajer import (
    EMLabels,
    em_initial_state,
    em_next_state,
    em_plan,
)
from coded_shuffle.math.schemes.memory_sharing import CornerScheme, grouped_blocks
from coded_shuffle.math.state import CacheState


@dataclass(frozen=True)
class ATLabels:
    """The A-T placement at corner ``p``: ``subsets[j]`` = bitmask of the label of slot ``j``."""

    p: int
    subsets: np.ndarray  # (C(K, p),) int64, in itertools.combinations order


def at_storage(num_workers: int, p: int) -> float:
    """Storage of corner ``p`` in batches: ``1 + p(K-1)/K`` (Attia & Tandon 2019, Theorem 1)."""
    return 1.0 + p * (num_workers - 1) / num_workers


def at_subsets(num_workers: int, p: int) -> np.ndarray:
    return np.array(
        [sum(1 << w for w in c) for c in combinations(range(num_workers), p)], dtype=np.int64
    )


def at_caches(assignment: np.ndarray, subsets: np.ndarray, num_workers: int) -> tuple:
    """Batch whole, and of every other point the sub-points whose label contains the worker."""
    caches = []
    for k in range(num_workers):
        held = (assignment == k)[:, None] | (((subsets >> k) & 1).astype(bool))[None, :]
        caches.append(np.flatnonzero(held.reshape(-1)).astype(np.int64))
    return tuple(caches)


def at_state(assignment: np.ndarray, num_workers: int, p: int) -> CacheState:
    assignment = np.asarray(assignment, dtype=np.int64)
    subsets = at_subsets(num_workers, p)
    return CacheState(
        assignment=assignment,
        num_workers=num_workers,
        splits=int(subsets.size),
        caches=at_caches(assignment, subsets, num_workers),
        labels=ATLabels(p, subsets),
    )


def needed_points(old: np.ndarray, new: np.ndarray, num_workers: int) -> list[np.ndarray]:
    """Every worker's new points that it did not process before (sorted)."""
    out = []
    for k, batch in enumerate(batches(new, num_workers)):
        out.append(batch[old[batch] != k].astype(np.int64))
    return out


def at_load_for(needs: np.ndarray, num_workers: int, p: int) -> float:
    """``sum_G max_{k in G} n_k / C(K, p)`` over the ``(p+1)``-subsets ``G`` (in points).

    The ``i``-th largest need is the maximum of ``C(K-1-i, p)`` groups.
    """
    if p >= num_workers:
        return 0.0
    ordered = np.sort(np.asarray(needs))[::-1]
    weights = [comb(num_workers - 1 - i, p) for i in range(num_workers)]
    return float(np.dot(ordered, weights)) / comb(num_workers, p)


ROUTING_CLASSES = 20_000  # the routing search runs up to this many demand classes
ROUTING_SWEEPS = 10


@dataclass
class _Groups:
    """Coding groups of one size: member lists and, per member, its demand count."""

    members: list[tuple[int, ...]]
    counts: list[list[int]]
    index: dict[int, int]  # bitmask -> group

    @classmethod
    def of_size(cls, num_workers: int, size: int) -> _Groups:
        members = list(combinations(range(num_workers), size))
        index = {sum(1 << w for w in g): i for i, g in enumerate(members)}
        return cls(members, [[0] * size for _ in members], index)

    def symbols(self) -> int:
        return sum(max(c) for c in self.counts)


@dataclass(frozen=True)
class DemandClass:
    """The sub-points labelled ``W`` (``j, k`` not in ``W``) of the ``n`` points that move
    from worker ``j`` to ``k``: known to ``W`` and to ``j``, which held the points whole.
    ``via_owner`` of them go in the group ``W + j + k`` (size ``p + 2``), the rest in the
    paper's group ``W + k`` (size ``p + 1``)."""

    k: int
    j: int
    label: int  # bitmask of W
    n: int


def demand_classes(moves: np.ndarray, p: int) -> list[DemandClass]:
    """Every ``(k, j, W)`` with ``j`` not in ``W`` and points moving ``j -> k``."""
    num = moves.shape[0]
    out = []
    for j, k in zip(*np.nonzero(moves), strict=True):
        others = [w for w in range(num) if w not in (j, k)]
        for label in combinations(others, p):
            out.append(DemandClass(int(k), int(j), sum(1 << w for w in label), int(moves[j, k])))
    return out


def owner_routing(moves: np.ndarray, p: int) -> list[int]:
    """How many of each demand class go through the old owner's group of ``p + 2``.

    Every symbol of a group XORs one demand per member; the group sends as many symbols as
    its largest member count. The paper's delivery (eq. (57) of Attia & Tandon 2019) sends
    everything in groups of ``p + 1``; a sub-point whose point's old
    processor is not in its label is
    also known to that processor, so it can share a symbol with ``p + 1`` others. Coordinate
    descent over the classes (each class's best split given the others: a convex piecewise
    linear cost, minimised at its breakpoints), from both pure routings; the lower total
    wins, so it is never above the paper's. Deterministic (master and workers agree).
    """
    classes = demand_classes(moves, p)
    if not classes:
        return []
    best: tuple[int, list[int]] | None = None
    for start in (0, 1):
        route = [c.n * start for c in classes]
        if len(classes) <= ROUTING_CLASSES:
            small, large = _route(moves, p, classes, route)
        else:
            small, large = _tally(moves, p, classes, route)
        total = small.symbols() + large.symbols()
        if best is None or total < best[0]:
            best = (total, route)
    assert best is not None
    return best[1]


def _tally(
    moves: np.ndarray, p: int, classes: list[DemandClass], route: list[int]
) -> tuple[_Groups, _Groups]:
    """Member counts of the groups of ``p + 1`` and ``p + 2`` under ``route``."""
    num = moves.shape[0]
    small, large = _Groups.of_size(num, p + 1), _Groups.of_size(num, p + 2)
    for g, members in enumerate(small.members):  # owners inside the label: always small
        for pos, k in enumerate(members):
            small.counts[g][pos] += int(sum(moves[j, k] for j in members if j != k))
    for c, via in zip(classes, route, strict=True):
        gm, sm = c.label | 1 << c.k, c.label | 1 << c.k | 1 << c.j
        small.counts[small.index[gm]][small.members[small.index[gm]].index(c.k)] += c.n - via
        if sm in large.index:
            large.counts[large.index[sm]][large.members[large.index[sm]].index(c.k)] += via
    return small, large


def _route(
    moves: np.ndarray, p: int, classes: list[DemandClass], route: list[int]
) -> tuple[_Groups, _Groups]:
    small, large = _tally(moves, p, classes, route)
    for _ in range(ROUTING_SWEEPS):
        improved = False
        for i, c in enumerate(classes):
            g = small.index[c.label | 1 << c.k]
            s = large.index[c.label | 1 << c.k | 1 << c.j]
            gp, sp = small.members[g].index(c.k), large.members[s].index(c.k)
            gc, sc = small.counts[g], large.counts[s]
            a, b = gc[gp] - (c.n - route[i]), sc[sp] - route[i]
            g_rest = max(v for q, v in enumerate(gc) if q != gp)
            s_rest = max(v for q, v in enumerate(sc) if q != sp)
            costs = {
                y: max(a + c.n - y, g_rest) + max(b + y, s_rest)
                for y in (0, c.n, min(max(a + c.n - g_rest, 0), c.n), min(max(s_rest - b, 0), c.n))
            }
            now = max(a + c.n - route[i], g_rest) + max(b + route[i], s_rest)
            y = min(sorted(costs), key=lambda v: costs[v])
            if costs[y] < now:
                improved = True
            else:
                y = route[i]
            gc[gp], sc[sp], route[i] = a + c.n - y, b + y, y
        if not improved:
            break
    return small, large


def at_plan(state: CacheState, new_assignment: np.ndarray, scheme: str) -> DeliveryPlan:
    """Eq. (57) of Attia & Tandon 2019 for any shuffle, with the old owners' groups of ``p + 2``
    where they lower the load (:func:`owner_routing`; breakdown ``p=.. (owner groups)``),
    or the clique cover (:mod:`.clique_cover`) when that is lower."""
    k, p, s = state.num_workers, state.labels.p, state.splits
    slot = {int(m): j for j, m in enumerate(state.labels.subsets)}
    old, new = state.assignment, np.asarray(new_assignment)
    moves = shuffle_matrix(old, new, k)
    np.fill_diagonal(moves, 0)
    moving = moved_points(old, new, k)
    classes = demand_classes(moves, p)
    route = owner_routing(moves, p)
    columns: dict[tuple[int, int], list[np.ndarray]] = {}  # (group mask, member) -> sub-points
    for members in combinations(range(k), p + 1):  # the old owner inside the label
        gmask = sum(1 << w for w in members)
        for w in members:
            for j in members:
                if j != w and (j, w) in moving:
                    ids = moving[j, w] * s + slot[gmask & ~(1 << w)]
                    columns.setdefault((gmask, w), []).append(ids)
    for c, via in zip(classes, route, strict=True):
        ids = moving[c.j, c.k] * s + slot[c.label]
        small, large = c.label | 1 << c.k, c.label | 1 << c.k | 1 << c.j
        columns.setdefault((small, c.k), []).append(ids[: c.n - via])
        columns.setdefault((large, c.k), []).append(ids[c.n - via :])
    rows = {p + 1: [], p + 2: []}
    for size in rows:
        for members in combinations(range(k), size):
            gmask = sum(1 << w for w in members)
            cols = [np.concatenate(columns.get((gmask, w), [_NONE])) for w in members]
            width = max(col.size for col in cols)
            if width:
                rows[size].append(np.stack([_padded(col, width) for col in cols], axis=1))
    blocks = grouped_blocks(rows[p + 1] + rows[p + 2])
    owner = int(sum(r.shape[0] for r in rows[p + 2]))
    breakdown = {f"p={p}": int(sum(b.shape[0] for b in blocks)) - owner}
    if owner:
        breakdown[f"p={p} (owner groups)"] = owner
    problem = cover_problem(state, new)
    blocks, breakdown = lower_with_clique_cover(problem, blocks, breakdown, f"p={p}")
    return DeliveryPlan(
        scheme=scheme, symbols=blocks, breakdown=breakdown, **batch_plan_fields(state, new)
    )


_NONE = np.zeros(0, dtype=np.int64)


def moved_points(old: np.ndarray, new: np.ndarray, num_workers: int) -> dict:
    """``(j, k) -> `` the points (ascending) that move from worker ``j`` to ``k != j``."""
    key = old.astype(np.int64) * num_workers + new
    order = np.argsort(key, kind="stable")
    cuts = np.searchsorted(key[order], np.arange(num_workers * num_workers + 1))
    return {
        divmod(v, num_workers): order[cuts[v] : cuts[v + 1]]
        for v in range(num_workers * num_workers)
        if cuts[v + 1] > cuts[v] and v // num_workers != v % num_workers
    }


def _padded(col: np.ndarray, width: int) -> np.ndarray:
    out = np.full(width, -1, dtype=np.int64)
    out[: col.size] = col
    return out


class AttiaTandonExcess(CornerScheme):
    """Attia-Tandon structural invariant placement: within ``K/(K-1)`` of optimal."""

    name = "attia-tandon-excess"
    summary = "excess storage T: A-T structural-invariant placement, memory sharing between corners"
    # at N/K = 20, T = 2 it plans in 0.4 s at K = 32, 13 s at K = 48, overflows int64 at 64
    max_workers = 32

    def corners(self, num_workers: int) -> list[tuple[int, float, int, float]]:
        k = num_workers
        loads = [k - 1.0] + [(k - p) / (p + 1) for p in range(1, k + 1)]
        return [(p, at_storage(k, p), comb(k, p), loads[p]) for p in range(k + 1)]

    def corner_state(self, assignment: np.ndarray, num_workers: int, param: int) -> CacheState:
        if param == 0:
            return em_initial_state(assignment, num_workers, 1)
        return at_state(assignment, num_workers, param)

    def corner_plan(self, state: CacheState, new_assignment: np.ndarray) -> DeliveryPlan:
        if isinstance(state.labels, EMLabels):
            return em_plan(state, new_assignment, self.name, key="p=0")
        return at_plan(state, new_assignment, self.name)

    def corner_next(self, state: CacheState, new_assignment: np.ndarray) -> CacheState:
        if isinstance(state.labels, EMLabels):
            return em_next_state(state, new_assignment)
        return at_state(new_assignment, state.num_workers, state.labels.p)
