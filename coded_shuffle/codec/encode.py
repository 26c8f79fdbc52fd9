"""Encoding at the master: a plan's symbols, each the XOR of the sub-points it names, from the
master's records (:class:`~coded_shuffle.codec.records.Records`).

The records are ``(N, B)`` bytes, one row per point. With ``splits = s`` every point is cut
into ``s`` sub-points of ``ceil(B / s)`` bytes (zero padding at the end of the point; the
padding travels on the link and is counted). Records held as one array are read where they
are by the fused kernel (:class:`Encoder`); records held as several columns (an input file and
a label file, memory-mapped) are gathered run by run first (:class:`GatherEncoder`). Both
encode on demand, message by message, while earlier messages travel.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from coded_shuffle.codec.buffers import empty_rows
from coded_shuffle.codec.ops import CHUNK_BYTES, copy_rows, rows_view, run_op, run_ops
from coded_shuffle.codec.records import Records
from coded_shuffle.math.plan import DeliveryPlan, XorBlock, subpoint_bytes
from coded_shuffle.math.worker_program import block_op


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
    the blocks as pool ops (:func:`~coded_shuffle.math.worker_program.block_op`) on
    :func:`run_ops`."""
    if not blocks or src.shape[1] == 0:
        return
    views = [rows_view(t, src.shape[1]) for t in (src, dst)]
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
        self.subs = rows_view(
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
                    run_op(op, arrays, False, lo, hi, shift=first)
        self.seconds += time.perf_counter() - t0
        return out


def encode(plan: DeliveryPlan, data: torch.Tensor) -> torch.Tensor:
    """All symbols of ``plan`` as a ``(num_symbols, sub_bytes)`` uint8 tensor."""
    encoder = Encoder(plan, data)
    return encoder.rows(0, encoder.shape[0])


class GatherEncoder:
    """A plan's symbols over :class:`~coded_shuffle.codec.records.Records` that are not one
    array (columns apart, or read through an index): for every run of symbols, the points
    they XOR are gathered (each once) into a small buffer, cut into sub-points, and XORed
    there by the kernel. The bytes are :func:`encode`'s; memory is bounded by a run.
    ``cols``: the bytes of every record that this plan carries (a part of memory sharing)."""

    def __init__(self, plan: DeliveryPlan, records: Records, cols: slice) -> None:
        width = cols.stop - cols.start
        self.records, self.cols, self.splits = records, cols, plan.splits
        self.blocks = encode_blocks(plan)
        self.firsts = np.array([int(b.targets[0]) if len(b) else 0 for b in self.blocks])
        self.shape = (plan.num_symbols, subpoint_bytes(width, plan.splits))
        self.seconds = 0.0

    def rows(self, first: int, count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Symbols ``first .. first + count`` (see :meth:`Encoder.rows`)."""
        return self.rows_of(np.arange(first, first + count, dtype=np.int64), out)

    def rows_of(self, ids: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """Symbols ``ids`` (sorted) into ``out``'s rows in order, or fresh rows."""
        t0 = time.perf_counter()
        out = empty_rows(ids.size, self.shape[1]) if out is None else out
        s = self.splits
        for block, start in zip(self.blocks, self.firsts, strict=True):
            a, b = np.searchsorted(ids, [start, start + len(block)])
            if b <= a or not self.shape[1]:
                continue
            terms = block.sources[ids[a:b] - start]  # (m, degree) sub-point ids
            points, where = np.unique(terms // s, return_inverse=True)
            rows = torch.from_numpy(self.records.gather(points)[:, self.cols])
            local = where.reshape(terms.shape) * s + terms % s
            run_blocks((XorBlock(np.arange(b - a), local),), split_points(rows, s), out[a:b])
        self.seconds += time.perf_counter() - t0
        return out

    def pick(self, ids: np.ndarray) -> PickedSymbols:
        """The symbols ``ids`` (sorted), in that order, encoded as they are sent."""
        return PickedSymbols(self, np.asarray(ids, dtype=np.int64))


class PickedSymbols:
    """Symbols ``ids`` of a :class:`GatherEncoder` as a row source (a routed transport's
    stream to one worker)."""

    def __init__(self, encoder: GatherEncoder, ids: np.ndarray) -> None:
        self.encoder, self.ids = encoder, ids
        self.shape = (int(ids.size), encoder.shape[1])

    def rows(self, first: int, count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder.rows_of(self.ids[first : first + count], out)

    def pick(self, ids: np.ndarray) -> PickedSymbols:
        return PickedSymbols(self.encoder, self.ids[ids])


def subpoints_of(
    points: torch.Tensor, cols: slice, splits: int, ids: np.ndarray, out: torch.Tensor
) -> torch.Tensor:
    """``out[i]``: sub-point ``ids[i] % splits`` of row ``ids[i] // splits`` of ``points``
    (whole points' bytes ``cols``, cut as :func:`split_points` cuts them), a bounded run of
    rows at a time (no copy of all the points)."""
    width = cols.stop - cols.start
    step = max(1, CHUNK_BYTES // max(width, 1))
    source = points.numpy()
    for a in range(0, ids.size, step):
        run = ids[a : a + step]
        whole = torch.from_numpy(np.ascontiguousarray(source[run // splits, cols]))
        picked = np.arange(run.size, dtype=np.int64) * splits + run % splits
        copy_rows(out[a : a + run.size], None, split_points(whole, splits), picked)
    return out
