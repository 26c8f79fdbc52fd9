"""The byte codec: executes a delivery plan on a ``torch.uint8`` tensor of points.

The master's data is an ``(N, B)`` tensor, one row per point. With ``splits = s`` every point
is cut into ``s`` sub-points of ``ceil(B / s)`` bytes (zero padding at the end of the point;
the padding travels on the link and is counted). Encoding and decoding are gathers and XORs
over index arrays, in chunks of bounded size, on the widest integer view the row length
allows.

Decoding reads the received symbols and the worker's cache where they are and writes every
decoded sub-point once, straight into its row of the new batch (the largest group of a
program writes one run of rows, no scatter); large outputs live in recycled huge-page
buffers. At 256-byte points both directions are bound by random row gathers (two per
symbol of degree 2), not by the XORs.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import sys
import threading
from dataclasses import dataclass

import numpy as np
import torch

from .decoder import BATCH, CACHE, SCRATCH, PoolOp, WorkerProgram, block_op
from .plan import DeliveryPlan, XorBlock, subpoint_bytes

CHUNK_BYTES = 1 << 20
HUGE_PAGE_BYTES = 4 << 20  # outputs from this size on are backed by transparent huge pages
IDLE_BYTES_MAX = 512 << 20  # recycled output buffers kept mapped while no tensor uses them
_buffers: list[mmap.mmap] = []  # every huge-page buffer handed out (in use or idle)
_buffers_lock = threading.Lock()


def _idle(i: int) -> bool:
    """True when no tensor uses ``_buffers[i]`` (references: the list and this argument).

    ``torch.frombuffer`` holds a buffer export, hence a reference, for as long as any
    tensor or view on the storage lives; so an idle buffer can be handed out again.
    """
    return sys.getrefcount(_buffers[i]) == 2


def _huge_buffer(nbytes: int) -> mmap.mmap:
    """A mapping of ``nbytes`` rounded up to 2 MiB: an idle one reused, else a fresh one.

    Fresh pages cost a fault and the kernel's zeroing on first touch, as much as the XORs
    that fill them; reusing a buffer that the caller dropped avoids both. Idle buffers
    beyond ``IDLE_BYTES_MAX`` are unmapped.
    """
    size = -(-nbytes // (2 << 20)) * (2 << 20)
    idle = [i for i in range(len(_buffers)) if _idle(i)]
    for i in idle:
        if len(_buffers[i]) == size:
            return _buffers[i]
    kept = 0
    for i in reversed(idle):  # the oldest idle buffers go first
        kept += len(_buffers[i])
        if kept + size > IDLE_BYTES_MAX:
            del _buffers[i]
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # without huge pages: ordinary pages, same bytes
        buf.madvise(mmap.MADV_HUGEPAGE)
    _buffers.append(buf)
    return buf


def empty_rows(rows: int, row_bytes: int) -> torch.Tensor:
    """An uninitialised ``(rows, row_bytes)`` uint8 tensor for a codec output.

    Small outputs come from ``torch.empty``. From ``HUGE_PAGE_BYTES`` on, the buffer is a
    private anonymous mapping advised ``MADV_HUGEPAGE`` (the tensor keeps the mapping alive;
    where the advice is unavailable, ordinary pages), recycled once no tensor uses it: with
    4 KiB pages, the first touch of every page of a fresh output costs as much as the XORs.
    """
    nbytes = rows * row_bytes
    if nbytes < HUGE_PAGE_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty((rows, row_bytes), dtype=torch.uint8)
    with _buffers_lock:  # the export must exist before another thread looks for idle buffers
        buf = _huge_buffer(nbytes)
        return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes).view(rows, row_bytes)


def digest(rows: torch.Tensor) -> bytes:
    """SHA-256 of a tensor's bytes in row-major order (message payloads, decoded batches)."""
    return hashlib.sha256(rows.contiguous().numpy()).digest()


def split_points(data: torch.Tensor, splits: int) -> torch.Tensor:
    """``(N, B)`` points as ``(N * s, ceil(B / s))`` sub-points (zero-padded when needed)."""
    n, b = data.shape
    sub = subpoint_bytes(b, splits)
    if sub * splits != b:
        padded = torch.zeros((n, sub * splits), dtype=torch.uint8)
        padded[:, :b] = data
        data = padded
    return data.contiguous().view(n * splits, sub)


def join_subpoints(rows: torch.Tensor, splits: int, point_bytes: int) -> torch.Tensor:
    """Inverse of :func:`split_points` for ``(n * s, sub)`` rows in point-major order."""
    return rows.reshape(rows.shape[0] // splits, splits * rows.shape[1])[:, :point_bytes]


def _wide(t: torch.Tensor) -> torch.Tensor:
    """The same bytes viewed as the widest integer type that divides a row."""
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        aligned = t.numel() > 0 and t.storage_offset() % size == 0  # empty or offset parts
        if aligned and t.shape[1] % size == 0 and t.is_contiguous():
            return t.view(dtype)
    return t


def run_blocks(blocks: tuple[XorBlock, ...], src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst[targets] = XOR_c src[sources[:, c]]`` for every block (the encoder's program):
    the blocks as pool ops (:func:`~coded_shuffle.decoder.block_op`) on :func:`run_ops`."""
    if not blocks or src.shape[1] == 0:
        return
    row_bytes = src.shape[1]
    size = _common_width([src, dst], row_bytes)
    views = [_rows_view(t, size, row_bytes) for t in (src, dst)]
    run_ops(tuple(block_op(b, src_pool=0, dest_pool=1) for b in blocks), views, full=False)


def encode_blocks(plan: DeliveryPlan) -> tuple[XorBlock, ...]:
    """The master's program: symbol ``i`` = XOR of its sub-points."""
    blocks, start = [], 0
    for terms in plan.symbols:
        n = terms.shape[0]
        blocks.append(XorBlock(np.arange(start, start + n, dtype=np.int64), terms))
        start += n
    return tuple(blocks)


def encode(plan: DeliveryPlan, data: torch.Tensor) -> torch.Tensor:
    """All symbols of ``plan`` as a ``(num_symbols, sub_bytes)`` uint8 tensor."""
    subs = split_points(data, plan.splits)
    out = empty_rows(plan.num_symbols, subs.shape[1])
    run_blocks(encode_blocks(plan), subs, out)
    return out


def decode(
    program: WorkerProgram, symbols: torch.Tensor, cache: torch.Tensor, point_bytes: int
) -> torch.Tensor:
    """The worker's new batch ``(q, B)`` from the received symbols and its own cache rows."""
    work = decode_workspace(program, symbols, cache)
    return batch_from_workspace(work, program, point_bytes)


@dataclass(frozen=True)
class Workspace:
    """One part's rows at a worker after decoding (the pools of :class:`PoolOp`).

    ``batch`` holds the new batch as sub-point rows (``program.batch_rows`` order),
    ``scratch`` the decoded sub-points that are not in it, ``cache`` the rows held before.
    """

    program: WorkerProgram
    cache: torch.Tensor
    batch: torch.Tensor
    scratch: torch.Tensor

    def rows(self, subpoints: np.ndarray) -> torch.Tensor:
        """Fresh ``(n, sub)`` rows of ``subpoints``; ValueError names one never received."""
        subpoints = np.asarray(subpoints, dtype=np.int64)
        pool, row = self.program.locate(subpoints)
        if np.any(pool < 0):
            missing = int(subpoints[pool < 0][0])
            raise ValueError(
                f"worker {self.program.worker} cannot keep sub-point {missing}: never received"
            )
        pools = {CACHE: self.cache, BATCH: self.batch, SCRATCH: self.scratch}
        if np.all(pool == BATCH):  # e.g. no excess storage: the new cache is the new batch
            return gather_rows(self.batch, row)
        out = torch.empty((subpoints.size, self.batch.shape[1]), dtype=torch.uint8)
        for code, src in pools.items():
            sel = np.flatnonzero(pool == code)
            if sel.size:
                picked = src.index_select(0, torch.from_numpy(row[sel]))
                out.index_copy_(0, torch.from_numpy(sel), picked)
        return out


def _common_width(tensors: list[torch.Tensor], row_bytes: int) -> int:
    """The widest integer size (8, 4, 2, 1) that divides a row and aligns every tensor."""
    for size in (8, 4, 2):
        if row_bytes % size == 0 and all(
            t.numel() == 0 or t.storage_offset() % size == 0 for t in tensors
        ):
            return size
    return 1


_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _rows_view(t: torch.Tensor, size: int, row_bytes: int) -> torch.Tensor:
    """``t`` as ``(rows, row_bytes // size)`` integers of ``size`` bytes."""
    if t.dim() != 2 or t.shape[1] != row_bytes:  # only empty tensors (no rows) get here
        t = t.new_empty((0, row_bytes))
    return t.contiguous().view(_DTYPES[size])


def _column(
    src: torch.Tensor, idx: np.ndarray, start: int, a: int, b: int, buf: torch.Tensor
) -> torch.Tensor:
    """Rows ``idx[a:b]`` of ``src``: a slice when they are one run, else gathered into ``buf``."""
    if start >= 0:
        return src[start + a : start + b]
    torch.index_select(src, 0, torch.from_numpy(idx[a:b]), out=buf)
    return buf


def run_ops(ops: tuple[PoolOp, ...], pools: list[torch.Tensor], full: bool) -> None:
    """Executes pool ops in order, in chunks of at most ``CHUNK_BYTES`` per scratch buffer:
    the one gather-XOR executor of the codec (encode and decode).

    ``pools`` is indexed by pool code (all the same integer view); ``full``: the ``SYM``
    pool is the whole broadcast (use ``full_sources``), else the kept symbols in order. Each
    column is read as a slice when its rows are one run, else gathered; the result is written
    straight into its rows when the targets are one run, else scattered.
    """
    ref = pools[ops[0].dest] if ops else pools[0]  # every pool: the same integer view
    width = ref.shape[1] * ref.element_size()
    chunk = max(1, CHUNK_BYTES // max(1, width))
    rows = min(chunk, max((len(op) for op in ops), default=0))
    acc = torch.empty((rows, ref.shape[1]), dtype=ref.dtype)
    tmp = torch.empty_like(acc)
    arrays = [p.numpy() for p in pools]  # numpy scatters rows faster than index_copy_
    for op in ops:
        sources, starts = (op.full_sources, op.full_starts) if full else (op.sources, op.starts)
        dst, dst_np = pools[op.dest], arrays[op.dest]
        cols = [(pools[p], sources[c], starts[c]) for c, p in enumerate(op.pools)]
        for a in range(0, len(op), chunk):
            b = min(a + chunk, len(op))
            n = b - a
            direct = op.target_start >= 0
            out = dst[op.target_start + a : op.target_start + b] if direct else acc[:n]
            src, idx, start = cols[0]
            if len(cols) == 1:
                if direct and start < 0:
                    torch.index_select(src, 0, torch.from_numpy(idx[a:b]), out=out)
                    continue
                value = _column(src, idx, start, a, b, acc[:n])
                if direct:
                    out.copy_(value)
                else:
                    dst_np[op.targets[a:b]] = value.numpy()
                continue
            cur = _column(src, idx, start, a, b, acc[:n])
            for src, idx, start in cols[1:-1]:
                value = _column(src, idx, start, a, b, tmp[:n])
                torch.bitwise_xor(cur, value, out=acc[:n])
                cur = acc[:n]
            src, idx, start = cols[-1]
            value = _column(src, idx, start, a, b, tmp[:n])
            torch.bitwise_xor(cur, value, out=out)
            if not direct:
                dst_np[op.targets[a:b]] = out.numpy()


def decode_workspace(
    program: WorkerProgram, symbols: torch.Tensor, cache: torch.Tensor
) -> Workspace:
    """Runs the worker's program: the new batch rows, decoded in place, and scratch rows.

    ``symbols`` holds the rows ``program.symbol_ids`` of the broadcast (in that order) or the
    whole broadcast; ``cache`` holds the worker's cached sub-points in plan order. Symbols
    and cache are read where they are (no copy); every decoded sub-point of the new batch is
    written once, straight into its row.
    """
    m = program.symbol_ids.size
    sub = cache.shape[1] if cache.numel() else symbols.shape[1]
    batch = empty_rows(program.batch_rows.size, sub)
    scratch = torch.empty((program.num_scratch, sub), dtype=torch.uint8)
    if sub == 0:  # a zero-byte part (memory sharing): nothing to compute
        return Workspace(program, cache, batch, scratch)
    pools = [symbols, cache, batch, scratch]
    size = _common_width(pools, sub)
    views = [_rows_view(t, size, sub) for t in pools]
    run_ops(program.ops, views, full=symbols.shape[0] != m)
    return Workspace(program, cache, batch, scratch)


def batch_from_workspace(work: Workspace, program: WorkerProgram, point_bytes: int) -> torch.Tensor:
    """The new batch ``(q, B)`` of a decoded workspace (a view when no padding is cut off)."""
    splits = program.batch_rows.shape[1]
    return join_subpoints(work.batch, splits, point_bytes)


def cache_bytes(data: torch.Tensor, plan: DeliveryPlan, worker: int) -> torch.Tensor:
    """What ``worker`` caches before the delivery, as sub-point rows (test and CLI helper)."""
    subs = split_points(data, plan.splits)
    return gather_rows(subs, plan.caches[worker])


def gather_rows(src: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """``src[rows]`` into a fresh :func:`empty_rows` buffer, on a wide integer view."""
    out = empty_rows(rows.size, src.shape[1])
    src_w, out_w = _wide(src), _wide(out)
    if src_w.dtype != out_w.dtype:
        src_w, out_w = src, out
    torch.index_select(src_w, 0, torch.from_numpy(np.ascontiguousarray(rows)), out=out_w)
    return out
