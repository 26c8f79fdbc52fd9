"""Memory sharing between corner points (docs/excess-storage.md, memory sharing; Elmahdy & Mohajer
2018 Remark 2, Attia & Tandon 2019 Claim 1).

A scheme with *corner points* (integer ``t`` for Elmahdy-Mohajer, ``p`` for Attia-Tandon) reaches
a storage ``T`` between two corners by cutting every point's bytes into parts and running one
corner on each part: with ``T = (1-a) T_lo + a T_hi`` the load is ``(1-a) R_lo + a R_hi``.

Without the point size, the parts are the ideal fractions ``1-a : a``. With it
(:func:`check_subpacketization` or ``point_bytes=``), the parts are whole bytes chosen so that
every sub-point has the same length (no padding at all) and every worker's stored bytes stay
within its budget ``T * q * point_bytes``: the high corner takes the largest multiple of its
split count not above ``a * B``, the rest goes to the next corner down, and so on.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import numpy as np

from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import batch_size
from coded_shuffle.math.plan import DeliveryPlan, Plan, SharedPlan
from coded_shuffle.math.schemes.base import Scheme
from coded_shuffle.math.state import CacheState, SharedLabels, part_states, shared_state

MIN_SUBPOINT_BYTES = 8
MAX_SUBPOINTS = 1 << 24  # N * splits above this is refused (index arrays would not fit)
EPS = 1e-9
SEARCH = 8  # candidate multiples tried per corner in the byte-exact split


def grouped_blocks(rows: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Symbol matrices padded with ``-1`` -> one dense block per degree (empty symbols dropped)."""
    if not rows:
        return ()
    width = max(r.shape[1] for r in rows)
    terms = np.concatenate(
        [np.pad(r, ((0, 0), (0, width - r.shape[1])), constant_values=-1) for r in rows]
    )
    valid = terms >= 0
    degree = valid.sum(axis=1)
    blocks = []
    for d in np.unique(degree[degree > 0]):
        sel = degree == d
        blocks.append(np.ascontiguousarray(terms[sel][valid[sel]].reshape(-1, int(d))))
    return tuple(blocks)


def sharing_parts(
    corners: Sequence[tuple[int, float, int]], storage: float, point_bytes: int | None = None
) -> list[tuple[int, float]]:
    """``[(corner param, byte fraction)]`` reaching ``storage`` (sorted by corner storage).

    ``corners`` = ``(param, storage in batches, splits, worst-case load per batch)`` in
    increasing storage.
    """
    stores = [c[1] for c in corners]
    for param, st, *_ in corners:
        if abs(storage - st) < EPS and (point_bytes is None or _fits(corners, param, point_bytes)):
            return [(param, 1.0)]
    hi = next(i for i, st in enumerate(stores) if st > storage - EPS)
    if abs(stores[hi] - storage) < EPS:
        alpha = 1.0
        lo = hi
    else:
        lo = hi - 1
        alpha = (storage - stores[lo]) / (stores[hi] - stores[lo])
    if point_bytes is None:
        return [(corners[lo][0], 1.0 - alpha), (corners[hi][0], alpha)]
    return _byte_exact(corners, hi, alpha, point_bytes)


def _fits(corners, param, point_bytes: int) -> bool:
    splits = next(c[2] for c in corners if c[0] == param)
    return point_bytes % splits == 0


def _byte_exact(corners, hi: int, alpha: float, point_bytes: int) -> list[tuple[int, float]]:
    """Whole-byte parts, each a multiple of its split count, within the storage budget.

    Searches the high and low corners' largest admissible multiples and puts the rest on the
    single corner that divides it, fits the budget and has the lowest load (``corners[i][3]``);
    the split-count-1 corner always divides.
    """
    lo = max(hi - 1, 0)
    budget = ((1 - alpha) * corners[lo][1] + alpha * corners[hi][1]) * point_bytes + EPS
    s_hi, s_lo = corners[hi][2], corners[lo][2]
    top_hi = (int(alpha * point_bytes + EPS) // s_hi) * s_hi
    best: tuple[float, dict[int, int]] | None = None
    for b_hi in range(top_hi, max(top_hi - SEARCH * s_hi, -1), -s_hi):
        top_lo = ((point_bytes - b_hi) // s_lo) * s_lo if lo != hi else 0
        for b_lo in range(top_lo, max(top_lo - SEARCH * s_lo, -1), -s_lo):
            rest = point_bytes - b_hi - b_lo
            used = b_hi * corners[hi][1] + b_lo * corners[lo][1]
            cost = b_hi * corners[hi][3] + b_lo * corners[lo][3]
            for i, (_, st, s, load) in enumerate(corners):
                if rest % s or used + rest * st > budget:
                    continue
                parts = {hi: b_hi}
                parts[lo] = parts.get(lo, 0) + b_lo
                parts[i] = parts.get(i, 0) + rest
                total = cost + rest * load
                if best is None or total < best[0] - EPS:
                    best = (total, parts)
    assert best is not None  # the split-count-1 lowest corner always fits
    parts = {i: b for i, b in best[1].items() if b}
    return [(corners[i][0], parts[i] / point_bytes) for i in sorted(parts)]


class CornerScheme(Scheme):
    """A scheme defined at corner points, extended to any ``T`` by memory sharing."""

    @abstractmethod
    def corners(self, num_workers: int) -> list[tuple[int, float, int, float]]:
        """``(param, storage, splits, worst-case load)`` per corner, increasing storage.

        Storage in batches of ``q`` points, load in points per ``q`` points.
        """

    @abstractmethod
    def corner_state(self, assignment: np.ndarray, num_workers: int, param: int) -> CacheState:
        """The corner's initial placement."""

    @abstractmethod
    def corner_plan(self, state: CacheState, new_assignment: np.ndarray) -> DeliveryPlan:
        """The corner's delivery."""

    @abstractmethod
    def corner_next(self, state: CacheState, new_assignment: np.ndarray) -> CacheState:
        """The corner's cache update."""

    def check_point_bytes(self, num_workers: int, storage: float) -> None:
        """Refuses tiny sub-points of ``point_bytes``-byte points
        (docs/excess-storage.md, sub-point size)."""
        if self.point_bytes is not None:
            check_subpacketization(self, num_workers, storage, self.point_bytes)

    def parts(self, num_workers: int, storage: float) -> list[tuple[int, float]]:
        return sharing_parts(self.corners(num_workers), storage, self.point_bytes)

    def check(self, num_points: int, num_workers: int, storage: float) -> None:
        """Valid ``N``, ``K`` and ``1 <= T <= K``; refuses sub-point counts beyond the limit."""
        batch_size(num_points, num_workers)
        super().check(num_points, num_workers, storage)
        for param, _ in self.parts(num_workers, storage):
            splits = next(c[2] for c in self.corners(num_workers) if c[0] == param)
            if num_points * splits > MAX_SUBPOINTS:
                raise UsageError(
                    f"{self.name}: K={num_workers}, T={storage:g} splits every point into "
                    f"{splits} sub-points; N*splits = {num_points * splits} exceeds "
                    f"{MAX_SUBPOINTS}: use fewer points, fewer workers or a T nearer 1 or K"
                )

    def initial_state(self, assignment: np.ndarray, num_workers: int, storage: float) -> CacheState:
        """The placement before the first coded delivery (sent uncoded by the training job)."""
        self.check(int(np.asarray(assignment).size), num_workers, storage)
        if self.point_bytes is not None:
            check_subpacketization(self, num_workers, storage, self.point_bytes)
        parts = self.parts(num_workers, storage)
        states = [self.corner_state(assignment, num_workers, p) for p, _ in parts]
        return shared_state([p for p, _ in parts], states, [f for _, f in parts])

    def plan(self, state: CacheState, new_assignment: np.ndarray) -> Plan:
        parts, fractions = part_states(state)
        plans = tuple(self.corner_plan(p, new_assignment) for p in parts)
        if len(plans) == 1:
            return plans[0]
        return SharedPlan(plans, fractions)

    def next_state(self, state: CacheState, plan: Plan, new_assignment: np.ndarray) -> CacheState:
        parts, fractions = part_states(state)
        states = [self.corner_next(p, new_assignment) for p in parts]
        params = state.labels.params if isinstance(state.labels, SharedLabels) else (0,)
        return shared_state(params, states, fractions)

    def part_caches(self, state: CacheState, worker: int) -> list[np.ndarray]:
        return [p.caches[worker] for p in part_states(state)[0]]

    def stored_points(self, state: CacheState) -> np.ndarray:
        """Points' worth stored by every worker: fraction-weighted over the parts."""
        parts, fractions = part_states(state)
        return sum(f * p.stored_points() for p, f in zip(parts, fractions, strict=True))

    def stored_points_max(self, state: CacheState) -> float:
        return float(self.stored_points(state).max())


def parts_storage(scheme: CornerScheme, num_workers: int, parts: list[tuple[int, float]]) -> float:
    """Storage in batches of memory-sharing ``parts`` (byte-fraction-weighted corners)."""
    stores = {c[0]: c[1] for c in scheme.corners(num_workers)}
    return float(sum(f * stores[p] for p, f in parts))


def storage_used(scheme: Scheme, num_workers: int, storage: float) -> float:
    """The storage (batches) the scheme's byte-exact parts reach at its point size: ``storage``
    itself unless the point size moves bytes to another corner."""
    if not isinstance(scheme, CornerScheme):
        return float(storage)
    return parts_storage(scheme, num_workers, scheme.parts(num_workers, storage))


def exact_point_bytes(
    scheme: Scheme, num_workers: int, storage: float, at_least: int = 64, limit: int = 1 << 16
) -> int:
    """The smallest point size from ``at_least`` on at which ``storage`` is reached exactly:
    the byte-exact parts are the ideal memory-sharing fractions, so no byte moves to another
    corner, and no sub-point is below ``MIN_SUBPOINT_BYTES`` (``at_least`` itself for schemes
    without corners; ``at_least`` when no size up to ``limit`` is exact)."""
    if not isinstance(scheme, CornerScheme):
        return at_least
    corners = scheme.corners(num_workers)
    ideal = dict(sharing_parts(corners, storage))
    splits = {c[0]: c[2] for c in corners}
    for b in range(at_least, limit + 1):
        sizes = {p: f * b for p, f in ideal.items()}
        if any(abs(x - round(x)) > 1e-6 or round(x) % splits[p] for p, x in sizes.items()):
            continue  # some part is not a whole number of its sub-points
        if any(splits[p] > 1 and x / splits[p] < MIN_SUBPOINT_BYTES for p, x in sizes.items()):
            continue  # some sub-point would be refused as tiny (check_subpacketization)
        exact = dict(sharing_parts(corners, storage, b))
        if exact.keys() == ideal.keys() and all(abs(exact[p] - ideal[p]) < EPS for p in ideal):
            return b
    return at_least


def check_subpacketization(
    scheme: Scheme, num_workers: int, storage: float, point_bytes: int
) -> list[tuple[int, int, int]]:
    """Refuses tiny sub-points (docs/excess-storage.md, sub-point size); returns
    ``[(corner, part bytes, splits)]``.

    Raises :class:`UsageError` when the corner at or above ``T`` would cut a ``point_bytes``
    point into sub-points below ``MIN_SUBPOINT_BYTES`` bytes, naming the sizes and what to
    change. The parts are byte-exact (no padding, every worker within ``T * q * point_bytes``
    bytes) for a :class:`CornerScheme` built with that ``point_bytes``. Other schemes pass
    unchanged (returns ``[]``).
    """
    if not isinstance(scheme, CornerScheme):
        return []
    if point_bytes < 1:
        raise UsageError(f"point bytes must be >= 1, got {point_bytes}")
    corners = scheme.corners(num_workers)
    hi = next((c for c in corners if c[1] > storage - EPS), corners[-1])
    if hi[2] > 1 and point_bytes / hi[2] < MIN_SUBPOINT_BYTES:
        ok = [c for c in corners if c[2] == 1 or point_bytes / c[2] >= MIN_SUBPOINT_BYTES]
        best = max(c[1] for c in ok if c[1] <= hi[1])
        raise UsageError(
            f"{scheme.name}: T={storage:g} with K={num_workers} cuts each {point_bytes}-byte point "
            f"into {hi[2]} sub-points of {point_bytes / hi[2]:.2f} bytes (< {MIN_SUBPOINT_BYTES}); "
            f"use T <= {best:g} or points of at least {MIN_SUBPOINT_BYTES * hi[2]} bytes"
        )
    parts = sharing_parts(corners, storage, point_bytes)
    splits = {c[0]: c[2] for c in corners}
    return [(p, round(f * point_bytes), splits[p]) for p, f in parts]
