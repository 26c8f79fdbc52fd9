"""A worker's decoding program (:class:`WorkerProgram`, what the index decoder proves), and
its executable form: :class:`PoolOp` gather-XORs over four pools of rows that the byte codec
runs, in program order or as symbols arrive (:func:`arrival_order`), and the encoder's
program (:func:`block_op`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from coded_shuffle.math.plan import XorBlock

# Pools of rows that the byte codec reads and writes (see PoolOp).
SYM, CACHE, BATCH, SCRATCH = 0, 1, 2, 3
DENSE_SPAN = 1.5  # a group may write its targets' span when it is at most this many rows each


@dataclass(frozen=True)
class PoolOp:
    """``pool[dest][targets[i]] = XOR_c pool[pools[c]][sources[c, i]]`` for every ``i``.

    The executable form of one :class:`XorBlock` group: every column reads one pool, the
    rows are sorted by target. ``SYM`` rows are positions in ``symbol_ids``;
    ``full_sources`` is the same with ``SYM`` rows as broadcast symbol ids. ``*starts[c]``
    (and ``target_start``) is the first row when that column is one ascending run, else -1:
    the codec then reads (writes) a slice instead of gathering (scattering).
    """

    dest: int
    targets: np.ndarray  # (n,) int64
    target_start: int
    pools: tuple[int, ...]
    sources: np.ndarray  # (d, n) int64, C-contiguous
    starts: tuple[int, ...]
    full_sources: np.ndarray
    full_starts: tuple[int, ...]

    def __len__(self) -> int:
        return int(self.targets.shape[0])


@dataclass(frozen=True)
class WorkerProgram:
    """How one worker rebuilds its new batch from received symbols and its own cache.

    Virtual rows (those of ``blocks``): ``[0, m)`` the kept symbols ``symbol_ids`` (in that
    order), then ``num_cache`` rows of the worker's cache (in ``plan.caches[worker]`` order),
    then the decoded sub-points. ``batch_rows[i, j]`` is the row of sub-point ``j`` of the
    ``i``-th point of the new batch. The codec executes ``ops`` instead: the same XORs over
    four pools, so that decoded sub-points land straight in their place in the new batch
    (``BATCH`` rows, in ``batch_rows`` order) or, if only needed on the way, in ``SCRATCH``;
    the first op copies the cached part of the new batch.
    """

    worker: int
    symbol_ids: np.ndarray
    num_cache: int
    num_rows: int
    blocks: tuple[XorBlock, ...]
    batch_rows: np.ndarray
    cache_ids: np.ndarray  # sub-points in the cache rows (sorted)
    decoded_ids: np.ndarray  # sub-points in the decoded rows, in row order
    eliminated: int  # sub-points that needed GF(2) elimination (0: peeling sufficed)

    @cached_property
    def _compiled(self) -> tuple[tuple[PoolOp, ...], int]:
        return _compile(self)

    @property
    def ops(self) -> tuple[PoolOp, ...]:
        """The executable program (compiled on first use: the master, which proves every
        worker's program, never needs the others' ops)."""
        return self._compiled[0]

    @property
    def num_scratch(self) -> int:
        """Decoded sub-points outside the new batch (rows of the ``SCRATCH`` pool)."""
        return self._compiled[1]

    @property
    def num_decoded(self) -> int:
        return int(self.decoded_ids.size)

    def locate(self, subpoints: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pool, row)`` of every sub-point after the ops ran (pool -1: not held).

        Sub-points of the new batch are found in ``BATCH``, other cached ones in ``CACHE``,
        other decoded ones in ``SCRATCH``.
        """
        return _locate(self, self.rows_of(np.asarray(subpoints, dtype=np.int64)), True)

    def rows_of(self, subpoints: np.ndarray) -> np.ndarray:
        """Workspace rows of cached or decoded ``subpoints``; -1 where the worker lacks one."""
        m = self.symbol_ids.size
        rows = np.full(subpoints.size, -1, dtype=np.int64)
        pos = np.searchsorted(self.cache_ids, subpoints)
        pos = np.minimum(pos, max(self.cache_ids.size - 1, 0))
        hit = self.cache_ids.size > 0
        in_cache = hit & (self.cache_ids[pos] == subpoints) if hit else np.zeros_like(rows, bool)
        rows[in_cache] = m + pos[in_cache]
        order = np.argsort(self.decoded_ids, kind="stable")
        sorted_ids = self.decoded_ids[order]
        dpos = np.minimum(np.searchsorted(sorted_ids, subpoints), max(sorted_ids.size - 1, 0))
        if sorted_ids.size:
            in_dec = ~in_cache & (sorted_ids[dpos] == subpoints)
            rows[in_dec] = m + self.num_cache + order[dpos[in_dec]]
        return rows


def _row_maps(program: WorkerProgram, prefer_batch: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(pool, row)`` of every virtual row; decoded rows go to ``BATCH`` or ``SCRATCH``.

    With ``prefer_batch``, cache rows of sub-points in the new batch map to ``BATCH`` too.
    """
    m, c, total = program.symbol_ids.size, program.num_cache, program.num_rows
    rows = np.arange(total, dtype=np.int64)
    batch_pos = np.full(total, -1, dtype=np.int64)
    batch = program.batch_rows.reshape(-1)
    batch_pos[batch] = np.arange(batch.size, dtype=np.int64)
    pool = np.where(rows < m, SYM, np.where(rows < m + c, CACHE, SCRATCH))
    row = np.where(rows < m, rows, rows - m)
    outside = (pool == SCRATCH) & (batch_pos < 0)
    row[outside] = np.arange(np.count_nonzero(outside), dtype=np.int64)
    to_batch = ((pool == SCRATCH) | (prefer_batch & (pool == CACHE))) & (batch_pos >= 0)
    pool[to_batch], row[to_batch] = BATCH, batch_pos[to_batch]
    return pool, row


def _locate(
    program: WorkerProgram, rows: np.ndarray, prefer_batch: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Virtual rows as ``(pool, row)`` (see :func:`_row_maps`); row -1 maps to ``(-1, -1)``."""
    pool_of, row_of = _row_maps(program, prefer_batch)
    pool, row = pool_of[np.maximum(rows, 0)], row_of[np.maximum(rows, 0)]
    pool[rows < 0], row[rows < 0] = -1, -1
    return pool, row


def _run_start(rows: np.ndarray) -> int:
    """The first row when ``rows`` is one ascending run of consecutive rows, else -1."""
    n = rows.size
    if n and rows[-1] - rows[0] == n - 1 and np.all(np.diff(rows) == 1):
        return int(rows[0])
    return -1


def _pool_op(
    program: WorkerProgram, dest: int, targets: np.ndarray, pools: np.ndarray, sources: np.ndarray
) -> PoolOp:
    """One group of rows with the same pools: sorted by target, sources column-major."""
    if np.any(targets[1:] < targets[:-1]):
        order = np.argsort(targets, kind="stable")
        targets, sources = targets[order], sources[order]
    sources = np.ascontiguousarray(sources.T)
    full = sources.copy()
    for c, p in enumerate(pools):
        if p == SYM:
            full[c] = program.symbol_ids[sources[c]]
    return PoolOp(
        dest=int(dest),
        targets=targets,
        target_start=_run_start(targets),
        pools=tuple(int(p) for p in pools),
        sources=sources,
        starts=tuple(_run_start(col) for col in sources),
        full_sources=full,
        full_starts=tuple(_run_start(col) for col in full),
    )


@dataclass(frozen=True)
class Staged:
    """One op of :func:`arrival_order`: its rows sorted by ``need``, and for each row the
    kept symbols ``low .. need - 1`` (in ``symbol_ids`` order) that hold every symbol it reads,
    directly or through decoded rows (``low == need == 0``: it reads none)."""

    op: PoolOp
    need: np.ndarray
    low: np.ndarray


def subset(op: PoolOp, rows: np.ndarray) -> PoolOp:
    """The rows ``rows`` of ``op``, in that order (kept symbols only: streaming reads them)."""
    sources = np.ascontiguousarray(op.sources[:, rows])
    targets = op.targets[rows]
    starts = tuple(_run_start(col) for col in sources)
    return replace(
        op,
        targets=targets,
        target_start=_run_start(targets),
        sources=sources,
        starts=starts,
        full_sources=sources,
        full_starts=starts,
    )


def first_missing(have: np.ndarray, start: int, step: int = 4096) -> int:
    """The first position from ``start`` on that ``have`` (what has arrived: symbols, a
    stream's datagrams) does not hold yet, ``have.size`` if none; looked for ``step`` positions
    at a time, so a long run already held is not read whole at every call."""
    n = have.size
    while start < n:
        window = have[start : start + step]
        at = int(window.argmin())
        if not window[at]:
            return start + at
        start += window.size
    return n


def arrival_order(program: WorkerProgram) -> tuple[Staged, ...]:
    """Every op with its rows sorted by ``need``: how many kept symbols (in ``symbol_ids``
    order, the order they arrive in) must be there before the row can be computed.

    A row's need is the largest over its sources (a symbol: its position + 1; a cached row:
    0; a decoded row: that row's need), its ``low`` the smallest symbol position over them
    (so that a row whose symbols have arrived past a missing one runs before that one comes).
    A row that a later op overwrites (a gap row of the densified group) needs 0: it runs first
    and its value is never read. Running, op by op in program order, the rows whose symbols
    have arrived gives the bytes of the whole program (rows of one op are independent: they
    come from one peeling round).
    """
    m = program.symbol_ids.size
    sizes = {BATCH: program.batch_rows.size, SCRATCH: program.num_scratch}
    need = {pool: np.zeros(n, np.int64) for pool, n in sizes.items()}
    low = {pool: np.full(n, m, np.int64) for pool, n in sizes.items()}
    final = {pool: np.zeros(n, bool) for pool, n in sizes.items()}
    last = [np.zeros(0, bool)] * len(program.ops)
    for i in range(len(program.ops) - 1, -1, -1):  # the last writer of every row
        op = program.ops[i]
        last[i] = ~final[op.dest][op.targets]
        final[op.dest][op.targets] = True
    out = []
    for i, op in enumerate(program.ops):
        row_need = np.zeros(len(op), np.int64)
        row_low = np.full(len(op), m, np.int64)
        for c, pool in enumerate(op.pools):
            col = op.sources[c]
            if pool == SYM:
                np.maximum(row_need, col + 1, out=row_need)
                np.minimum(row_low, col, out=row_low)
            elif pool != CACHE:
                np.maximum(row_need, need[pool][col], out=row_need)
                np.minimum(row_low, low[pool][col], out=row_low)
        row_need[~last[i]], row_low[~last[i]] = 0, m
        need[op.dest][op.targets], low[op.dest][op.targets] = row_need, row_low
        order = np.argsort(row_need, kind="stable")
        if not np.array_equal(order, np.arange(len(op))):
            op, row_need, row_low = subset(op, order), row_need[order], row_low[order]
        out.append(Staged(op, row_need, np.minimum(row_low, row_need)))
    return tuple(out)


def block_op(block: XorBlock, src_pool: int, dest_pool: int) -> PoolOp:
    """An :class:`XorBlock` whose sources all lie in one pool, as a pool op (the encoder's
    program: sub-points in, symbols out)."""
    targets, sources = block.targets, block.sources
    if np.any(targets[1:] < targets[:-1]):
        order = np.argsort(targets, kind="stable")
        targets, sources = targets[order], sources[order]
    cols = np.ascontiguousarray(np.asarray(sources, dtype=np.int64).T)
    starts = tuple(_run_start(col) for col in cols)
    return PoolOp(
        dest=dest_pool,
        targets=np.ascontiguousarray(targets, dtype=np.int64),
        target_start=_run_start(targets),
        pools=(src_pool,) * cols.shape[0],
        sources=cols,
        starts=starts,
        full_sources=cols,
        full_starts=starts,
    )


Group = tuple[int, np.ndarray, np.ndarray, np.ndarray]  # dest, targets, pools, sources (n, d)


def _groups(program: WorkerProgram, pool_of: np.ndarray, row_of: np.ndarray) -> list[Group]:
    """Every block split by pool pattern; the cached part of the new batch comes last."""
    m, c = program.symbol_ids.size, program.num_cache
    groups: list[Group] = []
    for block in program.blocks:
        dest, targets = pool_of[block.targets], row_of[block.targets]
        pools, rows = pool_of[block.sources], row_of[block.sources]
        if np.any(pools[:, 1:] < pools[:, :-1]):  # XOR commutes: canonical column order
            order = np.argsort(pools, axis=1, kind="stable")
            pools, rows = np.take_along_axis(pools, order, 1), np.take_along_axis(rows, order, 1)
        pattern = np.concatenate([dest[:, None], pools], axis=1)
        if pattern.shape[1] <= 31:  # base-4 digits fit in int64
            key = pattern @ (4 ** np.arange(pattern.shape[1], dtype=np.int64))
        else:
            key = np.unique(pattern, axis=0, return_inverse=True)[1].reshape(-1)
        keys = np.unique(key)
        for k in keys:
            sel = np.flatnonzero(key == k) if keys.size > 1 else np.arange(key.size)
            groups.append((int(dest[sel[0]]), targets[sel], pools[sel[0]], rows[sel]))
    batch = program.batch_rows.reshape(-1)
    cached = np.flatnonzero((batch >= m) & (batch < m + c))
    if cached.size:  # the cached part of the new batch: BATCH rows <- CACHE rows
        groups.append((BATCH, cached, np.array([CACHE]), batch[cached, None] - m))
    return groups


def _densified(groups: list[Group]) -> list[Group]:
    """Lets the largest independent group into the new batch write one run of rows.

    A group that reads only symbols and cache can run first. Written as one run (its
    targets' whole span, gaps computed from a neighbour's sources), it needs no scatter;
    every gap row is a batch row that a later group overwrites with its true value, and no
    group reads a batch row before its own writer ran. Only worth it when gaps are few.
    """
    free = [
        i
        for i, (dest, _, pools, _) in enumerate(groups)
        if dest == BATCH and np.all((pools == SYM) | (pools == CACHE))
    ]
    if not free:
        return groups
    best = max(free, key=lambda i: groups[i][1].size)
    dest, targets, pools, rows = groups[best]
    order = np.argsort(targets, kind="stable")
    targets, rows = targets[order], rows[order]
    span = np.arange(targets[0], targets[-1] + 1, dtype=np.int64)
    if span.size > DENSE_SPAN * targets.size:
        return groups
    padded = rows[np.searchsorted(targets, span)]
    return [(dest, span, pools, padded), *groups[:best], *groups[best + 1 :]]


def _compile(program: WorkerProgram) -> tuple[tuple[PoolOp, ...], int]:
    """``program.blocks`` as :class:`PoolOp` groups (one per pool pattern), and the number
    of scratch rows."""
    pool_of, row_of = _row_maps(program, prefer_batch=False)
    groups = _densified(_groups(program, pool_of, row_of))
    ops = tuple(_pool_op(program, *group) for group in groups)
    m, c = program.symbol_ids.size, program.num_cache
    return ops, int(np.count_nonzero(pool_of[m + c :] == SCRATCH))
