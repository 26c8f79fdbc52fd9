"""Rate-memory formulas, curves and the per-shuffle lower bound with excess storage.

* Corner points and their lower convex envelope (docs/excess-storage.md): Attia-Tandon
  structural-invariant (Attia & Tandon 2019, Theorem 1), Elmahdy-Mohajer (Elmahdy & Mohajer 2018,
  Theorems 1-5), uncoded delivery with the E-M placement.
* The ordering cut-set bound for a fixed uncoded placement (generalises
Attia & Tandon 2016, Theorem 2):
  for an ordering ``sigma`` of the workers,
  ``R >= sum_i |D_{sigma_i} - (U_{j<=i} C_{sigma_j} U U_{j<i} D_{sigma_j})|``
  (``C`` = cache, ``D`` = demanded sub-points, weighted in points). A sub-point counts exactly
  when its demander comes before every worker that caches it, so the bound is a weighted
  maximum linear ordering over sub-point *types* (demander, cachers): exact by dynamic
  programming over subsets for small ``K``, greedy plus local search above.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb

import numpy as np

from coded_shuffle.math.assignment import batch_size
from coded_shuffle.math.bounds import EXACT_MAX_WORKERS, max_linear_ordering, worst_case_optimum
from coded_shuffle.math.state import CacheState, part_states

# ---------------------------------------------------------------- formulas


def em_load(num_workers: int, t: int, cycles: int = 1) -> float:
    """E-M load of one permutation with ``g`` cycles, in points (Elmahdy &
    Mohajer 2018, Theorems 1-3).

    ``(C(K-1, t) - C(g-1, t)) / C(K-1, t-1)``; ``g = 1`` gives ``(K-t)/t``.
    """
    return (comb(num_workers - 1, t) - comb(cycles - 1, t)) / comb(num_workers - 1, t - 1)


def em_corners(num_workers: int, num_points: int) -> list[tuple[float, float]]:
    """``(T, worst-case load)`` = ``(t, q(K-t)/t)`` for ``t = 1..K`` (Elmahdy
    & Mohajer 2018, Theorem 5)."""
    q = batch_size(num_points, num_workers)
    return [(float(t), q * (num_workers - t) / t) for t in range(1, num_workers + 1)]


def at_corners(num_workers: int, num_points: int, paper: bool = False) -> list[tuple[float, float]]:
    """``(1 + p(K-1)/K, q(K-p)/(p+1))`` for ``p = 1..K`` (Attia & Tandon 2019, Theorem 1), and at
    ``p = 0``: ``(1, N)`` with ``paper`` (Theorem 1: every point sent once, its Example 1's
    ``(1, 4)`` at ``K = N = 4``), else ``(1, q(K-1))``, the project's no-excess delivery
    (the no-excess optimum of docs/schemes.md, reached by ``cycles`` on the worst shuffle).
    """
    q = batch_size(num_points, num_workers)
    k = num_workers
    first = float(num_points) if paper else worst_case_optimum(num_points, k)
    points = [(1.0, first)]
    points += [(1 + p * (k - 1) / k, q * (k - p) / (p + 1)) for p in range(1, k + 1)]
    return points


def gap_to_optimum(
    num_workers: int, num_points: int, paper: bool, grid: int = 2001
) -> tuple[float, float]:
    """``(largest ratio, T at it)`` of the A-T worst-case curve over the worst-case optimum
    (Elmahdy & Mohajer 2018 Theorem 5) on ``1 <= T < K``: Attia & Tandon 2019
    Theorem 3 bounds it by ``K/(K-1)``."""
    ts = np.linspace(1.0, float(num_workers), grid)[:-1]  # both loads vanish at T = K
    ratio = at_worst_case(num_workers, num_points, ts, paper) / em_worst_case(
        num_workers, num_points, ts
    )
    i = int(np.argmax(ratio))
    return float(ratio[i]), float(ts[i])


def uncoded_excess(num_workers: int, num_points: int, storage: float) -> float:
    """Uncoded worst case with the E-M placement: ``N (K - T)/(K - 1)`` (every need sent once)."""
    if num_workers == 1:
        return 0.0
    return num_points * (num_workers - storage) / (num_workers - 1)


def decentralized_converse(
    num_workers: int, num_points: int, storage: float | np.ndarray
) -> np.ndarray:
    """The decentralized converse under uncoded storage (Wan et al. 2020; docs/decentralized.md):
    the lower convex envelope of ``N (K - m) / (m (K - 1))`` over integer ``m`` = ``K/(K-1)``
    times the centralized bound ``N (K - m) / (m K)``; a worst case over shuffles."""
    k = num_workers
    if k == 1:
        return np.zeros_like(np.asarray(storage, dtype=np.float64))
    corners = [(float(m), num_points * (k - m) / (m * (k - 1))) for m in range(1, k + 1)]
    return envelope(corners, storage)


def envelope(corners: Sequence[tuple[float, float]], storage: float | np.ndarray) -> np.ndarray:
    """The lower convex envelope of the corner points at ``storage`` (memory sharing, 4.3)."""
    pts = sorted(corners)
    hull: list[tuple[float, float]] = []
    for x, y in pts:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (x - x1) >= (y - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append((x, y))
    xs, ys = zip(*hull, strict=True)
    return np.interp(storage, xs, ys)


def em_worst_case(num_workers: int, num_points: int, storage: float | np.ndarray) -> np.ndarray:
    """The optimal worst-case load under uncoded placement (Elmahdy & Mohajer
    2018, Theorem 5 + memory sharing).

    Also the worst-case lower bound the curves show.
    """
    return envelope(em_corners(num_workers, num_points), storage)


def at_worst_case(
    num_workers: int, num_points: int, storage: float | np.ndarray, paper: bool = False
) -> np.ndarray:
    """Attia-Tandon structural-invariant worst-case load (Attia & Tandon 2019, Theorem 1 + Claim 1);
    ``paper``: with the paper's ``p = 0`` corner ``(1, N)`` (see :func:`at_corners`)."""
    return envelope(at_corners(num_workers, num_points, paper), storage)


# ---------------------------------------------------------------- the per-shuffle bound


def _types(state: CacheState, new_assignment: np.ndarray, weight: float):
    """Demanded sub-points grouped by type ``(demander d, mask = cachers + d)``, with weights."""
    k = state.num_workers
    cachers = np.zeros(state.num_points * state.splits, dtype=np.int64)
    for w in range(k):
        cachers[state.caches[w]] |= np.int64(1) << w
    demander = np.repeat(np.asarray(new_assignment, dtype=np.int64), state.splits)
    demanded = ((cachers >> demander) & 1) == 0
    d = demander[demanded]
    keys = d * (np.int64(1) << k) + (cachers[demanded] | (np.int64(1) << d))
    uniq, counts = np.unique(keys, return_counts=True)
    return uniq >> k, uniq & ((np.int64(1) << k) - 1), counts * weight


def placement_lower_bound(state: CacheState, new_assignment: np.ndarray) -> tuple[float, bool]:
    """``(bound in points, exact)``: the ordering cut-set bound for this placement and shuffle.

    Valid for any code (the chain of decodings along ``sigma``); with memory sharing the
    sub-points of every part are weighted by their byte fraction under one common ordering.
    """
    k = state.num_workers
    parts, fractions = part_states(state)
    dem, mask, wts = [], [], []
    for part, f in zip(parts, fractions, strict=True):
        d, m, w = _types(part, new_assignment, f / part.splits)
        dem.append(d)
        mask.append(m)
        wts.append(w)
    dem, mask, wts = np.concatenate(dem), np.concatenate(mask), np.concatenate(wts)
    if dem.size == 0:
        return 0.0, True
    if k <= EXACT_MAX_WORKERS:
        return _exact(k, dem, mask, wts), True
    return _local_search(k, dem, mask, wts), False


def _exact(k: int, dem: np.ndarray, mask: np.ndarray, wts: np.ndarray) -> float:
    """The maximum over orderings (:func:`~coded_shuffle.math.bounds.max_linear_ordering`) with
    ``gain_k(U)`` = weight of types demanded by ``k`` whose other holders miss ``U``."""
    full = 1 << k
    others = mask & ~(np.int64(1) << dem)
    gain = np.zeros((k, full))
    np.add.at(gain, (dem, others), wts)
    # g[k, V] = sum over holder sets inside V; gain_k(U) = g[k, complement(U)]
    for b in range(k):
        bit = 1 << b
        idx = np.arange(full)
        has = (idx & bit) != 0
        gain[:, has] += gain[:, idx[has] ^ bit]
    comp = (full - 1) ^ np.arange(full)
    return float(max_linear_ordering(np.ascontiguousarray(gain[:, comp].T))[0])


def cut_set_value(order: np.ndarray, dem: np.ndarray, mask: np.ndarray, wts: np.ndarray) -> float:
    """The bound of one ordering: types whose demander precedes all their other holders."""
    k = order.size
    pos = np.empty(k, dtype=np.int64)
    pos[order] = np.arange(k)
    bits = ((mask[:, None] >> np.arange(k)) & 1).astype(bool)
    first = np.where(bits, pos[None, :], k).min(axis=1)
    return float(wts[first == pos[dem]].sum())


def _local_search(k: int, dem: np.ndarray, mask: np.ndarray, wts: np.ndarray) -> float:
    """Greedy ordering (largest gain first), then improving moves of one worker."""
    remaining = list(range(k))
    placed = np.int64(0)
    order = []
    for _ in range(k):
        gains = [
            wts[(dem == w) & ((mask & ~(np.int64(1) << w) & placed) == 0)].sum() for w in remaining
        ]
        w = remaining.pop(int(np.argmax(gains)))
        order.append(w)
        placed |= np.int64(1) << w
    order = np.array(order)
    value = cut_set_value(order, dem, mask, wts)
    improved = True
    while improved:
        improved = False
        for i in range(k):
            for j in range(k):
                if i == j:
                    continue
                trial = list(order)
                trial.insert(j, trial.pop(i))
                v = cut_set_value(np.array(trial), dem, mask, wts)
                if v > value + 1e-12:
                    order, value, improved = np.array(trial), v, True
    return value
