"""Lower bounds on the load (Attia & Tandon 2016, Theorems 2 and 3; docs/schemes.md, lower bounds).

Theorem 2: for every ordering ``sigma`` of the workers,
``R* >= sum_{i<j} S[sigma_i][sigma_j]`` (off-diagonal entries only). The best ordering is a
maximum *linear ordering* of the shuffle matrix: exact by dynamic programming over subsets for
``K <= EXACT_MAX_WORKERS``, an iterated local search with a work budget that grows like
``K^2`` above (then the value is a valid bound that may not be the best one, and ``exact`` is
False; :func:`ordering_bound` says which was used).

Theorem 3: the worst case over all shuffles is ``(K-1) N / K``.
"""

from __future__ import annotations

import numpy as np

from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import batch_size
from coded_shuffle.math.jit import LazyJit

EXACT_MAX_WORKERS = 16


def off_diagonal(shuffle: np.ndarray) -> np.ndarray:
    """``S`` with a zero diagonal (points that stay never cross the link), as int64."""
    s = np.array(shuffle, dtype=np.int64)
    if s.ndim != 2 or s.shape[0] != s.shape[1]:
        raise UsageError(f"shuffle matrix must be square, got shape {s.shape}")
    np.fill_diagonal(s, 0)
    return s


def ordering_value(shuffle: np.ndarray, ordering: np.ndarray) -> int:
    """Theorem 2's bound for one ordering: ``sum_{i<j} S[sigma_i][sigma_j]``."""
    s = off_diagonal(shuffle)
    p = s[np.ix_(ordering, ordering)]
    return int(np.triu(p, 1).sum())


def ordering_bound(shuffle: np.ndarray) -> tuple[int, bool, np.ndarray]:
    """``(value, exact, ordering)``: the best Theorem 2 bound found for the shuffle matrix.

    ``exact`` is True when the ordering is a proven maximum (subset DP, ``K <= 16``).
    """
    s = off_diagonal(shuffle)
    k = s.shape[0]
    if k <= 1:
        return 0, True, np.arange(k, dtype=np.int64)
    if k <= EXACT_MAX_WORKERS:
        order = _exact_ordering(s)
        return ordering_value(s, order), True, order
    order = _search_ordering(s)
    return ordering_value(s, order), False, order


def worst_case_optimum(num_points: int, num_workers: int) -> float:
    """Theorem 3: the optimal worst-case load ``(K-1) N / K`` in points."""
    batch_size(num_points, num_workers)
    return (num_workers - 1) * num_points / num_workers


# --- exact: dynamic programming over subsets ------------------------------------------------


def _prefix_gains(s: np.ndarray) -> np.ndarray:
    """``g[mask, v] = sum_{i in mask} S[i][v]``: what ``v`` gains when placed after ``mask``."""
    k = s.shape[0]
    gains = np.zeros((1 << k, k), dtype=np.int64)
    for b in range(k):
        gains[1 << b : 2 << b] = gains[: 1 << b] + s[b]
    return gains


def _exact_ordering(s: np.ndarray) -> np.ndarray:
    """Maximum linear ordering of the shuffle matrix (gains: :func:`_prefix_gains`)."""
    return max_linear_ordering(_prefix_gains(s))[1]


def max_linear_ordering(gains: np.ndarray) -> tuple[float, np.ndarray]:
    """``(value, ordering)`` maximising ``sum_i gains[set before sigma_i, sigma_i]``.

    ``gains[mask, v]``: what worker ``v`` adds when the workers in ``mask`` precede it. DP over
    subsets, ``best[mask | v] = max(best[mask] + gains[mask, v])``, vectorised over all subsets
    of one size at a time (every subset of size ``p`` is final once all subsets of size
    ``p - 1`` have been pushed forward). Serves Theorem 2 of Attia & Tandon 2016 (arcs of the
    shuffle matrix) and the cut-set bound with excess storage
    (:mod:`coded_shuffle.math.rate_memory`).
    """
    k = gains.shape[1]
    full = (1 << k) - 1
    masks = np.arange(1 << k, dtype=np.int64)
    popcount = np.zeros(1 << k, dtype=np.int64)
    for b in range(k):
        popcount += (masks >> b) & 1
    best = np.full(1 << k, -np.inf if gains.dtype.kind == "f" else -1, dtype=gains.dtype)
    best[0] = 0
    bits = np.int64(1) << np.arange(k, dtype=np.int64)
    for size in range(k):
        layer = masks[popcount == size]
        free = (layer[:, None] & bits) == 0
        rows, cols = np.nonzero(free)
        src = layer[rows]
        value = best[src] + gains[src, cols]
        np.maximum.at(best, src | bits[cols], value)
    # backtrack: the last worker of the ordering first, lowest id on ties
    order = []
    mask = full
    while mask:
        for v in range(k):
            if mask >> v & 1:
                prev = mask ^ (1 << v)
                if best[prev] + gains[prev, v] == best[mask]:
                    order.append(v)
                    mask = prev
                    break
    return best[full], np.array(order[::-1], dtype=np.int64)


# --- heuristic: iterated local search --------------------------------------------------------

# The search's work, in matrix cells read: SEARCH_WORK_PER_CELL per cell of S, at least
# SEARCH_WORK_MIN (about 0.2 s at K <= 128, a second or two at K = 1,024). A work budget, not
# a clock: the bound is the same on every machine and every run.
SEARCH_WORK_PER_CELL = 300
SEARCH_WORK_MIN = 100_000_000
SEARCH_SEED = 0x5EED
# Where the budget is many times what one search needs (small K), it is shared between up to
# SEARCH_STARTS searches of different seeds: about one per SEARCH_WORK_PER_START * K^2 cells.
SEARCH_STARTS = 4
SEARCH_WORK_PER_START = 10_000


def search_work(num_workers: int) -> int:
    """Cells the ordering search may read at ``K`` workers (grows like ``K^2``)."""
    return max(SEARCH_WORK_MIN, SEARCH_WORK_PER_CELL * num_workers**2)


def _greedy_start(s: np.ndarray) -> np.ndarray:
    """Builds an ordering by inserting workers one by one at their best position."""
    order = np.zeros(0, dtype=np.int64)
    for v in range(s.shape[0]):
        # value of inserting v at position j: arcs from order[:j] into v, from v to order[j:]
        into = s[order, v]
        out = s[v, order]
        value = np.concatenate([[0], np.cumsum(into)]) + np.concatenate(
            [np.cumsum(out[::-1])[::-1], [0]]
        )
        order = np.insert(order, int(value.argmax()), v)
    return order


@LazyJit
def _iterated_insertion(s: np.ndarray, order: np.ndarray, work: int, seed: int) -> np.ndarray:
    """Insertion local search (every worker moved to its best position, first improvement,
    until none improves), then rounds of: shuffle a random segment of the best ordering, search
    again, keep the result if it is at least as good; until ``work`` cells have been read."""
    np.random.seed(seed)
    k = order.size
    best = order.copy()
    best_value = -1
    trial = order.copy()
    pos = np.empty(k, dtype=np.int64)
    used = 0
    first = True
    while first or used < work:
        if not first:
            trial[:] = best
            seg = min(k, 4 + np.random.randint(max(1, k // 8)))
            a = np.random.randint(k - seg + 1)
            part = trial[a : a + seg].copy()
            np.random.shuffle(part)
            trial[a : a + seg] = part
        first = False
        for i in range(k):
            pos[trial[i]] = i
        moved = True
        while moved and used < work:
            moved = False
            for v in range(k):
                i = pos[v]
                gain, to, g = 0, i, 0
                for j in range(i + 1, k):  # v after trial[i+1..j]
                    g += s[trial[j], v] - s[v, trial[j]]
                    if g > gain:
                        gain, to = g, j
                g = 0
                for j in range(i - 1, -1, -1):  # v before trial[j..i-1]
                    g += s[v, trial[j]] - s[trial[j], v]
                    if g > gain:
                        gain, to = g, j
                used += k
                if to == i:
                    continue
                moved = True
                step = 1 if to > i else -1
                for j in range(i, to, step):
                    trial[j] = trial[j + step]
                    pos[trial[j]] = j
                trial[to] = v
                pos[v] = to
        value = 0
        for a in range(k):
            for b in range(a + 1, k):
                value += s[trial[a], trial[b]]
        used += k * k // 2
        if value >= best_value:
            best[:] = trial
            best_value = value
    return best


def _search_ordering(s: np.ndarray) -> np.ndarray:
    """Iterated local search from the greedy insertion order, within :func:`search_work`
    (seeded: the same ordering on every run); the best of a few seeds at small ``K``."""
    k = s.shape[0]
    start = _greedy_start(s)
    work = search_work(k)
    starts = int(np.clip(work // (SEARCH_WORK_PER_START * k * k), 1, SEARCH_STARTS))
    orders = [_iterated_insertion(s, start, work // starts, SEARCH_SEED + i) for i in range(starts)]
    return max(orders, key=lambda order: ordering_value(s, order))
