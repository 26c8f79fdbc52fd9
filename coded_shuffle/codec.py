"""The byte codec: executes a delivery plan on a ``torch.uint8`` tensor of points.

The master's data is an ``(N, B)`` tensor, one row per point. With ``splits = s`` every point
is cut into ``s`` sub-points of ``ceil(B / s)`` bytes (zero padding at the end of the point;
the padding travels on the link and is counted). Encoding and decoding are gathers and XORs
over index arrays, in chunks of bounded size, on the widest integer view the row length
allows.
"""

from __future__ import annotations

import numpy as np
import torch

from .decoder import WorkerProgram
from .plan import DeliveryPlan, XorBlock

CHUNK_BYTES = 8 << 20


def subpoint_bytes(point_bytes: int, splits: int) -> int:
    """Bytes of one sub-point: ``ceil(B / s)``."""
    return -(-point_bytes // splits)


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
    return rows.reshape(-1, splits * rows.shape[1])[:, :point_bytes]


def _wide(t: torch.Tensor) -> torch.Tensor:
    """The same bytes viewed as the widest integer type that divides a row."""
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if t.shape[1] % size == 0 and t.is_contiguous():
            return t.view(dtype)
    return t


def run_blocks(blocks: tuple[XorBlock, ...], src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst[targets] = XOR_c src[sources[:, c]]`` for every block, in bounded chunks."""
    src_w, dst_w = _wide(src), _wide(dst)
    chunk = max(1, CHUNK_BYTES // max(1, src.shape[1]))
    for block in blocks:
        targets = torch.from_numpy(np.ascontiguousarray(block.targets))
        sources = torch.from_numpy(np.ascontiguousarray(block.sources.T))
        for a in range(0, len(block), chunk):
            b = min(a + chunk, len(block))
            acc = src_w.index_select(0, sources[0, a:b])
            for c in range(1, sources.shape[0]):
                acc.bitwise_xor_(src_w.index_select(0, sources[c, a:b]))
            dst_w.index_copy_(0, targets[a:b], acc)


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
    out = torch.empty((plan.num_symbols, subs.shape[1]), dtype=torch.uint8)
    run_blocks(encode_blocks(plan), subs, out)
    return out


def decode(
    program: WorkerProgram, symbols: torch.Tensor, cache: torch.Tensor, point_bytes: int
) -> torch.Tensor:
    """The worker's new batch ``(q, B)`` from the received symbols and its own cache rows."""
    work = decode_workspace(program, symbols, cache)
    return batch_from_workspace(work, program, point_bytes)


def decode_workspace(
    program: WorkerProgram, symbols: torch.Tensor, cache: torch.Tensor
) -> torch.Tensor:
    """Runs the worker's program; returns its workspace (symbols, cache, decoded rows).

    ``symbols`` holds the rows ``program.symbol_ids`` of the broadcast (in that order) or the
    whole broadcast; ``cache`` holds the worker's cached sub-points in plan order.
    """
    m = program.symbol_ids.size
    sub = cache.shape[1] if cache.numel() else symbols.shape[1]
    work = torch.empty((program.num_rows, sub), dtype=torch.uint8)
    if symbols.shape[0] == m:
        work[:m] = symbols
    else:
        torch.index_select(symbols, 0, torch.from_numpy(program.symbol_ids), out=work[:m])
    work[m : m + program.num_cache] = cache
    run_blocks(program.blocks, work, work)
    return work


def batch_from_workspace(
    work: torch.Tensor, program: WorkerProgram, point_bytes: int
) -> torch.Tensor:
    """The new batch ``(q, B)`` gathered from a decoded workspace."""
    rows = torch.from_numpy(np.ascontiguousarray(program.batch_rows.reshape(-1)))
    splits = program.batch_rows.shape[1]
    return join_subpoints(work.index_select(0, rows), splits, point_bytes)


def cache_bytes(data: torch.Tensor, plan: DeliveryPlan, worker: int) -> torch.Tensor:
    """What ``worker`` caches before the delivery, as sub-point rows (test and CLI helper)."""
    subs = split_points(data, plan.splits)
    return subs.index_select(0, torch.from_numpy(plan.caches[worker]))
