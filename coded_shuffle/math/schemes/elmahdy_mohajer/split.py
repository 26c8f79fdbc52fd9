"""The permutation split of a shuffle (Elmahdy & Mohajer 2018, Section VI-A): its ``q``-regular
multigraph as ``q`` permutations, with as many cycles as the packing, the exact search
(small ``K, q``) or the local search over orbit trades finds."""

from __future__ import annotations

import itertools
from math import comb

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from coded_shuffle.math.bounds import off_diagonal
from coded_shuffle.math.rate_memory import em_load
from coded_shuffle.math.schemes.cycle_plan import greedy_cycles

SHORT_CYCLE_MAX = 3  # the greedy split packs cycles up to this length before completing
PACK_ATTEMPTS = 6  # seeded tie orders tried when packing cycles into permutations ...
PACK_UNITS_MAX = 5_000  # ... when the cycles are at most this many (each try is O(cycles * q))
EXACT_SPLIT_WORKERS = 5  # the best split is enumerated up to this K ...
EXACT_SPLIT_ROWS = 3  # ... and this q
SEARCH_SPLIT_ROWS = 256  # the local search runs up to this q (rows of K-permutations)
SPLIT_SEARCH_ROUNDS = 6000  # trades tried by the local search at most ...
SPLIT_SEARCH_PATIENCE = 1500  # ... stopping after this many without a better split
SPLIT_SEARCH_SEED = 0


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


def cycles_of(sigma: np.ndarray, skip: np.ndarray | None = None) -> list[list[int]]:
    """The cycles of a permutation (fixed points included), each from its smallest worker;
    none through a worker marked in ``skip``."""
    seen = np.zeros(sigma.size, dtype=bool) if skip is None else skip.copy()
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
    return [
        (list(c.workers), c.multiplicity) for c in greedy_cycles(off_diagonal(shuffle)).cycles()
    ]


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
    # where the rows agree the step is a fixed point, so no other orbit passes there
    orbits = cycles_of(inv[s2], skip=s1 == s2)
    return [np.array(orbit, dtype=np.int64) for orbit in orbits]


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
