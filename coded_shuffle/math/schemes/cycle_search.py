"""Cycle decompositions of an Eulerian multigraph at hundreds of workers.

:func:`~coded_shuffle.math.schemes.cycle_plan.shortest_cycle` recomputes all-pairs distances
(``K^3`` work) for every cycle it takes, which is fine at ``K <= 32`` and hopeless at
``K = 1,024``. Here the decomposition runs by *length classes* instead: for ``L = 2, 3, ...``
every arc ``u -> v`` in turn takes cycles of length ``L`` through it while a path of
``L - 1`` arcs leads from ``v`` back to ``u`` (a breadth-first search from ``v``, at most
``L - 2`` levels deep, over the arcs still left). Removing arcs never shortens a path, so
once class ``L`` is done no cycle of ``L`` arcs or fewer is left: every cycle taken is a
shortest cycle through its first arc and of the shortest length left in the whole graph (the
rule of the small-``K`` greedy; only the order within a length class differs). A cycle found
by a shortest path is simple.

Cost: class ``L = 3`` checks, for every arc ``u -> v``, the out-neighbours ``w`` of ``v`` for
an arc ``w -> u`` (``O(sum_v indeg(v) outdeg(v))``); longer classes run on what triangles left,
which is sparse on random shuffles. Memory: the ``K x K`` counts plus ``O(arcs)``.

:func:`triangle_packing` packs directed triangles first, where the small-``K`` scheme solves an
integer program (:func:`~coded_shuffle.math.schemes.cycles.pack_triangles`), by a greedy pass and
an iterated local search: every triangle in turn is taken out and triangles through its three
arcs are put in from the free arcs, two for one (a gain) or one for one (a plateau move, the
new one drawn at random so that the search walks instead of cycling). A work budget, not a
clock, bounds it, so that every rank derives the same packing.
"""

from __future__ import annotations

import numpy as np

from coded_shuffle.math.jit import LazyJit

CycleArrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # workers, lengths, multiplicities


def _free_arcs(
    weights: np.ndarray, given: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The free arcs of every worker ``x``: ``fout[fptr[x] : fptr[x] + fcnt[x]]``, with
    ``pos[x, y]`` the index of ``y`` there (-1: not free); room for every arc that is or may
    become free (those of ``weights`` and of the ``given`` triangles)."""
    k = weights.shape[0]
    room = weights > 0
    for t in range(given.shape[0]):
        for r in range(3):
            room[given[t, r], given[t, (r + 1) % 3]] = True
    fptr = np.zeros(k + 1, dtype=np.int64)
    for a in range(k):
        fptr[a + 1] = fptr[a] + np.count_nonzero(room[a])
    fout = np.empty(fptr[k], dtype=np.int64)
    fcnt = np.zeros(k, dtype=np.int64)
    pos = np.full((k, k), -1, dtype=np.int64)
    for a in range(k):
        for b in np.flatnonzero(weights[a] > 0):
            pos[a, b] = fcnt[a]
            fout[fptr[a] + fcnt[a]] = b
            fcnt[a] += 1
    return fptr, fout, fcnt, pos


def _give(
    w: np.ndarray,
    fptr: np.ndarray,
    fout: np.ndarray,
    fcnt: np.ndarray,
    pos: np.ndarray,
    a: int,
    b: int,
) -> None:
    """One unit of arc ``a -> b`` back to the free arcs."""
    w[a, b] += 1
    if w[a, b] == 1:
        pos[a, b] = fcnt[a]
        fout[fptr[a] + fcnt[a]] = b
        fcnt[a] += 1


def _take(
    w: np.ndarray,
    fptr: np.ndarray,
    fout: np.ndarray,
    fcnt: np.ndarray,
    pos: np.ndarray,
    a: int,
    b: int,
) -> None:
    """One unit of arc ``a -> b`` out of the free arcs."""
    w[a, b] -= 1
    if w[a, b] == 0:
        last = fout[fptr[a] + fcnt[a] - 1]
        fout[fptr[a] + pos[a, b]] = last
        pos[a, last] = pos[a, b]
        pos[a, b] = -1
        fcnt[a] -= 1


def _thirds(
    w: np.ndarray,
    fptr: np.ndarray,
    fout: np.ndarray,
    fcnt: np.ndarray,
    x: int,
    y: int,
    skip: int,
    cand: np.ndarray,
) -> int:
    """Into ``cand``, every worker ``z`` (but ``skip``) that closes ``x -> y -> z -> x`` with
    free arcs; returns how many."""
    nc = 0
    for f in range(fptr[y], fptr[y] + fcnt[y]):
        z = fout[f]
        if z != x and z != skip and w[z, x] > 0:
            cand[nc] = z
            nc += 1
    return nc


@LazyJit.using(_free_arcs, _give, _take, _thirds)
def _pack(weights: np.ndarray, given: np.ndarray, sweeps: int, seed: int) -> np.ndarray:
    """Triangles ``(n, 3)`` packed into the arc counts ``weights`` (left with the free arcs),
    starting from the ``given`` triangles (already taken out of ``weights``): a greedy pass,
    then ``sweeps`` passes that take each triangle out and put in one through each of its arcs
    where they fit."""
    k = weights.shape[0]
    np.random.seed(seed)
    fptr, fout, fcnt, pos = _free_arcs(weights, given)
    n = given.shape[0]
    tri = np.empty((weights.sum() // 3 + n + 1, 3), dtype=np.int64)
    tri[:n] = given
    cand = np.empty(k, dtype=np.int64)
    new = np.empty((3, 3), dtype=np.int64)
    sweep = -1  # the greedy pass, then `sweeps` passes of the local search
    while sweep < sweeps:
        greedy = sweep < 0
        order = np.arange(k) if greedy else np.random.permutation(n)
        for i in order:
            if greedy:  # every free arc out of worker i, in order
                arcs = np.empty((fcnt[i], 2), dtype=np.int64)
                arcs[:, 0] = i
                arcs[:, 1] = np.sort(fout[fptr[i] : fptr[i] + fcnt[i]])
            else:  # the arcs of triangle i, taken out, from a random one
                arcs = np.empty((3, 2), dtype=np.int64)
                start = np.random.randint(3)
                for r in range(3):
                    arcs[r, 0] = tri[i, (start + r) % 3]
                    arcs[r, 1] = tri[i, (start + r + 1) % 3]
                    _give(weights, fptr, fout, fcnt, pos, arcs[r, 0], arcs[r, 1])
            added = 0
            for r in range(arcs.shape[0]):
                x, y = arcs[r, 0], arcs[r, 1]
                skip = -1 if greedy else arcs[(r + 2) % 3, 0]  # the triangle just taken out
                while weights[x, y] > 0:
                    nc = _thirds(weights, fptr, fout, fcnt, x, y, skip, cand)
                    if nc == 0:
                        break
                    z = cand[0] if greedy else cand[np.random.randint(nc)]
                    _take(weights, fptr, fout, fcnt, pos, x, y)
                    _take(weights, fptr, fout, fcnt, pos, y, z)
                    _take(weights, fptr, fout, fcnt, pos, z, x)
                    if not greedy:
                        new[added, 0], new[added, 1], new[added, 2] = x, y, z
                        added += 1
                        break  # one triangle through each arc of the one taken out
                    tri[n, 0], tri[n, 1], tri[n, 2] = x, y, z
                    n += 1
            if greedy:
                continue
            if added == 0:  # nothing fits: the triangle goes back
                for r in range(3):
                    _take(weights, fptr, fout, fcnt, pos, arcs[r, 0], arcs[r, 1])
                continue
            tri[i] = new[0]  # in its slot, the others after the last
            for j in range(1, added):
                tri[n] = new[j]
                n += 1
        sweep += 1
    return tri[:n].copy()


@LazyJit
def _decompose(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.int64]:
    """``(workers, lengths, multiplicities, arcs left)``; ``weights`` is used up in place."""
    k = weights.shape[0]
    ptr = np.zeros(k + 1, dtype=np.int64)
    for a in range(k):
        ptr[a + 1] = ptr[a] + np.count_nonzero(weights[a] > 0)
    heads = np.empty(ptr[k], dtype=np.int64)
    for a in range(k):
        heads[ptr[a] : ptr[a + 1]] = np.flatnonzero(weights[a] > 0)
    left = weights.sum()
    workers = np.empty(left, dtype=np.int64)  # a cycle of L arcs removes at least L arc units
    lengths = np.empty(left, dtype=np.int64)
    mults = np.empty(left, dtype=np.int64)
    seen = np.zeros(k, dtype=np.int64)
    parent = np.empty(k, dtype=np.int64)
    depth = np.empty(k, dtype=np.int64)
    queue = np.empty(k, dtype=np.int64)
    path = np.empty(k, dtype=np.int64)
    stamp, ncyc, nwork = 0, 0, 0
    for length in range(2, k + 1):
        if left == 0:
            break
        last = length - 2  # depth of the path's last worker below v
        for u in range(k):
            for e in range(ptr[u], ptr[u + 1]):
                v = heads[e]
                while weights[u, v] > 0:
                    # breadth first from v, at most `last` arcs deep, never through u
                    stamp += 1
                    seen[v] = stamp
                    parent[v] = -1
                    depth[v] = 0
                    found = v if last == 0 and weights[v, u] > 0 else -1
                    qh, qt = 0, 1
                    queue[0] = v
                    while found < 0 and qh < qt and last > 0:
                        x = queue[qh]
                        qh += 1
                        for f in range(ptr[x], ptr[x + 1]):
                            y = heads[f]
                            if y == u or seen[y] == stamp or weights[x, y] <= 0:
                                continue
                            seen[y] = stamp
                            parent[y] = x
                            depth[y] = depth[x] + 1
                            if depth[y] == last:
                                if weights[y, u] > 0:
                                    found = y
                                    break
                            else:
                                queue[qt] = y
                                qt += 1
                    if found < 0:
                        break
                    # the cycle u -> v -> ... -> found -> u
                    n = 0
                    x = found
                    while x >= 0:
                        path[n] = x
                        n += 1
                        x = parent[x]
                    workers[nwork] = u
                    for i in range(n):
                        workers[nwork + 1 + i] = path[n - 1 - i]
                    m = weights[found, u]
                    for i in range(n):
                        a = workers[nwork + i]
                        b = workers[nwork + i + 1]
                        m = min(m, weights[a, b])
                    for i in range(n):
                        weights[workers[nwork + i], workers[nwork + i + 1]] -= m
                    weights[found, u] -= m
                    left -= m * (n + 1)
                    lengths[ncyc] = n + 1
                    mults[ncyc] = m
                    ncyc += 1
                    nwork += n + 1
    return workers[:nwork], lengths[:ncyc], mults[:ncyc], left


def shortest_first(weights: np.ndarray) -> CycleArrays:
    """``(workers, lengths, multiplicities)`` of simple cycles that cover the arc counts
    ``weights`` exactly, shortest length class first (module docstring); ``workers`` is the
    cycles' workers one after another, each cycle from the worker of its first arc.

    Raises ValueError when the counts are not Eulerian (in-degree differs from out-degree).
    """
    w = np.array(weights, dtype=np.int64)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or (w < 0).any():
        raise ValueError(f"arc counts must be a square non-negative matrix, got shape {w.shape}")
    np.fill_diagonal(w, 0)
    workers, lengths, mults, left = _decompose(w)
    if left:
        raise ValueError("arc counts are not Eulerian: in-degree differs from out-degree")
    return workers, lengths, mults


PASSES = (3, 100)  # passes of the local search per start
RESTART_SHARE = 0.1  # a restart keeps the best packing but this share of its triangles
MAX_RESTARTS = 200


def triangle_packing(
    weights: np.ndarray, work: int, seed: int = 0
) -> tuple[np.ndarray, CycleArrays]:
    """``(triangles (n, 3), the rest)``: directed triangles packed into the arc counts, each one
    unit of its three arcs (module docstring), and the arcs they leave decomposed by
    :func:`shortest_first`.

    ``work`` bounds the triangles taken out and put back in all: a greedy pass and up to
    ``PASSES[1]`` passes of the local search, then, while work is left, restarts from the
    best packing found with a random ``RESTART_SHARE`` of its triangles taken out (iterated
    local search; a restart is kept when its packing and the shortest-first cycles of its free
    arcs make at least as many cycles). Deterministic for given arguments.
    """
    omega = np.array(weights, dtype=np.int64)
    np.fill_diagonal(omega, 0)
    units = max(1, int(omega.sum()) // 3)
    passes = int(np.clip(work // units, *PASSES))
    rng = np.random.default_rng(seed)
    best = _pack(omega.copy(), np.zeros((0, 3), dtype=np.int64), passes, seed)
    best_rest = shortest_first(free_arcs(omega, best))
    restarts = min(MAX_RESTARTS, max(0, work - passes * units) // (PASSES[1] * units))
    for restart in range(restarts):
        kept = best[rng.random(best.shape[0]) >= RESTART_SHARE]
        trial = _pack(free_arcs(omega, kept), kept, PASSES[1], seed + 1 + restart)
        rest = shortest_first(free_arcs(omega, trial))
        if trial.shape[0] + rest[2].sum() >= best.shape[0] + best_rest[2].sum():
            best, best_rest = trial, rest
    return best, best_rest


def free_arcs(weights: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """The arc counts less one unit of every arc of every triangle."""
    free = np.array(weights, dtype=np.int64)
    for a, b in ((0, 1), (1, 2), (2, 0)):
        np.subtract.at(free, (triangles[:, a], triangles[:, b]), 1)
    return free
