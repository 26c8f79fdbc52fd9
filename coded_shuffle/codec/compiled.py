"""The numba-compiled body of :mod:`coded_shuffle.codec.kernel` (imported on first use only, so
that a process that never encodes or decodes does not load numba)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from coded_shuffle.codec.kernel_modes import ACC, ACC_XOR, LINE, PREFETCH_ROWS, XOR


@intrinsic
def _prefetch(typingctx, arr, row, col):
    """Hints the CPU to load ``arr[row, col]``'s cache line (``llvm.prefetch``, read, L1)."""
    sig = types.void(arr, row, col)

    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(
            context, builder, aty, ary, [args[1], args[2]], wraparound=False
        )
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        read, keep, data = (ir.Constant(i32, v) for v in (0, 3, 1))  # read, keep in L1
        builder.call(fn, [builder.bitcast(ptr, i8p), read, keep, data])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True, boundscheck=False)
def _row_at(start: int, idx: np.ndarray, i: int) -> int:
    return start + i if start >= 0 else idx[i]


@njit(cache=True, nogil=True, boundscheck=False)
def _span(
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
    lo: int,
    hi: int,
) -> None:
    """Rows ``lo <= i < hi`` of the chunk (see :func:`gather_xor`), the next rows' sources
    prefetched."""
    width = dst.shape[1]
    step = max(1, LINE // dst.itemsize)
    two = mode in (XOR, ACC_XOR)
    acc = mode in (ACC, ACC_XOR)
    for i in range(lo, hi):
        ahead = i + PREFETCH_ROWS
        if ahead < hi:
            if astart < 0:
                for c in range(0, width, step):
                    _prefetch(a, ia[ahead], c)
            if two and bstart < 0:
                for c in range(0, width, step):
                    _prefetch(b, ib[ahead], c)
            if tstart < 0:
                for c in range(0, width, step):
                    _prefetch(dst, targets[ahead], c)
        out = dst[_row_at(tstart, targets, i)]
        ra = a[_row_at(astart, ia, i)]
        if two:
            rb = b[_row_at(bstart, ib, i)]
            if acc:
                for j in range(width):
                    out[j] ^= ra[j] ^ rb[j]
            else:
                for j in range(width):
                    out[j] = ra[j] ^ rb[j]
        elif acc:
            for j in range(width):
                out[j] ^= ra[j]
        else:
            for j in range(width):
                out[j] = ra[j]


@njit(cache=True, nogil=True, boundscheck=False)
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
    """Row ``i`` of the chunk: ``dst[t] = a[ra]`` (COPY), ``a[ra] ^ b[rb]`` (XOR), or the same
    XORed into ``dst[t]`` (ACC, ACC_XOR).

    A row is ``start + i`` when the column's (or the targets') ``start >= 0`` (one run of
    rows), else ``idx[i]``; ``n`` rows. ``b`` is ignored by COPY and ACC.
    """
    _span(dst, targets, tstart, a, ia, astart, b, ib, bstart, mode, 0, n)


@njit(cache=True, nogil=True, boundscheck=False, parallel=True)
def gather_xor_parallel(
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
    spans: int,
) -> None:
    """:func:`gather_xor` with the rows cut into ``spans`` runs, one per thread (numba's
    threads). The rows a chunk writes are distinct, so every byte is the serial one."""
    for s in prange(spans):
        _span(
            dst,
            targets,
            tstart,
            a,
            ia,
            astart,
            b,
            ib,
            bstart,
            mode,
            s * n // spans,
            (s + 1) * n // spans,
        )
