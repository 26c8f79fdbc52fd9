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

__all__ = [
    "ACC",
    "ACC_XOR",
    "COPY",
    "XOR",
    "copy_rows",
    "gather_xor",
    "run_start",
    "set_threads",
    "threads",
    "warm",
]

PARALLEL_MIN_BYTES = 1 << 20  # chunks smaller than this run on one thread (start-up cost)
_threads = 1


def set_threads(n: int) -> None:
    """Cores the codec's kernel may use (numba's threads; 1: the calling thread only). The
    bytes are the same whatever ``n``; with ``n > 1`` only one Python thread may code at a
    time (numba's default thread pool is not re-entrant)."""
    global _threads
    if int(n) < 1:
        raise ValueError(f"codec threads must be >= 1, got {n}")
    _threads = int(n)


def threads() -> int:
    """The codec's cores (:func:`set_threads`)."""
    return _threads


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
    same XORed into ``dst[t]`` (ACC, ACC_XOR); uint8 rows, int64 indices; the targets of
    one call are distinct rows.

    A row is ``start + i`` when the column's (or the targets') ``start >= 0`` (one run of
    rows), else ``idx[i]``. ``b`` is ignored by COPY and ACC. Compiled on first use; on
    :func:`threads` cores when the chunk is large enough.
    """
    compiled = _compiled()
    if _threads > 1 and n * dst.shape[1] >= PARALLEL_MIN_BYTES:
        _set_numba_threads(_threads)
        spans = min(_threads, n)
        compiled.gather_xor_parallel(
            dst, targets, tstart, a, ia, astart, b, ib, bstart, mode, n, spans
        )
        return
    compiled.gather_xor(dst, targets, tstart, a, ia, astart, b, ib, bstart, mode, n)


def run_start(idx: np.ndarray) -> int:
    """``idx[0]`` when ``idx`` is one ascending run of rows (``a, a+1, ...``), else -1: the
    kernel's way to say "rows ``start + i``" without reading an index array."""
    if idx.size == 0:
        return 0
    first = int(idx[0])
    return first if int(idx[-1]) - first == idx.size - 1 and _ascending_run(idx) else -1


def _ascending_run(idx: np.ndarray) -> bool:
    return bool(np.all(np.diff(idx) == 1)) if idx.size > 1 else True


def copy_rows(dst: np.ndarray, targets: np.ndarray, src: np.ndarray, rows: np.ndarray) -> None:
    """``dst[targets[i]] = src[rows[i]]`` for every ``i`` (uint8 rows, int64 indices): one
    ``memcpy`` when both are runs of rows, else the kernel's prefetched gather."""
    n = rows.size
    if n == 0:
        return
    t, r = run_start(targets), run_start(rows)
    if t >= 0 and r >= 0:
        dst[t : t + n] = src[r : r + n]
        return
    targets, rows = targets.astype(np.int64, copy=False), rows.astype(np.int64, copy=False)
    gather_xor(dst, targets, t, src, rows, r, src, rows, r, COPY, n)


@cache
def _compiled() -> Any:
    from coded_shuffle.codec import (
        compiled,  # numba loads here: a process that never codes skips it
    )

    return compiled


def _set_numba_threads(n: int) -> None:
    import numba

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))


def warm() -> None:
    """Loads (or, on a fresh install, compiles) the kernel now rather than inside the first
    delivery: a process that starts a job calls it once, before any deadline runs."""
    rows = np.zeros((1, 1), dtype=np.uint8)
    none = np.zeros(0, dtype=np.int64)
    gather_xor(rows, none, 0, rows, none, 0, rows, none, 0, XOR, 1)
