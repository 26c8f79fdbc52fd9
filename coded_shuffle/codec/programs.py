"""The byte codec: executes a delivery plan on a ``torch.uint8`` tensor of points.

The master's data is an ``(N, B)`` tensor, one row per point. With ``splits = s`` every point
is cut into ``s`` sub-points of ``ceil(B / s)`` bytes (zero padding at the end of the point;
the padding travels on the link and is counted). Encoding and decoding are programs of
gather-XORs over index arrays, every one executed by the fused kernel of :mod:`.kernel`;
both can run piece by piece as messages leave (:class:`Encoder`) and arrive
(:class:`StreamDecoder`).

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
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from coded_shuffle.codec import kernel
from coded_shuffle.math.index_decoder import (
    BATCH,
    CACHE,
    SCRATCH,
    PoolOp,
    WorkerProgram,
    arrival_order,
    block_op,
)
from coded_shuffle.math.plan import DeliveryPlan, XorBlock, subpoint_bytes

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
    """SHA-256 of a tensor's bytes in row-major order (decoded batches)."""
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


def run_blocks(blocks: tuple[XorBlock, ...], src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst[targets] = XOR_c src[sources[:, c]]`` for every block (the encoder's program):
    the blocks as pool ops (:func:`~coded_shuffle.math.index_decoder.block_op`) on
    :func:`run_ops`."""
    if not blocks or src.shape[1] == 0:
        return
    views = [_rows_view(t, src.shape[1]) for t in (src, dst)]
    run_ops(tuple(block_op(b, src_pool=0, dest_pool=1) for b in blocks), views, full=False)


def encode_blocks(plan: DeliveryPlan) -> tuple[XorBlock, ...]:
    """The master's program: symbol ``i`` = XOR of its sub-points."""
    blocks, start = [], 0
    for terms in plan.symbols:
        n = terms.shape[0]
        blocks.append(XorBlock(np.arange(start, start + n, dtype=np.int64), terms))
        start += n
    return tuple(blocks)


class Encoder:
    """A plan's symbols, encoded on demand in runs of rows (streaming delivery).

    ``rows(first, count)`` returns symbols ``first .. first + count`` as fresh rows; a
    transport can send them while the next run is encoded (the kernel releases the GIL).
    The bytes are those of :func:`encode`; ``seconds`` sums the time spent encoding.
    """

    def __init__(self, plan: DeliveryPlan, data: torch.Tensor) -> None:
        self.subs = _rows_view(
            split_points(data, plan.splits), subpoint_bytes(data.shape[1], plan.splits)
        )
        self.ops = tuple(block_op(b, src_pool=0, dest_pool=1) for b in encode_blocks(plan))
        self.shape = (plan.num_symbols, self.subs.shape[1])
        self.seconds = 0.0

    def rows(self, first: int, count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Symbols ``first .. first + count`` into ``out`` (``(count, sub)`` uint8, C-order;
        e.g. a message's payload) or fresh rows."""
        t0 = time.perf_counter()
        out = empty_rows(count, self.shape[1]) if out is None else out
        if count and self.shape[1]:
            arrays = [self.subs.numpy(), out.numpy()]
            for op in self.ops:  # encode ops write one run of symbols each
                lo = max(first, op.target_start) - op.target_start
                hi = min(first + count, op.target_start + len(op)) - op.target_start
                if hi > lo:
                    _run_op(op, arrays, False, lo, hi, shift=first)
        self.seconds += time.perf_counter() - t0
        return out


def encode(plan: DeliveryPlan, data: torch.Tensor) -> torch.Tensor:
    """All symbols of ``plan`` as a ``(num_symbols, sub_bytes)`` uint8 tensor."""
    encoder = Encoder(plan, data)
    return encoder.rows(0, encoder.shape[0])


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
        out = empty_rows(subpoints.size, self.batch.shape[1])
        for code, src in pools.items():
            sel = np.flatnonzero(pool == code)
            if sel.size:
                _copy_rows(out, sel, src, row[sel])
        return out


def _rows_view(t: torch.Tensor, row_bytes: int) -> torch.Tensor:
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
        _run_op(op, arrays, full, 0, len(op))


_NONE = np.zeros(0, dtype=np.int64)


def _column(op: PoolOp, full: bool, c: int, a: int, b: int) -> tuple[int, np.ndarray]:
    """Rows ``a:b`` of column ``c``: ``(start, no index)`` for a run, else ``(-1, index)``."""
    sources, starts = (op.full_sources, op.full_starts) if full else (op.sources, op.starts)
    if starts[c] >= 0:
        return starts[c] + a, _NONE
    return -1, sources[c][a:b]


def _run_op(
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


class StreamDecoder:
    """One part's decode at a worker, run as its symbols arrive (streaming delivery).

    ``symbols`` is the buffer the kept symbols (``program.symbol_ids``, in that order) arrive
    in; :meth:`advance` is told how many leading rows have arrived and runs every row of the
    program whose symbols are all there
    (:func:`~coded_shuffle.math.index_decoder.arrival_order`), so that decoding overlaps the
    transfer; :meth:`finish` runs the rest. Every decoded row is written once, in place, by
    the same kernel as :func:`decode_workspace`; the bytes are the same. ``seconds`` sums the
    time spent decoding.
    """

    def __init__(self, program: WorkerProgram, symbols: torch.Tensor, cache: torch.Tensor):
        m = program.symbol_ids.size
        if symbols.shape[0] != m:
            raise ValueError(f"{symbols.shape[0]} symbol rows for {m} kept symbols")
        sub = cache.shape[1] if cache.numel() else symbols.shape[1]
        self.program, self.symbols, self.cache = program, symbols, cache
        self.batch = empty_rows(program.batch_rows.size, sub)
        self.scratch = torch.empty((program.num_scratch, sub), dtype=torch.uint8)
        pools = [symbols, cache, self.batch, self.scratch]
        self.arrays = [_rows_view(t, sub).numpy() for t in pools]
        self.staged = arrival_order(program) if sub else ()
        self.ready = -1  # rows with need <= ready have run
        self.seconds = 0.0

    def advance(self, available: int) -> None:
        """Runs every row whose kept symbols ``0 .. available - 1`` have all arrived."""
        if available <= self.ready:
            return
        t0 = time.perf_counter()
        for op, need in self.staged:
            a, b = np.searchsorted(need, [self.ready, available], side="right")
            if b > a:
                _run_op(op, self.arrays, False, int(a), int(b))
        self.ready = available
        self.seconds += time.perf_counter() - t0

    def finish(self) -> Workspace:
        """Runs what is left (every symbol has arrived) and returns the workspace."""
        self.advance(self.program.symbol_ids.size)
        return self.workspace()

    def workspace(self) -> Workspace:
        """The workspace as it stands (rows whose symbols have not all arrived are not final)."""
        return Workspace(self.program, self.cache, self.batch, self.scratch)


class StreamDigest:
    """SHA-256 of a worker's new batch ``(q, B)`` (what :func:`digest` gives for
    :meth:`~coded_shuffle.distributed.delivery.Delivery.batch`), computed while the symbols
    arrive: after every :meth:`update` it hashes the points whose bytes are final in every
    part, in batch order, so that the check reads each decoded row while it is still in cache
    and only the last points are left when the stream ends.

    A batch row is final once its last writer has run (its ``need``,
    :func:`~coded_shuffle.math.index_decoder.arrival_order`); a point once every sub-row of it
    is, in every part; the hash advances over the leading points that are final.
    """

    def __init__(
        self, decoders: list[StreamDecoder], batch: Callable[[list[Workspace], slice], torch.Tensor]
    ) -> None:
        self.decoders, self.batch = decoders, batch  # batch(workspaces, points): those points
        self.points = decoders[0].program.batch_rows.shape[0] if decoders else 0
        self.needs = [_point_need(d) for d in decoders]
        self.hasher = hashlib.sha256()
        self.hashed = 0  # points hashed so far

    def update(self) -> None:
        """Hashes every leading point that is final now."""
        ready = min(
            (int(np.searchsorted(need, d.ready, side="right")) for need, d in
             zip(self.needs, self.decoders, strict=True)),
            default=0,
        )  # fmt: skip
        if ready > self.hashed:
            works = [d.workspace() for d in self.decoders]
            self.hasher.update(self.batch(works, slice(self.hashed, ready)).numpy())
            self.hashed = ready

    def digest(self) -> bytes:
        """The batch's SHA-256; every decoder must have finished."""
        self.update()
        if self.hashed != self.points:
            raise RuntimeError(f"digest of {self.hashed} of {self.points} points: not finished")
        return self.hasher.digest()


def _point_need(decoder: StreamDecoder) -> np.ndarray:
    """Per batch point, the kept symbols that must have arrived before its bytes are final,
    as a running maximum over the points (so that it is sorted: a prefix is final)."""
    program = decoder.program
    rows = np.zeros(program.batch_rows.size, dtype=np.int64)
    for op, need in decoder.staged:  # program order: the last writer of a row comes last
        if op.dest == BATCH:
            rows[op.targets] = need
    points = rows.reshape(program.batch_rows.shape).max(axis=1, initial=0)
    return np.maximum.accumulate(points) if points.size else points


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
    if sub:  # (a zero-byte part of memory sharing has nothing to compute)
        views = [_rows_view(t, sub) for t in (symbols, cache, batch, scratch)]
        run_ops(program.ops, views, full=symbols.shape[0] != m)
    return Workspace(program, cache, batch, scratch)


def batch_from_workspace(
    work: Workspace, program: WorkerProgram, point_bytes: int, points: slice = slice(None)
) -> torch.Tensor:
    """The new batch ``(q, B)`` of a decoded workspace, or its ``points`` (a view)."""
    splits = program.batch_rows.shape[1]
    return join_subpoints(work.batch, splits, point_bytes)[points]


def cache_bytes(data: torch.Tensor, plan: DeliveryPlan, worker: int) -> torch.Tensor:
    """What ``worker`` caches before the delivery, as sub-point rows (test and CLI helper)."""
    subs = split_points(data, plan.splits)
    return gather_rows(subs, plan.caches[worker])


def gather_rows(src: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """``src[rows]`` into a fresh :func:`empty_rows` buffer (the kernel's copy)."""
    out = empty_rows(rows.size, src.shape[1])
    _copy_rows(out, None, src, rows)
    return out


def _copy_rows(
    out: torch.Tensor, targets: np.ndarray | None, src: torch.Tensor, rows: np.ndarray
) -> None:
    """``out[targets] = src[rows]`` (``targets`` None: the rows of ``out`` in order)."""
    if rows.size == 0 or src.shape[1] == 0:
        return
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    t = np.arange(rows.size) if targets is None else np.ascontiguousarray(targets, np.int64)
    dst, s = _rows_view(out, out.shape[1]).numpy(), _rows_view(src, src.shape[1]).numpy()
    kernel.copy_rows(dst, t, s, rows)
