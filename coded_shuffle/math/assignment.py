"""Assignments of points to workers, reshuffles, shuffle and leftover matrices (docs/model.md).

An *assignment* is an ``int64`` array of length ``N``: the 0-based worker of every point.
Every worker holds exactly ``q = N / K`` points.
"""

from __future__ import annotations

import numpy as np

from coded_shuffle.errors import UsageError


def batch_size(num_points: int, num_workers: int) -> int:
    """``q = N / K``; raises :class:`UsageError` unless ``K >= 1`` divides ``N >= K``."""
    if num_workers < 1:
        raise UsageError(f"workers must be >= 1, got {num_workers}")
    if num_points < num_workers:
        raise UsageError(f"points ({num_points}) must be >= workers ({num_workers})")
    if num_points % num_workers:
        raise UsageError(
            f"points ({num_points}) must be a multiple of workers ({num_workers}); "
            f"nearest valid: {num_points - num_points % num_workers}"
        )
    return num_points // num_workers


def random_assignment(num_points: int, num_workers: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random balanced assignment (random reshuffling)."""
    q = batch_size(num_points, num_workers)
    assignment = np.empty(num_points, dtype=np.int64)
    assignment[rng.permutation(num_points)] = np.arange(num_points, dtype=np.int64) // q
    return assignment


def shuffle_matrix(old: np.ndarray, new: np.ndarray, num_workers: int) -> np.ndarray:
    """``S[i, j]`` = points held by ``i`` in the old and assigned to ``j`` in the new epoch."""
    flat = np.bincount(old * num_workers + new, minlength=num_workers * num_workers)
    return flat.reshape(num_workers, num_workers).astype(np.int64)


def leftover_matrix(shuffle: np.ndarray) -> np.ndarray:
    """``Omega = S - min(S, S^T)`` (Attia & Tandon 2016, Section IV): what pairs leave over."""
    omega = shuffle - np.minimum(shuffle, shuffle.T)
    np.fill_diagonal(omega, 0)
    return omega


def batches(assignment: np.ndarray, num_workers: int) -> list[np.ndarray]:
    """Every worker's batch as a sorted array of point ids."""
    order = np.argsort(assignment, kind="stable")
    counts = np.bincount(assignment, minlength=num_workers)
    return np.split(order, np.cumsum(counts)[:-1])


def points_by_pair(
    old: np.ndarray, new: np.ndarray, num_workers: int
) -> tuple[np.ndarray, np.ndarray]:
    """Points sorted by their (old worker, new worker) pair, and the CSR offsets of every pair.

    ``points[offsets[i*K + j] : offsets[i*K + j + 1]]`` are the points that move ``i -> j``.
    """
    key = old * num_workers + new
    points = np.argsort(key, kind="stable")
    counts = np.bincount(key, minlength=num_workers * num_workers)
    offsets = np.zeros(num_workers * num_workers + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return points, offsets


def validate_assignment(
    assignment: np.ndarray, num_points: int, num_workers: int, name: str
) -> np.ndarray:
    """Checks a user-given assignment: length ``N``, ids in ``0..K-1``, balanced batches."""
    a = np.asarray(assignment)
    if a.ndim != 1 or a.shape[0] != num_points:
        raise UsageError(f"{name}: expected an array of length {num_points}, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        raise UsageError(f"{name}: expected integer worker ids, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if a.size and (a.min() < 0 or a.max() >= num_workers):
        bad = int(a[(a < 0) | (a >= num_workers)][0])
        raise UsageError(f"{name}: worker id {bad} out of range 0..{num_workers - 1}")
    counts = np.bincount(a, minlength=num_workers)
    q = num_points // num_workers
    if np.any(counts != q):
        w = int(np.flatnonzero(counts != q)[0])
        raise UsageError(
            f"{name}: worker {w} holds {int(counts[w])} points; every worker must hold N/K = {q}"
        )
    return a
