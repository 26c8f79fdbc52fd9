"""The codec's one executor: pool ops (:class:`~coded_shuffle.math.worker_program.PoolOp`)
run on the fused gather-XOR kernel of :mod:`.kernel`, and row copies (docs/codec.md)."""

from __future__ import annotations

import numpy as np
import torch

from coded_shuffle.codec import kernel
from coded_shuffle.codec.buffers import IN_MEMORY, Buffers
from coded_shuffle.math.worker_program import PoolOp

CHUNK_BYTES = 1 << 20  # an op of more than two columns runs in chunks of this (partials in cache)


def rows_view(t: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """``t`` as contiguous ``(rows, row_bytes)`` uint8 rows (an empty tensor: no rows)."""
    if t.dim() != 2 or t.shape[1] != row_bytes:  # only empty tensors (no rows) get here
        t = t.new_empty((0, row_bytes))
    return t.contiguous()


def _pairs(count: int) -> list[tuple[int, int, int]]:
    """Kernel calls for an op of ``count`` columns: ``(mode, first, second)`` each (second -1:
    one column), the first writing, the rest XORing into the targets."""
    calls = [(kernel.XOR if count > 1 else kernel.COPY, 0, 1 if count > 1 else -1)]
    for c in range(2, count, 2):
        calls.append((kernel.ACC_XOR, c, c + 1) if c + 1 < count else (kernel.ACC, c, -1))
    return calls


def run_ops(ops: tuple[PoolOp, ...], pools: list[torch.Tensor], full: bool) -> None:
    """Executes pool ops in order on the fused gather-XOR kernel (:mod:`.kernel`): the one
    executor of the codec (encode and decode).

    ``pools`` is indexed by pool code (uint8 rows of one width); ``full``: the ``SYM`` pool is
    the whole broadcast (use ``full_sources``), else the kept symbols in order. Each column is
    read as a run of rows when it is one, else gathered; each result is written straight
    into its row.
    """
    arrays = [p.numpy() for p in pools]
    for op in ops:
        run_op(op, arrays, full, 0, len(op))


_NONE = np.zeros(0, dtype=np.int64)


def _column(op: PoolOp, full: bool, c: int, a: int, b: int) -> tuple[int, np.ndarray]:
    """Rows ``a:b`` of column ``c``: ``(start, no index)`` for a run, else ``(-1, index)``."""
    sources, starts = (op.full_sources, op.full_starts) if full else (op.sources, op.starts)
    if starts[c] >= 0:
        return starts[c] + a, _NONE
    return -1, sources[c][a:b]


def run_op(
    op: PoolOp, arrays: list[np.ndarray], full: bool, a: int, b: int, shift: int = 0
) -> None:
    """Rows ``a:b`` of ``op`` (targets moved down by ``shift``), in chunks of at most
    ``CHUNK_BYTES`` when the op has more than two columns, so that partial XORs stay in
    cache."""
    dst, count = arrays[op.dest], len(op.pools)
    chunk = b - a if count <= 2 else max(1, CHUNK_BYTES // max(1, dst.shape[1]))
    for lo in range(a, b, max(chunk, 1)):
        hi = min(lo + chunk, b)
        if op.target_start >= 0:
            t0, targets = op.target_start + lo - shift, _NONE
        else:
            t0, targets = -1, op.targets[lo:hi] - shift if shift else op.targets[lo:hi]
        for mode, c1, c2 in _pairs(count):
            s1, i1 = _column(op, full, c1, lo, hi)
            s2, i2 = _column(op, full, c2, lo, hi) if c2 >= 0 else (-1, _NONE)
            src1 = arrays[op.pools[c1]]
            src2 = arrays[op.pools[c2]] if c2 >= 0 else src1
            kernel.gather_xor(dst, targets, t0, src1, i1, s1, src2, i2, s2, mode, hi - lo)


def gather_rows(src: torch.Tensor, rows: np.ndarray, buffers: Buffers = IN_MEMORY) -> torch.Tensor:
    """``src[rows]`` into fresh rows of ``buffers`` (the kernel's copy)."""
    out = buffers.empty(rows.size, src.shape[1])
    copy_rows(out, None, src, rows)
    return out


def copy_rows(
    out: torch.Tensor, targets: np.ndarray | None, src: torch.Tensor, rows: np.ndarray
) -> None:
    """``out[targets] = src[rows]`` (``targets`` None: the rows of ``out`` in order)."""
    if rows.size == 0 or src.shape[1] == 0:
        return
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    t = np.arange(rows.size) if targets is None else np.ascontiguousarray(targets, np.int64)
    dst, s = rows_view(out, out.shape[1]).numpy(), rows_view(src, src.shape[1]).numpy()
    kernel.copy_rows(dst, t, s, rows)
