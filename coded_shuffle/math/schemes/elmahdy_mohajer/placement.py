"""The Elmahdy & Mohajer 2018 placement (Section III, Algorithms 1-2, 5): sub-points labelled by
``(t-1)``-subsets of the other workers, the caches they give, and the update after a shuffle."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from itertools import combinations
from math import comb

import numpy as np

from coded_shuffle.math.state import CacheState

RANK_TABLE_WORKERS = 16  # label ranks are looked up in a (K, 2^K) table up to this K


@dataclass(frozen=True)
class EMLabels:
    """The E-M placement: ``masks[x, j]`` = label bitmask of sub-point ``j`` of point ``x``.

    Labels are ``(t-1)``-subsets of the workers other than the point's processor; relabelling
    changes which label a stored sub-point carries, never its bytes.
    """

    t: int
    masks: np.ndarray  # (N, splits) int64


def em_splits(num_workers: int, t: int) -> int:
    """Sub-points per point: ``C(K-1, t-1)`` (Elmahdy & Mohajer 2018, eq. (7))."""
    return comb(num_workers - 1, t - 1)


def _comb_table(n: int) -> np.ndarray:
    table = np.zeros((n + 1, n + 2), dtype=np.int64)
    for a in range(n + 1):
        for b in range(a + 1):
            table[a, b] = comb(a, b)
    return table


def label_rank(masks: np.ndarray, owner: np.ndarray, num_workers: int) -> np.ndarray:
    """Colex rank of every label among the ``(t-1)``-subsets of ``[K] - {owner}`` (vectorised;
    read from a table of every ``(owner, mask)`` up to :data:`RANK_TABLE_WORKERS` workers)."""
    if num_workers <= RANK_TABLE_WORKERS:
        return _rank_table(num_workers)[owner, masks]
    return _label_rank(masks, owner, num_workers)


@functools.cache
def _rank_table(num_workers: int) -> np.ndarray:
    masks = np.arange(1 << num_workers, dtype=np.int64)
    return _label_rank(masks[None, :], np.arange(num_workers)[:, None], num_workers)


def _label_rank(masks: np.ndarray, owner: np.ndarray, num_workers: int) -> np.ndarray:
    masks, owner = np.broadcast_arrays(
        np.asarray(masks, dtype=np.int64), np.asarray(owner, dtype=np.int64)
    )
    table = _comb_table(num_workers)
    rank = np.zeros(masks.shape, dtype=np.int64)
    seen = np.zeros(masks.shape, dtype=np.int64)
    for b in range(num_workers):
        bit = (masks >> b) & 1
        seen += bit
        pos = b - (owner < b)
        rank += bit * table[np.maximum(pos, 0), seen]
    return rank


def label_table(num_workers: int, t: int) -> np.ndarray:
    """``table[h, j]`` = the label of rank ``j`` for points processed by ``h`` (initial slots)."""
    s = em_splits(num_workers, t)
    table = np.zeros((num_workers, s), dtype=np.int64)
    for h in range(num_workers):
        others = [w for w in range(num_workers) if w != h]
        masks = np.array([sum(1 << w for w in c) for c in combinations(others, t - 1)], np.int64)
        table[h, label_rank(masks, np.full(masks.size, h), num_workers)] = masks
    return table


def em_caches(assignment: np.ndarray, masks: np.ndarray, num_workers: int) -> tuple:
    """Worker ``k`` caches its batch whole and every sub-point whose label contains ``k``."""
    caches = []
    for k in range(num_workers):
        held = ((masks >> k) & 1).astype(bool) | (assignment == k)[:, None]
        caches.append(np.flatnonzero(held.reshape(-1)).astype(np.int64))
    return tuple(caches)


def em_state(assignment: np.ndarray, num_workers: int, t: int, masks: np.ndarray) -> CacheState:
    return CacheState(
        assignment=np.asarray(assignment, dtype=np.int64),
        num_workers=num_workers,
        splits=em_splits(num_workers, t),
        caches=em_caches(assignment, masks, num_workers),
        labels=EMLabels(t, masks),
    )


def em_initial_state(assignment: np.ndarray, num_workers: int, t: int) -> CacheState:
    """Algorithms 1-2 of Elmahdy & Mohajer 2018: canonical labels, slot
    ``j`` = label of rank ``j``."""
    assignment = np.asarray(assignment, dtype=np.int64)
    masks = label_table(num_workers, t)[assignment]
    return em_state(assignment, num_workers, t, masks)


def em_next_state(state: CacheState, new_assignment: np.ndarray) -> CacheState:
    """Algorithm 5 of Elmahdy & Mohajer 2018: relabel moved points (``h'``
    in a label becomes ``h``)."""
    old, new = state.assignment, np.asarray(new_assignment, dtype=np.int64)
    masks = state.labels.masks
    has_new = ((masks >> new[:, None]) & 1).astype(bool) & (old != new)[:, None]
    swap = (np.int64(1) << new) | (np.int64(1) << old)
    masks = np.where(has_new, masks ^ swap[:, None], masks)
    return em_state(new, state.num_workers, state.labels.t, masks)


# ---------------------------------------------------------------- permutation split
