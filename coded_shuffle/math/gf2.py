"""Linear algebra over GF(2) on boolean matrices (the index decoder's elimination)."""

from __future__ import annotations

import numpy as np


def gauss_jordan(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Gauss-Jordan elimination of ``a`` (``m x u``, bool) over GF(2).

    Returns the reduced matrix (each pivot column zero but in its row), ``combo`` (``m x m``,
    bool: reduced row ``r`` is the XOR of the rows ``combo[r]`` of ``a``) and the rank (its
    first ``rank`` rows hold the pivots).
    """
    a = a.copy()
    m, u = a.shape
    combo = np.eye(m, dtype=bool)
    rank = 0
    for col in range(u):
        nz = np.flatnonzero(a[rank:, col])
        if nz.size == 0:
            continue
        r = rank + int(nz[0])
        if r != rank:
            a[[rank, r]] = a[[r, rank]]
            combo[[rank, r]] = combo[[r, rank]]
        others = np.flatnonzero(a[:, col])
        others = others[others != rank]
        a[others] ^= a[rank]
        combo[others] ^= combo[rank]
        rank += 1
        if rank == m:
            break
    return a, combo, rank
