"""The cycle-aware delivery of each permutation (Elmahdy & Mohajer 2018, Theorems 1, 2 and 4):
its sub-messages as rows of sub-point ids."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np

from coded_shuffle.math.assignment import points_by_pair, shuffle_matrix
from coded_shuffle.math.schemes.elmahdy_mohajer.placement import label_rank
from coded_shuffle.math.schemes.elmahdy_mohajer.split import cycles_of, split_rows
from coded_shuffle.math.state import CacheState


@dataclass(frozen=True)
class SubProblems:
    """``q`` canonical problems: row ``m`` has points ``points[m, i]`` (processed by ``i``)."""

    points: np.ndarray  # (q, K): the point worker i processes in sub-problem m
    needs: np.ndarray  # (q, K): pi[m, k] = worker whose point k needs
    ignored: np.ndarray  # (q,): the ignored worker u
    others: np.ndarray  # (q,): bitmask of the other cycle representatives
    cycles: np.ndarray  # (q,): number of cycles g


def sub_problems(old: np.ndarray, new: np.ndarray, num_workers: int, t: int = 1) -> SubProblems:
    """Splits the transition into permutations and takes concrete points for every row."""
    k = num_workers
    sigmas = split_rows(shuffle_matrix(old, new, k), t)
    return rows_with_points(old, new, k, sigmas, fixed=True)


def rows_with_points(
    old: np.ndarray, new: np.ndarray, num_workers: int, sigmas: np.ndarray, fixed: bool
) -> SubProblems:
    """Sub-problems for the permutation rows ``sigmas`` (worker ``i``'s point goes to
    ``sigmas[m, i]``): each takes the next point that moves so, or ``-1`` (a zero point, known
    to everyone) when none is left; a fixed point is a real point that stays only if ``fixed``.
    """
    k = num_workers
    order, offsets = points_by_pair(old, new, k)
    keys = (np.arange(k)[None, :] * k + sigmas).reshape(-1)
    by_key = np.argsort(keys, kind="stable")
    rank = np.empty_like(by_key)
    ordered = keys[by_key]
    rank[by_key] = np.arange(keys.size) - np.searchsorted(ordered, ordered, side="left")
    real = rank < offsets[keys + 1] - offsets[keys]
    if not fixed:
        real &= (sigmas != np.arange(k)[None, :]).reshape(-1)
    points = np.where(real, order[np.minimum(offsets[keys] + rank, order.size - 1)], -1)
    points = points.reshape(sigmas.shape)
    needs = np.empty_like(sigmas)
    np.put_along_axis(needs, sigmas, np.broadcast_to(np.arange(k), sigmas.shape), 1)
    uniq, inverse = np.unique(sigmas, axis=0, return_inverse=True)
    ignored, others, cycles = [], [], []
    for sigma in uniq:
        cyc = cycles_of(sigma)
        reps = [min(c) for c in cyc]
        u = reps[int(np.argmax([len(c) for c in cyc]))]
        ignored.append(u)
        others.append(sum(1 << r for r in reps if r != u))
        cycles.append(len(cyc))
    inverse = inverse.reshape(-1)
    return SubProblems(
        points=points,
        needs=needs,
        ignored=np.array(ignored, dtype=np.int64)[inverse],
        others=np.array(others, dtype=np.int64)[inverse],
        cycles=np.array(cycles, dtype=np.int64)[inverse],
    )


# ---------------------------------------------------------------- delivery


def _subpoint_ids(
    state: CacheState,
    inv: np.ndarray,
    points: np.ndarray,
    owner: np.ndarray,
    masks: np.ndarray,
    valid: np.ndarray | bool = True,
) -> np.ndarray:
    """Sub-point ids of label ``masks`` of ``points`` (processed by ``owner``); -1 if not valid
    or the point is ``-1``."""
    valid = valid & (points >= 0)  # -1: a zero point (a row's missing point), no term
    points = np.where(points >= 0, points, 0)
    ranks = np.where(valid, label_rank(masks, owner, state.num_workers), 0)
    return np.where(valid, points * state.splits + inv[points, ranks], -1)


def em_symbol_rows(state: CacheState, new_assignment: np.ndarray) -> list[np.ndarray]:
    """Terms of every sub-message, as ``(rows, width)`` matrices padded with ``-1``.

    Loops over the ``t``-subsets ``S`` and their members; vectorised over the ``q`` rows.
    """
    new = np.asarray(new_assignment, dtype=np.int64)
    sp = sub_problems(state.assignment, new, state.num_workers, state.labels.t)
    return sub_message_rows(state, sp)


def sub_message_rows(state: CacheState, sp: SubProblems) -> list[np.ndarray]:
    """``X_S`` for every sent ``S`` of every sub-problem row (see the module docstring)."""
    k, t, s = state.num_workers, state.labels.t, state.splits
    if t >= k:
        return []
    masks = state.labels.masks
    inv = np.empty_like(masks)
    ranks = label_rank(masks, state.assignment[:, None], k)
    np.put_along_axis(inv, ranks, np.broadcast_to(np.arange(s), masks.shape), 1)
    rows_out = []
    workers = np.arange(k)
    for members in combinations(range(k), t):
        smask = sum(1 << w for w in members)
        send = (((smask >> sp.ignored) & 1) == 0) & ((smask & ~sp.others) != 0)
        rows = np.flatnonzero(send)
        if rows.size == 0:
            continue
        cols = []
        for kk in members:
            lab = smask & ~(1 << kk)
            p_rows = sp.points[rows]
            # F_k^{S-k}: a real sub-point of k's own point, known to all of S
            cols.append(_subpoint_ids(state, inv, p_rows[:, kk], np.full(rows.size, kk), lab))
            # F_{pi(k)}^{S-k}: real if pi(k) not in S, else virtual (a sum over a not in S-k)
            j = sp.needs[rows, kk]
            xj = p_rows[np.arange(rows.size), j]
            virtual = ((smask >> j) & 1).astype(bool) & (j != kk)
            cols.append(_subpoint_ids(state, inv, xj, j, lab, ~virtual))
            for a in workers[((lab >> workers) & 1) == 0]:
                vmask = (lab & ~(np.int64(1) << j)) | (1 << int(a))
                cols.append(_subpoint_ids(state, inv, xj, j, vmask, virtual))
        rows_out.append(_cancel_pairs(np.stack(cols, axis=1)))
    return rows_out


def _cancel_pairs(terms: np.ndarray) -> np.ndarray:
    """XOR semantics: a sub-point named twice in a symbol cancels (rows padded with ``-1``)."""
    terms = np.sort(terms, axis=1)
    dup = (terms[:, 1:] == terms[:, :-1]) & (terms[:, 1:] >= 0)
    # multiplicities are at most two, so equal neighbours form disjoint pairs
    kill = np.zeros(terms.shape, dtype=bool)
    kill[:, 1:] |= dup
    kill[:, :-1] |= dup
    return np.where(kill, -1, terms)
