"""Encoding at the master, once (Yang et al. 2018, eq. (1)): ``X~_s = sum_k g_sk X_k``."""

from __future__ import annotations

import numpy as np


def block_rows(points: int, recovery_threshold: int) -> int:
    """Rows of every block ``X_k``: ``ceil(N / L)`` (the last block is zero-padded, sec. 2.2)."""
    return -(-int(points) // int(recovery_threshold))


def split_blocks(data: np.ndarray, recovery_threshold: int) -> np.ndarray:
    """``(L, b, ...)`` row blocks of ``data`` (``X`` or ``y``), zero-padded to ``L * b`` rows."""
    data = np.asarray(data, dtype=np.float64)
    b = block_rows(data.shape[0], recovery_threshold)
    padded = np.zeros((recovery_threshold * b, *data.shape[1:]))
    padded[: data.shape[0]] = data
    return padded.reshape(recovery_threshold, b, *data.shape[1:])


def encode(blocks: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Coded blocks ``(R, b, d)`` for generator rows ``(R, L)`` (eq. (1))."""
    return np.tensordot(np.atleast_2d(rows), blocks, axes=(1, 0))
