"""Cycle deliveries for no excess storage (docs/schemes.md): the shared builder.

The off-diagonal part of the shuffle matrix ``S`` is an Eulerian multigraph on the workers
(arc ``i -> j`` with multiplicity ``S[i][j]``). A *cycle* ``v_0 -> v_1 -> ... -> v_{L-1} -> v_0``
with multiplicity ``m`` carries ``m`` points on every arc. At node ``v_a`` the master *pairs*
the incoming point with the outgoing one and sends ``x(v_{a-1} -> v_a) XOR x(v_a -> v_{a+1})``;
``v_a`` cancels its own outgoing point. An *opened* cycle pairs at every node but ``v_0``
(``L - 1`` symbols): ``v_0`` knows ``x(v_0 -> v_1)`` and peels along the cycle, ``L - 1``
steps, to its incoming point. A *closed* cycle pairs at every node (``L`` symbols).

Everything here works on the ``K x K`` counts; points are only touched in
:func:`cycle_symbols`, vectorised over all cycles at once.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import NamedTuple

import numpy as np

from coded_shuffle.math.assignment import (
    batch_size,
    leftover_matrix,
    points_by_pair,
    shuffle_matrix,
)
from coded_shuffle.math.bounds import off_diagonal
from coded_shuffle.math.plan import DeliveryPlan, ranges, symbol_blocks
from coded_shuffle.math.schemes.base import Scheme, batch_plan_fields
from coded_shuffle.math.state import CacheState

UNREACHABLE = np.iinfo(np.int64).max // 4


class Cycle(NamedTuple):
    """A directed cycle of workers, the points it carries per arc, and where it is opened."""

    workers: tuple[int, ...]
    multiplicity: int
    opened: bool = True

    @property
    def symbols(self) -> int:
        """Symbols it costs: ``m (L - 1)`` opened, ``m L`` closed."""
        return self.multiplicity * (len(self.workers) - self.opened)


def arcs_of(workers: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Tails and heads of the arcs ``v_a -> v_{a+1}`` of a cycle (the last one closes it)."""
    tails = np.asarray(workers, dtype=np.int64)
    return tails, np.roll(tails, -1)


def subtract(weights: np.ndarray, cycle: Cycle) -> None:
    """Removes ``cycle`` from the arc counts ``weights`` (in place)."""
    tails, heads = arcs_of(cycle.workers)
    weights[tails, heads] -= cycle.multiplicity


def cycle_arcs(cycles: list[Cycle], num_workers: int) -> np.ndarray:
    """The ``K x K`` arc counts that ``cycles`` cover (to check a decomposition)."""
    covered = np.zeros((num_workers, num_workers), dtype=np.int64)
    for cycle in cycles:
        tails, heads = arcs_of(cycle.workers)
        np.add.at(covered, (tails, heads), cycle.multiplicity)
    return covered


def pair_cycles(shuffle: np.ndarray) -> tuple[list[Cycle], np.ndarray]:
    """All 2-cycles ``min(S_ij, S_ji)`` (Attia & Tandon 2016, phase 1) and
    the leftover matrix ``Omega``.

    Taking every 2-cycle first never lowers the number of cycles that a decomposition can
    reach: if ``i -> j`` and ``j -> i`` lie on different cycles ``C1`` and ``C2``, the 2-cycle
    and the closed walk ``(C1 - ij) + (C2 - ji)`` (which splits into at least one cycle)
    replace them, so the count does not drop.
    """
    s = off_diagonal(shuffle)
    both = np.minimum(s, s.T)
    cycles = [
        Cycle((int(i), int(j)), int(both[i, j]))
        for i, j in zip(*np.nonzero(np.triu(both, 1)), strict=True)
    ]
    return cycles, leftover_matrix(s)


def all_pairs_hops(adjacency: np.ndarray) -> np.ndarray:
    """``hops[a, b]``: fewest arcs from ``a`` to ``b`` (breadth first, all sources at once)."""
    k = adjacency.shape[0]
    hops = np.full((k, k), UNREACHABLE, dtype=np.int64)
    np.fill_diagonal(hops, 0)
    frontier = np.eye(k, dtype=bool)
    step = adjacency.astype(np.int64)
    for length in range(1, k + 1):
        new = ((frontier.astype(np.int64) @ step) > 0) & (hops == UNREACHABLE)
        if not new.any():
            break
        hops[new] = length
        frontier = new
    return hops


def shortest_cycle(weights: np.ndarray) -> Cycle | None:
    """A shortest cycle of the arcs with positive count, or None if there is none.

    Deterministic: the lexicographically first closing arc ``u -> v`` among the shortest
    cycles, then at every step the heaviest next arc (lowest id on ties). Its multiplicity
    is the smallest count on it. A shortest cycle is always simple.
    """
    adjacency = weights > 0
    if not adjacency.any():
        return None
    hops = all_pairs_hops(adjacency)
    closing = np.where(adjacency, hops.T, UNREACHABLE)  # closing[u, v] = hops v -> u
    u, v = np.unravel_index(int(closing.argmin()), closing.shape)
    if closing[u, v] >= UNREACHABLE:
        return None
    path = [int(u), int(v)]
    while path[-1] != u:
        here = path[-1]
        nxt = adjacency[here] & (hops[:, u] == hops[here, u] - 1)
        path.append(int(np.argmax(np.where(nxt, weights[here], -1))))
    workers = tuple(path[:-1])
    tails, heads = arcs_of(workers)
    return Cycle(workers, int(weights[tails, heads].min()))


def greedy_cycles(weights: np.ndarray) -> list[Cycle]:
    """Decomposes an Eulerian multigraph into simple cycles, shortest cycle first."""
    w = np.array(weights, dtype=np.int64)
    cycles = []
    while (cycle := shortest_cycle(w)) is not None:
        subtract(w, cycle)
        cycles.append(cycle)
    if w.any():
        raise ValueError("arc counts are not Eulerian: in-degree differs from out-degree")
    return cycles


def open_at(cycle: Cycle, worker: int) -> Cycle:
    """The same cycle rotated to start at ``worker`` and opened there."""
    a = cycle.workers.index(worker)
    return Cycle(cycle.workers[a:] + cycle.workers[:a], cycle.multiplicity, True)


def cycle_symbols(
    cycles: list[Cycle], points: np.ndarray, offsets: np.ndarray, num_workers: int
) -> np.ndarray:
    """The ``(n, 2)`` XOR symbols ``(incoming point, outgoing point)`` of all cycles.

    ``points, offsets`` is the CSR of :func:`~coded_shuffle.math.assignment.points_by_pair`. Every
    arc of every cycle takes the next ``m`` unused points of its worker pair; the cycles must
    cover every moving point exactly once. Vectorised: one gather for all points of all arcs.
    """
    if not cycles:
        return np.zeros((0, 2), dtype=np.int64)
    lengths = np.array([len(c.workers) for c in cycles], dtype=np.int64)
    mult = np.array([c.multiplicity for c in cycles], dtype=np.int64)
    tails = np.concatenate([np.asarray(c.workers, dtype=np.int64) for c in cycles])
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    heads = np.roll(tails, -1)
    heads[first + lengths - 1] = tails[first]
    arc_mult = np.repeat(mult, lengths)
    pair = tails * num_workers + heads
    # the points of every arc: its pair's next unused points, in cycle order
    order = np.argsort(pair, kind="stable")
    taken = np.zeros(pair.size, dtype=np.int64)
    sorted_mult = arc_mult[order]
    group_start = np.searchsorted(pair[order], pair[order])
    csum = np.cumsum(sorted_mult) - sorted_mult
    taken[order] = csum - csum[group_start]
    used = np.bincount(pair, weights=arc_mult, minlength=num_workers**2).astype(np.int64)
    moving = np.diff(offsets).reshape(num_workers, num_workers).copy()
    np.fill_diagonal(moving, 0)
    if not np.array_equal(used, moving.reshape(-1)):
        raise ValueError("cycles do not cover every moving point exactly once")
    arc_points = points[ranges(offsets[pair] + taken, arc_mult)]
    arc_start = np.concatenate([[0], np.cumsum(arc_mult)[:-1]])
    # one symbol group per paired node: (incoming arc, outgoing arc) of that node
    node_in = np.arange(tails.size, dtype=np.int64) - 1
    node_in[first] = first + lengths - 1
    opened = np.array([c.opened for c in cycles], dtype=bool)
    paired = np.ones(tails.size, dtype=bool)
    paired[first[opened]] = False
    incoming, outgoing = node_in[paired], np.flatnonzero(paired)
    m = arc_mult[outgoing]
    return np.stack(
        [
            arc_points[ranges(arc_start[incoming], m)],
            arc_points[ranges(arc_start[outgoing], m)],
        ],
        axis=1,
    )


def expand_subpoints(symbols: np.ndarray, splits: int) -> np.ndarray:
    """Point-level symbols as sub-point symbols (one per part) when ``splits > 1``."""
    parts = np.arange(splits, dtype=np.int64)[None, :, None]
    return (symbols[:, None, :] * splits + parts).reshape(-1, symbols.shape[1])


class CycleScheme(Scheme):
    """A no-excess-storage scheme given by a cycle decomposition of the shuffle matrix."""

    def check(self, num_points: int, num_workers: int, storage: float) -> None:
        batch_size(num_points, num_workers)
        super().check(num_points, num_workers, storage)

    @abstractmethod
    def decompose(self, shuffle: np.ndarray) -> tuple[list[Cycle], list[Cycle]]:
        """``(2-cycles, other cycles)`` covering the off-diagonal of ``shuffle`` exactly."""

    def plan(self, state: CacheState, new_assignment: np.ndarray) -> DeliveryPlan:
        """The 2-cycles' symbols (breakdown ``pairs``), then the others' (``leftovers``)."""
        k = state.num_workers
        pairs, rest = self.decompose(shuffle_matrix(state.assignment, new_assignment, k))
        points, offsets = points_by_pair(state.assignment, new_assignment, k)
        symbols = cycle_symbols(pairs + rest, points, offsets, k)
        num_pairs = sum(c.symbols for c in pairs)
        return DeliveryPlan(
            scheme=self.name,
            symbols=symbol_blocks([expand_subpoints(symbols, state.splits)]),
            breakdown={"pairs": num_pairs, "leftovers": symbols.shape[0] - num_pairs},
            **batch_plan_fields(state, new_assignment),
        )
