"""Lower bounds on the load (Attia & Tandon 2016, Theorems 2 and 3; docs/schemes.md, lower bounds).

Theorem 2: for every ordering ``sigma`` of the workers,
``R* >= sum_{i<j} S[sigma_i][sigma_j]`` (off-diagonal entries only). The best ordering is a
maximum *linear ordering* of the shuffle matrix: exact by dynamic programming over subsets for
``K <= EXACT_MAX_WORKERS``, local search above (then the value is a valid bound that may not be
the best one, and ``exact`` is False).

Theorem 3: the worst case over all shuffles is ``(K-1) N / K``.
"""

from __future__ import annotations

import numpy as np

from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import batch_size

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


def exact_window(s: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The best reordering of ``order`` (a window of workers): arcs to the outside are fixed."""
    sub = s[np.ix_(order, order)]
    return order[_exact_ordering(sub)]


# --- heuristic: local search ----------------------------------------------------------------

SEARCH_STARTS = 8
WINDOW = 10
PERTURBATIONS = 60


def _insertion_pass(s: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, bool]:
    """One best-improvement insertion move (remove a worker, insert it elsewhere)."""
    k = order.size
    p = s[np.ix_(order, order)]
    diff = p - p.T  # diff[a, b] > 0: a before b is worth diff[a, b] over b before a
    best_gain, best_move = 0, None
    for i in range(k):
        # moving position i to j > i puts i after order[i+1..j]: gain sum diff[x, i]
        right = np.cumsum(diff[i + 1 :, i])
        # moving to j < i puts i before order[j..i-1]: gain sum diff[i, x]
        left = np.cumsum(diff[i, :i][::-1])
        if right.size and right.max() > best_gain:
            best_gain, best_move = int(right.max()), (i, i + 1 + int(right.argmax()))
        if left.size and left.max() > best_gain:
            best_gain, best_move = int(left.max()), (i, i - 1 - int(left.argmax()))
    if best_move is None:
        return order, False
    i, j = best_move
    rest = np.delete(order, i)
    return np.insert(rest, j, order[i]), True


def _windows_pass(s: np.ndarray, order: np.ndarray, window: int) -> tuple[np.ndarray, bool]:
    """Exact DP on every window of ``window`` consecutive workers (half-overlapping)."""
    improved = False
    k = order.size
    step = max(1, window // 2)
    for start in range(0, max(1, k - window + step), step):
        stop = min(k, start + window)
        seg = order[start:stop]
        new = exact_window(s, seg)
        if ordering_value(s, new) > ordering_value(s, seg):
            order = np.concatenate([order[:start], new, order[stop:]])
            improved = True
    return order, improved


def _local_search(s: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Insertion moves and exact windows until neither improves."""
    while True:
        moved = True
        while moved:
            order, moved = _insertion_pass(s, order)
        order, improved = _windows_pass(s, order, min(WINDOW, order.size))
        if not improved:
            return order


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


def _search_ordering(s: np.ndarray) -> np.ndarray:
    """Iterated local search from several deterministic starts (seeded, reproducible)."""
    k = s.shape[0]
    rng = np.random.default_rng(0x5EED)
    starts = [_greedy_start(s), np.arange(k, dtype=np.int64)]
    starts += [rng.permutation(k) for _ in range(SEARCH_STARTS - len(starts))]
    best, best_value = starts[0], -1
    for start in starts:
        order = _local_search(s, start)
        value = ordering_value(s, order)
        if value > best_value:
            best, best_value = order, value
    # perturb the best: reverse a random segment, search again, keep improvements
    for _ in range(PERTURBATIONS):
        a, b = np.sort(rng.choice(k + 1, size=2, replace=False))
        trial = best.copy()
        trial[a:b] = trial[a:b][rng.permutation(b - a)]
        trial = _local_search(s, trial)
        value = ordering_value(s, trial)
        if value > best_value:
            best, best_value = trial, value
    return best
