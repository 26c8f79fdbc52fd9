"""Cycle-decomposition delivery without excess storage (docs/schemes.md, cycles, beyond the papers).

The off-diagonal shuffle multigraph is split into directed cycles, every cycle delivered with
``L - 1`` XOR symbols (opened at its first worker), so the load is
``sum_{i != j} S_ij - (number of cycles)``. The decomposition works on the ``K x K`` counts:

1. every 2-cycle, ``min(S_ij, S_ji)`` times (never loses a cycle, see
   :func:`~coded_shuffle.math.schemes.cycle_plan.pair_cycles`); what is left is the leftover
   matrix ``Omega``, which has no 2-cycle, so its cycles have 3 arcs or more;
2. a maximum packing of directed triangles of ``Omega``: an integer program over the triangle
   types (variables: how often each triangle is taken; constraints: arc counts), solved by
   HiGHS through ``scipy.optimize.milp``. Plain shortest-first greedy wastes arcs on long
   cycles; the packing takes as many 3-cycles as the counts allow;
3. the rest, shortest cycle first (greedy, always simple cycles).

Above :data:`~coded_shuffle.math.schemes.cycle_plan.SMALL_MAX_WORKERS` workers the triangle types
run into the millions, so step 2 is a greedy packing improved by a local search with a work
budget (:func:`~coded_shuffle.math.schemes.cycle_search.triangle_packing`) and step 3 runs by
length classes (:func:`~coded_shuffle.math.schemes.cycle_search.shortest_first`); on random
shuffles at ``K = 64`` and ``128`` this takes more cycles than the integer program and the
all-pairs greedy did (``scripts/bench_scale.py``).

Never worse than Attia-Tandon (Theorem 1 of Attia & Tandon 2016): all decompositions here consist
of the 2-cycles and *simple* cycles of ``Omega``. A simple cycle leaves
any worker ``u`` at most once,
so the arcs out of ``u`` lie on distinct cycles and ``Omega`` yields at least
``max_u sum_j Omega_uj`` cycles. Hence the load is at most
``sum S - sum_{i<j} min(S_ij, S_ji) - max_u sum_j Omega_uj``
``= sum_{i<j} max(S_ij, S_ji) - max_u sum_j Omega_uj``, Theorem 1's load.

Upper limit on the cycles: every cycle crosses any ordering of the workers backwards at least
once, so no decomposition has more cycles than the backward arcs of the best ordering; that
is exactly the gap to the lower bound of Theorem 2 (:mod:`coded_shuffle.math.bounds`).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix

from coded_shuffle.math.schemes.cycle_plan import (
    SMALL_MAX_WORKERS,
    Cycle,
    CycleScheme,
    CycleSet,
    all_pairs_greedy,
    pair_cycles,
    subtract,
)
from coded_shuffle.math.schemes.cycle_search import triangle_packing

MAX_TRIANGLE_TYPES = 20_000  # above: skip the integer program, greedy only
# A node limit, not a time limit: every rank of a training job re-derives the plan on its own,
# so the packing must not depend on how busy the machine is.
MILP_OPTIONS = {"node_limit": 200, "mip_rel_gap": 0.01}
# The local search's work above SMALL_MAX_WORKERS: about this many triangles taken out and put
# back in all (a pass takes out every packed triangle once; cycle_search.triangle_packing).
SEARCH_WORK = 3_000_000


def triangle_types(weights: np.ndarray) -> np.ndarray:
    """Every directed triangle ``a -> b -> c -> a`` of the positive arcs, ``a`` its lowest id."""
    adj = weights > 0
    a, b, c = np.nonzero(adj[:, :, None] & adj[None, :, :] & adj.T[:, None, :])
    keep = (a < b) & (a < c)
    return np.stack([a[keep], b[keep], c[keep]], axis=1).astype(np.int64)


def pack_triangles(weights: np.ndarray) -> list[Cycle]:
    """A maximum integer packing of triangles into the arc counts (HiGHS MILP).

    Returns an empty list when there are no triangles, too many triangle types, or the
    solver finds no solution within its node limit (the greedy stage then does all the work).
    """
    tri = triangle_types(weights)
    if tri.shape[0] == 0 or tri.shape[0] > MAX_TRIANGLE_TYPES:
        return []
    k = weights.shape[0]
    arcs = np.concatenate([tri[:, 0] * k + tri[:, 1], tri[:, 1] * k + tri[:, 2]])
    arcs = np.concatenate([arcs, tri[:, 2] * k + tri[:, 0]])
    cols = np.tile(np.arange(tri.shape[0]), 3)
    used, row = np.unique(arcs, return_inverse=True)
    matrix = csr_matrix((np.ones(arcs.size), (row, cols)), shape=(used.size, tri.shape[0]))
    capacity = weights.reshape(-1)[used].astype(np.float64)
    # scipy.optimize loads in 0.2 s: only where a solver runs (the command starts faster)
    from scipy.optimize import Bounds, LinearConstraint, milp

    result = milp(
        c=-np.ones(tri.shape[0]),
        constraints=LinearConstraint(matrix, 0, capacity),
        integrality=np.ones(tri.shape[0]),
        bounds=Bounds(0, capacity.max()),
        options=MILP_OPTIONS,
    )
    if result.x is None:
        return []
    counts = np.round(result.x).astype(np.int64)
    if np.any(matrix @ counts > capacity):  # never trust a solver's rounding blindly
        return []
    return [
        Cycle(tuple(int(v) for v in tri[t]), int(counts[t])) for t in np.flatnonzero(counts > 0)
    ]


class Cycles(CycleScheme):
    """Directed-cycle decomposition (docs/schemes.md), 2-cycles, then triangles, then shortest."""

    name = "cycles"
    summary = "no excess storage: decomposition into directed cycles, L-1 symbols per cycle"

    def decompose(self, shuffle: np.ndarray) -> tuple[CycleSet, CycleSet]:
        pairs, omega = pair_cycles(shuffle)
        if omega.shape[0] > SMALL_MAX_WORKERS:
            return pairs, searched_cycles(omega)
        return pairs, programmed_cycles(omega)


def programmed_cycles(omega: np.ndarray) -> CycleSet:
    """Steps 2-3 up to ``SMALL_MAX_WORKERS``: the triangles' integer program, then the
    all-pairs shortest cycles (callable at any ``K``, for comparison)."""
    packed = pack_triangles(omega)
    rest = omega.copy()
    for cycle in packed:
        subtract(rest, cycle)
    return CycleSet.of(packed + all_pairs_greedy(rest))


def searched_cycles(omega: np.ndarray) -> CycleSet:
    """Steps 2-3 above ``SMALL_MAX_WORKERS``: the triangle packing's local search, then the
    shortest cycles by length classes."""
    found, rest = triangle_packing(omega, SEARCH_WORK)
    triangles = CycleSet.opened_at_first(
        found.reshape(-1),
        np.full(found.shape[0], 3, dtype=np.int64),
        np.ones(found.shape[0], dtype=np.int64),
    )
    return triangles + CycleSet.opened_at_first(*rest)
