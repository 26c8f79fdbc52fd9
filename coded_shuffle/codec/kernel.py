"""The fused gather-XOR kernel of the byte codec (compiled with numba).

One pass per chunk of rows: ``dst[t_i] (^)= a[i_a] ^ b[i_b]`` with every row read where it
is (no temporary copies) and the rows of the next iterations prefetched, so that several
random row reads are in flight at once. At 256-byte points the codec is bound by these
random reads, not by the XORs (docs/codec.md has the measurements).

numba rather than a compiled extension: it installs as a wheel from the package registry on a
fresh machine (no compiler needed), and the compiled kernel is cached on disk beside this
module, so only the first process of a fresh install pays the compile (about a second).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from coded_shuffle.codec.kernel_modes import ACC, ACC_XOR, COPY, XOR

__all__ = ["ACC", "ACC_XOR", "COPY", "XOR", "gather_xor", "warm"]


def gather_xor(
    dst: np.ndarray,
    targets: np.ndarray,
    tstart: int,
    a: np.ndarray,
    ia: np.ndarray,
    astart: int,
    b: np.ndarray,
    ib: np.ndarray,
    bstart: int,
    mode: int,
    n: int,
) -> None:
    """Row ``i < n`` of a chunk: ``dst[t] = a[ra]`` (COPY), ``a[ra] ^ b[rb]`` (XOR), or the
    same XORed into ``dst[t]`` (ACC, ACC_XOR); uint8 rows, int64 indices.

    A row is ``start + i`` when the column's (or the targets') ``start >= 0`` (one run of
    rows), else ``idx[i]``. ``b`` is ignored by COPY and ACC. Compiled on first use.
    """
    _compiled()(dst, targets, tstart, a, ia, astart, b, ib, bstart, mode, n)


@cache
def _compiled() -> Any:
    from coded_shuffle.codec import (
        compiled,  # numba loads here: a process that never codes skips it
    )

    return compiled.gather_xor


def warm() -> None:
    """Loads (or, on a fresh install, compiles) the kernel now rather than inside the first
    delivery: a process that starts a job calls it once, before any deadline runs."""
    rows = np.zeros((1, 1), dtype=np.uint8)
    none = np.zeros(0, dtype=np.int64)
    gather_xor(rows, none, 0, rows, none, 0, rows, none, 0, XOR, 1)
