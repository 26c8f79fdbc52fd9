"""Attia-Tandon structural-invariant scheme with excess storage (seed 004, Theorem 1, App. A).

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
``sum_G max_{k in G} n_k / C(K, p)``.

Update (A.3): keep the new batch whole; of every point that left, keep only the sub-points whose
label contains you; the rest is unchanged, so the structure is the same in every epoch.

Corner ``p = 0`` is the no-excess placement, delivered by the cycle-aware scheme of design 3.2
(the Elmahdy-Mohajer delivery at ``t = 1``); corner ``p = K`` stores everything (load 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import comb

import numpy as np

from ..assignment import batches
from ..plan import DeliveryPlan
from ..state import CacheState
from .base import batch_plan_fields
from .elmahdy_mohajer import EMLabels, em_initial_state, em_next_state, em_plan
from .memory_sharing import CornerScheme, grouped_blocks


@dataclass(frozen=True)
class ATLabels:
    """The A-T placement at corner ``p``: ``subsets[j]`` = bitmask of the label of slot ``j``."""

    p: int
    subsets: np.ndarray  # (C(K, p),) int64, in itertools.combinations order


def at_storage(num_workers: int, p: int) -> float:
    """Storage of corner ``p`` in batches: ``1 + p(K-1)/K`` (seed 004, Theorem 1)."""
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


def at_plan(state: CacheState, new_assignment: np.ndarray, scheme: str) -> DeliveryPlan:
    """Eq. (57) of seed 004 for any shuffle: one symbol per ``(G, m)``, loops over groups."""
    k, p, s = state.num_workers, state.labels.p, state.splits
    slot = {int(m): j for j, m in enumerate(state.labels.subsets)}
    needs = needed_points(state.assignment, np.asarray(new_assignment), k)
    counts = np.array([n.size for n in needs])
    rows = []
    for group in combinations(range(k), p + 1):
        gmask = sum(1 << w for w in group)
        members = sorted(group, key=lambda w: -counts[w])
        width = counts[members[0]]
        if width == 0:
            continue
        cols = []
        for w in members:
            col = np.full(width, -1, dtype=np.int64)
            col[: counts[w]] = needs[w] * s + slot[gmask & ~(1 << w)]
            cols.append(col)
        rows.append(np.stack(cols, axis=1))
    blocks = grouped_blocks(rows)
    return DeliveryPlan(
        scheme=scheme,
        symbols=blocks,
        breakdown={f"p={p}": int(sum(b.shape[0] for b in blocks))},
        **batch_plan_fields(state, new_assignment),
    )


class AttiaTandonExcess(CornerScheme):
    """Attia-Tandon structural invariant placement: within ``K/(K-1)`` of optimal."""

    name = "attia-tandon-excess"
    summary = "excess storage T: A-T structural-invariant placement, memory sharing between corners"

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
