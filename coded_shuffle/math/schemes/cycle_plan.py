"""Cycle deliveries for no excess storage (docs/schemes.md): the shared builder.

The off-diagonal part of the shuffle matrix ``S`` is an Eulerian multigraph on the workers
(arc ``i -> j`` with multiplicity ``S[i][j]``). A *cycle* ``v_0 -> v_1 -> ... -> v_{L-1} -> v_0``
with multiplicity ``m`` carries ``m`` points on every arc. At node ``v_a`` the master *pairs*
the incoming point with the outgoing one and sends ``x(v_{a-1} -> v_a) XOR x(v_a -> v_{a+1})``;
``v_a`` cancels its own outgoing point. An *opened* cycle pairs at every node but ``v_0``
(``L - 1`` symbols): ``v_0`` knows ``x(v_0 -> v_1)`` and peels along the cycle, ``L - 1``
steps, to its incoming point. A *closed* cycle pairs at every node (``L`` symbols).

Everything here works on the ``K x K`` counts; points are only touched in
:func:`cycle_symbols`, vectorised over all cycles at once. A decomposition is carried as a
:class:`CycleSet` (flat arrays), so that the hundreds of thousands of cycles of a
``K = 1,024`` shuffle never become Python objects. Up to :data:`SMALL_MAX_WORKERS` workers the
shortest cycle is found by all-pairs distances, as it always was (the plans there are
unchanged); above, by the length classes of
:func:`~coded_shuffle.math.schemes.cycle_search.shortest_first`.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
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
from coded_shuffle.math.schemes.cycle_search import shortest_first
from coded_shuffle.math.state import CacheState

UNREACHABLE = np.iinfo(np.int64).max // 4
SMALL_MAX_WORKERS = 32  # all-pairs shortest cycles up to here; length classes above


class Cycle(NamedTuple):
    """A directed cycle of workers, the points it carries per arc, and where it is opened."""

    workers: tuple[int, ...]
    multiplicity: int
    opened: bool = True

    @property
    def symbols(self) -> int:
        """Symbols it costs: ``m (L - 1)`` opened, ``m L`` closed."""
        return self.multiplicity * (len(self.workers) - self.opened)


@dataclass(frozen=True)
class CycleSet:
    """Cycles as flat arrays: the workers of cycle ``c`` are
    ``workers[starts[c] : starts[c] + lengths[c]]``; ``opened[c]`` as in :class:`Cycle`."""

    workers: np.ndarray
    lengths: np.ndarray
    multiplicity: np.ndarray
    opened: np.ndarray

    @classmethod
    def of(cls, cycles: list[Cycle]) -> CycleSet:
        lengths = np.array([len(c.workers) for c in cycles], dtype=np.int64)
        workers = [w for c in cycles for w in c.workers]
        return cls(
            np.array(workers, dtype=np.int64),
            lengths,
            np.array([c.multiplicity for c in cycles], dtype=np.int64),
            np.array([c.opened for c in cycles], dtype=bool),
        )

    @classmethod
    def opened_at_first(
        cls, workers: np.ndarray, lengths: np.ndarray, multiplicity: np.ndarray
    ) -> CycleSet:
        return cls(workers, lengths, multiplicity, np.ones(lengths.size, dtype=bool))

    def __len__(self) -> int:
        return int(self.lengths.size)

    def __add__(self, other: CycleSet) -> CycleSet:
        return CycleSet(
            *(np.concatenate([a, b]) for a, b in zip(self.arrays(), other.arrays(), strict=True))
        )

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.workers, self.lengths, self.multiplicity, self.opened

    @property
    def starts(self) -> np.ndarray:
        return (np.cumsum(self.lengths) - self.lengths).astype(np.int64)

    @property
    def symbols(self) -> int:
        """Symbols they cost: ``sum m (L - opened)``."""
        return int((self.multiplicity * (self.lengths - self.opened)).sum())

    def cycles(self) -> list[Cycle]:
        """As :class:`Cycle` objects (small sets: tests, the E-M split)."""
        return [
            Cycle(tuple(int(v) for v in self.workers[a : a + n]), int(m), bool(o))
            for a, n, m, o in zip(
                self.starts, self.lengths, self.multiplicity, self.opened, strict=True
            )
        ]

    def arcs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tail, head and multiplicity of every arc of every cycle (the last one closes it)."""
        starts = self.starts
        heads = np.roll(self.workers, -1)
        if len(self):
            heads[starts + self.lengths - 1] = self.workers[starts]
        return self.workers, heads, np.repeat(self.multiplicity, self.lengths)

    def covered(self, num_workers: int) -> np.ndarray:
        """The ``K x K`` arc counts the cycles cover (to check a decomposition)."""
        tails, heads, mult = self.arcs()
        flat = np.bincount(tails * num_workers + heads, mult, minlength=num_workers**2)
        return flat.astype(np.int64).reshape(num_workers, num_workers)


def arcs_of(workers: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Tails and heads of the arcs ``v_a -> v_{a+1}`` of a cycle (the last one closes it)."""
    tails = np.asarray(workers, dtype=np.int64)
    return tails, np.roll(tails, -1)


def subtract(weights: np.ndarray, cycle: Cycle) -> None:
    """Removes ``cycle`` from the arc counts ``weights`` (in place)."""
    tails, heads = arcs_of(cycle.workers)
    weights[tails, heads] -= cycle.multiplicity


def pair_cycles(shuffle: np.ndarray) -> tuple[CycleSet, np.ndarray]:
    """All 2-cycles ``min(S_ij, S_ji)`` (Attia & Tandon 2016, phase 1) and
    the leftover matrix ``Omega``.

    Taking every 2-cycle first never lowers the number of cycles that a decomposition can
    reach: if ``i -> j`` and ``j -> i`` lie on different cycles ``C1`` and ``C2``, the 2-cycle
    and the closed walk ``(C1 - ij) + (C2 - ji)`` (which splits into at least one cycle)
    replace them, so the count does not drop.
    """
    s = off_diagonal(shuffle)
    both = np.triu(np.minimum(s, s.T), 1)
    i, j = np.nonzero(both)
    workers = np.stack([i, j], axis=1).reshape(-1).astype(np.int64)
    pairs = CycleSet.opened_at_first(workers, np.full(i.size, 2, dtype=np.int64), both[i, j])
    return pairs, leftover_matrix(s)


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


def greedy_cycles(weights: np.ndarray) -> CycleSet:
    """Decomposes an Eulerian multigraph into simple cycles, shortest cycle first (all-pairs
    distances up to :data:`SMALL_MAX_WORKERS` workers, length classes above)."""
    if np.shape(weights)[0] > SMALL_MAX_WORKERS:
        return CycleSet.opened_at_first(*shortest_first(weights))
    return CycleSet.of(all_pairs_greedy(weights))


def all_pairs_greedy(weights: np.ndarray) -> list[Cycle]:
    """Shortest cycle first by :func:`shortest_cycle` (``K^3`` work per cycle: small ``K``)."""
    w = np.array(weights, dtype=np.int64)
    cycles = []
    while (cycle := shortest_cycle(w)) is not None:
        subtract(w, cycle)
        cycles.append(cycle)
    if w.any():
        raise ValueError("arc counts are not Eulerian: in-degree differs from out-degree")
    return cycles


def open_at(cycles: CycleSet, worker: int) -> CycleSet:
    """Cycles through ``worker`` rotated to start there and opened; the others closed."""
    starts = np.repeat(cycles.starts, cycles.lengths)
    lengths = np.repeat(cycles.lengths, cycles.lengths)
    at = cycles.workers == worker
    owner = np.repeat(np.arange(len(cycles)), cycles.lengths)
    shift = np.zeros(len(cycles), dtype=np.int64)
    shift[owner[at]] = np.flatnonzero(at) - starts[at]  # a simple cycle meets it once
    index = np.arange(cycles.workers.size) - starts + np.repeat(shift, cycles.lengths)
    rotated = cycles.workers[starts + index % lengths]
    through = np.zeros(len(cycles), dtype=bool)
    through[owner[at]] = True
    return CycleSet(rotated, cycles.lengths, cycles.multiplicity, through)


def cycle_symbols(
    cycles: CycleSet, points: np.ndarray, offsets: np.ndarray, num_workers: int
) -> np.ndarray:
    """The ``(n, 2)`` XOR symbols ``(incoming point, outgoing point)`` of all cycles.

    ``points, offsets`` is the CSR of :func:`~coded_shuffle.math.assignment.points_by_pair`. Every
    arc of every cycle takes the next ``m`` unused points of its worker pair; the cycles must
    cover every moving point exactly once. Vectorised: one gather for all points of all arcs.
    """
    if not len(cycles):
        return np.zeros((0, 2), dtype=np.int64)
    lengths, first = cycles.lengths, cycles.starts
    tails, heads, arc_mult = cycles.arcs()
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
    paired = np.ones(tails.size, dtype=bool)
    paired[first[cycles.opened]] = False
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
    def decompose(self, shuffle: np.ndarray) -> tuple[CycleSet, CycleSet]:
        """``(2-cycles, other cycles)`` covering the off-diagonal of ``shuffle`` exactly."""

    def plan(self, state: CacheState, new_assignment: np.ndarray) -> DeliveryPlan:
        """The 2-cycles' symbols (breakdown ``pairs``), then the others' (``leftovers``)."""
        k = state.num_workers
        pairs, rest = self.decompose(shuffle_matrix(state.assignment, new_assignment, k))
        points, offsets = points_by_pair(state.assignment, new_assignment, k)
        symbols = cycle_symbols(pairs + rest, points, offsets, k)
        num_pairs = pairs.symbols
        return DeliveryPlan(
            scheme=self.name,
            symbols=symbol_blocks([expand_subpoints(symbols, state.splits)]),
            breakdown={"pairs": num_pairs, "leftovers": symbols.shape[0] - num_pairs},
            **batch_plan_fields(state, new_assignment),
        )
