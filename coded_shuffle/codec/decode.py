"""Decoding at a worker: its program (:class:`~coded_shuffle.math.worker_program.WorkerProgram`)
run on the symbols it kept and its own cache only, as the symbols arrive.

Decoding reads the received symbols and the worker's cache where they are and writes every
decoded sub-point once, straight into its row of the new batch (the largest group of a
program writes one run of rows, no scatter). Where the rows live is the caller's
:class:`~coded_shuffle.codec.buffers.Buffers`: in memory, or in files (a worker's store). At
256-byte points both directions are bound by random row gathers (two per symbol of degree 2),
not by the XORs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from coded_shuffle.codec.buffers import IN_MEMORY, Buffers, empty_rows
from coded_shuffle.codec.encode import join_subpoints, split_points
from coded_shuffle.codec.ops import copy_rows, gather_rows, rows_view, run_op, run_ops
from coded_shuffle.math.plan import DeliveryPlan
from coded_shuffle.math.worker_program import (
    BATCH,
    CACHE,
    SCRATCH,
    PoolOp,
    WorkerProgram,
    arrival_order,
    first_missing,
    subset,
)

PAST_LOOKS = 16  # looks past a missing symbol in one part's stream, at most


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

    def rows(
        self, subpoints: np.ndarray, buffers: Buffers = IN_MEMORY, slot: str | None = None
    ) -> torch.Tensor:
        """``(n, sub)`` rows of ``subpoints`` (``buffers.empty(.., slot)``, or the batch
        itself when they are its rows in order: :func:`is_batch`); ValueError names one never
        received."""
        subpoints = np.asarray(subpoints, dtype=np.int64)
        pool, row = self.program.locate(subpoints)
        if np.any(pool < 0):
            missing = int(subpoints[pool < 0][0])
            raise ValueError(
                f"worker {self.program.worker} cannot keep sub-point {missing}: never received"
            )
        if _in_order(pool, row, self.batch.shape[0]):
            return self.batch  # no excess storage: the new cache is the new batch
        pools = {CACHE: self.cache, BATCH: self.batch, SCRATCH: self.scratch}
        out = buffers.empty(subpoints.size, self.batch.shape[1], slot)
        for code, src in pools.items():
            sel = np.flatnonzero(pool == code)
            if sel.size:
                copy_rows(out, sel, src, row[sel])
        return out


class StreamDecoder:
    """One part's decode at a worker, run as its symbols arrive (streaming delivery).

    ``symbols`` is the buffer the kept symbols (``program.symbol_ids``, in that order) arrive
    in; :meth:`arrived` is told which rows have arrived (in any order: a lost datagram's
    message may come after the ones behind it) and runs every row of the program whose
    symbols are all there (:func:`~coded_shuffle.math.worker_program.arrival_order`), so that
    decoding overlaps the transfer; :meth:`finish` runs the rest. Every decoded row is
    written once, in place, by the same kernel as :func:`decode_workspace`; the bytes are the
    same. ``ready`` is how many leading symbols have all arrived; ``seconds`` sums the time
    spent decoding.
    """

    def __init__(
        self,
        program: WorkerProgram,
        symbols: torch.Tensor,
        cache: torch.Tensor,
        buffers: Buffers = IN_MEMORY,
        batch_slot: str | None = None,
    ) -> None:
        """``buffers``: where the batch (as ``batch_slot``) and the scratch rows go."""
        m = program.symbol_ids.size
        if symbols.shape[0] != m:
            raise ValueError(f"{symbols.shape[0]} symbol rows for {m} kept symbols")
        sub = cache.shape[1] if cache.numel() else symbols.shape[1]
        self.program, self.symbols, self.cache = program, symbols, cache
        self.batch = buffers.empty(program.batch_rows.size, sub, batch_slot)
        self.scratch = buffers.empty(program.num_scratch, sub)
        pools = [symbols, cache, self.batch, self.scratch]
        self.arrays = [rows_view(t, sub).numpy() for t in pools]
        self.staged = arrival_order(program) if sub else ()
        self.have = np.zeros(m, dtype=bool)
        self.ran: list[np.ndarray | None] = [None] * len(self.staged)  # rows run past a gap
        self.waiting = 0  # symbols arrived past a gap since the last look past it
        self.ready = -1  # rows with need <= ready have run
        self.seconds = 0.0

    def arrived(self, lo: int, hi: int) -> None:
        """Kept symbols ``lo .. hi - 1`` have arrived: runs every row whose symbols all have."""
        t0 = time.perf_counter()
        self.have[lo:hi] = True
        start = max(self.ready, 0)
        if lo <= start:  # the leading run grows: what it completes is behind the new end
            self._run_prefix(first_missing(self.have, start))
        elif hi > lo:  # past a missing symbol: what these complete lies past it too
            self.waiting += hi - lo
            if self.waiting * PAST_LOOKS >= self.have.size:
                self.waiting = 0
                self._run_past(start)
        self.seconds += time.perf_counter() - t0

    def _run_prefix(self, ready: int) -> None:
        """Every row with ``self.ready < need <= ready`` not run yet."""
        for i, st in enumerate(self.staged):
            a, b = np.searchsorted(st.need, [self.ready, ready], side="right")
            if b <= a:
                continue
            ran = self.ran[i]
            if ran is None:
                run_op(st.op, self.arrays, False, int(a), int(b))
            else:
                self._run_rows(st.op, a + np.flatnonzero(~ran[a:b]))
        self.ready = ready

    def _run_past(self, ready: int) -> None:
        """Every row past the first missing symbol (``ready``) whose symbols have arrived (a
        look reads every symbol and row: taken once :data:`PAST_LOOKS` of the symbols have
        arrived past a gap since the last, so that a part's stream takes at most that many)."""
        counts = np.concatenate([[0], np.cumsum(self.have)])  # arrived before each position
        for i, st in enumerate(self.staged):
            a = int(np.searchsorted(st.need, ready, side="right"))
            if a == len(st.op):
                continue
            ran = self.ran[i]
            if ran is None:
                ran = self.ran[i] = np.zeros(len(st.op), dtype=bool)
            low, need = st.low[a:], st.need[a:]
            held = counts[need] - counts[low] == need - low  # every symbol low .. need - 1
            rows = a + np.flatnonzero(held & ~ran[a:])
            self._run_rows(st.op, rows)
            ran[rows] = True

    def _run_rows(self, op: PoolOp, rows: np.ndarray) -> None:
        if rows.size == len(op):
            run_op(op, self.arrays, False, 0, len(op))
        elif rows.size and rows[-1] - rows[0] == rows.size - 1:
            run_op(op, self.arrays, False, int(rows[0]), int(rows[-1]) + 1)
        elif rows.size:
            run_op(subset(op, rows), self.arrays, False, 0, rows.size)

    def finish(self) -> Workspace:
        """Runs what is left (every symbol has arrived) and returns the workspace."""
        self.arrived(0, self.program.symbol_ids.size)
        return self.workspace()

    def workspace(self) -> Workspace:
        """The workspace as it stands (rows whose symbols have not all arrived are not final)."""
        return Workspace(self.program, self.cache, self.batch, self.scratch)


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
        views = [rows_view(t, sub) for t in (symbols, cache, batch, scratch)]
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


def is_batch(program: WorkerProgram, subpoints: np.ndarray) -> bool:
    """Whether ``subpoints`` are exactly the program's new batch rows, in order (the worker's
    next cache without excess storage): its store is then the batch itself."""
    pool, row = program.locate(np.asarray(subpoints, dtype=np.int64))
    return _in_order(pool, row, program.batch_rows.size)


def _in_order(pool: np.ndarray, row: np.ndarray, batch_rows: int) -> bool:
    return bool(
        row.size == batch_rows
        and np.all(pool == BATCH)
        and np.array_equal(row, np.arange(batch_rows))
    )
