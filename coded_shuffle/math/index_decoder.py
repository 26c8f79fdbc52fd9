"""The generic index decoder over GF(2) (docs/model.md, decoding).

For one worker: cancel what it caches, peel (a symbol with one unknown left yields it), and
fall back to Gaussian elimination over GF(2) on the connected components where peeling
stalls. The result is a :class:`WorkerProgram`: XOR steps over the worker's own workspace
rows, which the byte codec executes. A plan that some worker cannot decode raises
:class:`UndecodableError`; so every plan the project sends is proved decodable first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from coded_shuffle.errors import UndecodableError
from coded_shuffle.math.gf2 import gauss_jordan
from coded_shuffle.math.plan import DeliveryPlan, XorBlock, ranges, subpoints_of

MAX_ELIMINATION_UNKNOWNS = 4096

# Pools of rows that the byte codec reads and writes (see PoolOp).
SYM, CACHE, BATCH, SCRATCH = 0, 1, 2, 3
DENSE_SPAN = 1.5  # a group may write its targets' span when it is at most this many rows each


def distinct(values: np.ndarray, size: int) -> np.ndarray:
    """Sorted distinct ``values`` (all in ``0 .. size - 1``): a mask over ``size`` when the
    values are many (linear, no sort), ``np.unique`` when they are few."""
    if values.size * 64 < size:
        return np.unique(values)
    mask = np.zeros(size, dtype=bool)
    mask[values] = True
    return np.flatnonzero(mask)


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


class PlanIndex:
    """Term structure of a plan, shared by the decoders of all its workers."""

    def __init__(self, plan: DeliveryPlan) -> None:
        self.plan = plan
        self.offsets, self.symbol_of_term, self.terms = plan.symbol_terms()
        self.degrees = np.diff(self.offsets)
        self.num_symbols = self.degrees.size
        self.num_subpoints = plan.num_points * plan.splits
        self.term_order = np.argsort(self.terms, kind="stable")
        counts = np.bincount(self.terms, minlength=self.num_subpoints)
        self.sub_offsets = np.zeros(self.num_subpoints + 1, dtype=np.int64)
        np.cumsum(counts, out=self.sub_offsets[1:])

    def symbols_containing(self, subpoints: np.ndarray) -> np.ndarray:
        """Symbol of every term that names one of ``subpoints`` (with repeats)."""
        starts = self.sub_offsets[subpoints]
        pos = self.term_order[ranges(starts, self.sub_offsets[subpoints + 1] - starts)]
        return self.symbol_of_term[pos]

    def term_matrix(self, symbols: np.ndarray, degree: int) -> np.ndarray:
        """Terms of ``symbols`` (all of the given degree) as an ``(n, degree)`` matrix."""
        return self.terms[self.offsets[symbols][:, None] + np.arange(degree)]


def decode_plan(plan: DeliveryPlan) -> list[WorkerProgram]:
    """Decode programs of all workers; raises :class:`UndecodableError` if one fails."""
    index = PlanIndex(plan)
    return [decode_worker(plan, k, index) for k in range(plan.num_workers)]


def decode_worker(plan: DeliveryPlan, worker: int, index: PlanIndex | None = None) -> WorkerProgram:
    """Peeling + GF(2) elimination for one worker, using only that worker's cache."""
    index = index or PlanIndex(plan)
    state = WorkerDecode(index, plan.caches[worker])
    demands = plan.demands(worker)
    reached = state.reachable(demands)
    ready = reached[state.unknown[reached] == 1]
    while True:
        state.peel(ready)
        missing = demands[~state.known[demands]]
        if missing.size == 0:
            break
        solved = state.eliminate(missing)
        if solved.size == 0:
            raise UndecodableError(
                f"{plan.scheme}: worker {worker} cannot decode {missing.size} of its "
                f"{demands.size} missing sub-points (first: {int(missing[0])})"
            )
        ready = state.after_learning(solved)
    return state.program(plan, worker, demands)


class WorkerDecode:
    """Mutable bookkeeping of one worker's decode: what is known, and the steps taken."""

    def __init__(self, index: PlanIndex, cache: np.ndarray) -> None:
        self.index = index
        self.cache = cache
        self.known = np.zeros(index.num_subpoints, dtype=bool)
        self.known[cache] = True
        # unknown terms per symbol; counted for the symbols reachable from the demands only
        self.unknown = np.zeros(index.num_symbols, dtype=np.int64)
        # steps: (targets, sources) with a symbol s written as -(s + 1) among the sources
        self.steps: list[tuple[np.ndarray, np.ndarray]] = []
        self.eliminated = 0

    def reachable(self, subpoints: np.ndarray) -> np.ndarray:
        """The symbols connected to ``subpoints`` through unknown sub-points (sorted), with
        their unknown terms counted.

        Only these can ever help decode ``subpoints``: peeling the others is wasted work
        (with uncoded symbols it would decode all ``N`` points at every worker).
        """
        ix = self.index
        seen_sub = np.zeros(ix.num_subpoints, dtype=bool)
        seen_sym = np.zeros(ix.num_symbols, dtype=bool)
        frontier = subpoints[~self.known[subpoints]]
        seen_sub[frontier] = True
        found = []
        while frontier.size:
            symbols = ix.symbols_containing(frontier)
            symbols = distinct(symbols[~seen_sym[symbols]], ix.num_symbols)
            seen_sym[symbols] = True
            found.append(symbols)
            terms = ix.terms[ranges(ix.offsets[symbols], ix.degrees[symbols])]
            frontier = distinct(terms[~self.known[terms] & ~seen_sub[terms]], ix.num_subpoints)
            seen_sub[frontier] = True
        reached = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
        pos = ranges(ix.offsets[reached], ix.degrees[reached])
        unknown = ~self.known[ix.terms[pos]]
        self.unknown[reached] = _per_symbol(unknown, ix.degrees[reached])
        return np.sort(reached)

    def peel(self, ready: np.ndarray) -> None:
        """Resolves every symbol with one unknown left, round after round."""
        ix = self.index
        while ready.size:
            pos = ranges(ix.offsets[ready], ix.degrees[ready])
            unknown_pos = pos[~self.known[ix.terms[pos]]]
            targets, first = np.unique(ix.terms[unknown_pos], return_index=True)
            symbols = ready[first]
            for degree in np.unique(ix.degrees[symbols]):
                sel = ix.degrees[symbols] == degree
                sources = ix.term_matrix(symbols[sel], int(degree))
                hit = sources == targets[sel][:, None]
                sources[hit] = -(np.repeat(symbols[sel], hit.sum(axis=1)) + 1)
                self.steps.append((targets[sel], sources))
            ready = self.after_learning(targets)

    def after_learning(self, subpoints: np.ndarray) -> np.ndarray:
        """Marks ``subpoints`` known; returns the symbols left with exactly one unknown."""
        self.known[subpoints] = True
        symbols = self.index.symbols_containing(subpoints)
        np.subtract.at(self.unknown, symbols, 1)
        touched = distinct(symbols, self.index.num_symbols)
        return touched[self.unknown[touched] == 1]

    def eliminate(self, missing: np.ndarray) -> np.ndarray:
        """GF(2) elimination on the stalled components that hold a missing sub-point."""
        ix = self.index
        live = np.flatnonzero(self.unknown >= 2)
        pos = ranges(ix.offsets[live], ix.degrees[live])
        pos = pos[~self.known[ix.terms[pos]]]
        sym, sub = ix.symbol_of_term[pos], ix.terms[pos]
        subs, sub_local = np.unique(sub, return_inverse=True)
        syms, sym_local = np.unique(sym, return_inverse=True)
        n_sub, n_sym = subs.size, syms.size
        graph = coo_matrix(
            (np.ones(sub.size), (sub_local, n_sub + sym_local)), shape=(n_sub + n_sym,) * 2
        )
        _, label = connected_components(graph, directed=False)
        wanted = np.unique(label[np.searchsorted(subs, missing[np.isin(missing, subs)])])
        solved = []
        for comp in wanted:
            comp_subs = np.flatnonzero(label[:n_sub] == comp)
            comp_syms = np.flatnonzero(label[n_sub:] == comp)
            if comp_subs.size > MAX_ELIMINATION_UNKNOWNS:
                raise UndecodableError(
                    f"GF(2) elimination over {comp_subs.size} unknowns exceeds the limit "
                    f"{MAX_ELIMINATION_UNKNOWNS}"
                )
            in_comp = np.isin(sym_local, comp_syms)
            solved.append(
                self._solve_component(
                    syms[comp_syms],
                    subs[comp_subs],
                    np.searchsorted(comp_syms, sym_local[in_comp]),
                    np.searchsorted(comp_subs, sub_local[in_comp]),
                )
            )
        return np.concatenate(solved) if solved else np.zeros(0, dtype=np.int64)

    def _solve_component(
        self, symbols: np.ndarray, subs: np.ndarray, rows: np.ndarray, cols: np.ndarray
    ) -> np.ndarray:
        """One stalled component's unknowns that GF(2) elimination resolves, as steps."""
        a = np.zeros((symbols.size, subs.size), dtype=bool)
        a[rows, cols] = True
        reduced, combo, rank = gauss_jordan(a)
        solved_rows = np.flatnonzero(reduced[:rank].sum(axis=1) == 1)
        targets = []
        for r in solved_rows:
            target = subs[int(np.flatnonzero(reduced[r])[0])]
            used = symbols[combo[r]]
            known_terms = self._known_terms_odd(used)
            sources = np.concatenate([-(used + 1), known_terms])[None, :]
            self.steps.append((np.array([target], dtype=np.int64), sources))
            targets.append(target)
        self.eliminated += len(targets)
        return np.asarray(targets, dtype=np.int64)

    def _known_terms_odd(self, symbols: np.ndarray) -> np.ndarray:
        ix = self.index
        terms = ix.terms[ranges(ix.offsets[symbols], ix.degrees[symbols])]
        terms = terms[self.known[terms]]
        values, counts = np.unique(terms, return_counts=True)
        return values[counts % 2 == 1]

    def program(self, plan: DeliveryPlan, worker: int, demands: np.ndarray) -> WorkerProgram:
        """The steps the demands need, as a program over rows (:func:`steps_program`)."""
        steps = _prune(self.steps, demands, self.index.num_subpoints)
        return steps_program(steps, plan, worker, self.cache, self.index.num_symbols,
                             self.index.num_subpoints, self.eliminated)  # fmt: skip


def steps_program(
    steps: list[tuple[np.ndarray, np.ndarray]],
    plan: DeliveryPlan,
    worker: int,
    cache: np.ndarray,
    num_symbols: int,
    num_subpoints: int,
    eliminated: int,
) -> WorkerProgram:
    """Decode steps (targets, sources; a symbol ``s`` as ``-(s + 1)``) mapped to rows: the
    kept symbols first, then the cache, then every decoded sub-point once."""
    used = [-s[s < 0] - 1 for _, s in steps]
    symbol_ids = distinct(np.concatenate(used), num_symbols) if used else np.zeros(0, np.int64)
    m, n_cache = symbol_ids.size, cache.size
    position = np.zeros(num_symbols, dtype=np.int64)
    position[symbol_ids] = np.arange(m, dtype=np.int64)
    row_of = np.full(num_subpoints, -1, dtype=np.int64)
    row_of[cache] = m + np.arange(n_cache, dtype=np.int64)
    decoded = np.concatenate([t for t, _ in steps]) if steps else np.zeros(0, np.int64)
    row_of[decoded] = m + n_cache + np.arange(decoded.size, dtype=np.int64)
    blocks = []
    for targets, sources in steps:
        mapped = np.where(
            sources < 0,
            position[np.maximum(-sources - 1, 0)],
            row_of[np.maximum(sources, 0)],
        )
        blocks.append(XorBlock(row_of[targets], mapped))
    batch_rows = row_of[subpoints_of(plan.new_batches[worker], plan.splits)]
    if np.any(batch_rows < 0):
        raise UndecodableError(f"{plan.scheme}: worker {worker} lacks part of its new batch")
    return WorkerProgram(
        worker=worker,
        symbol_ids=symbol_ids,
        num_cache=n_cache,
        num_rows=m + n_cache + decoded.size,
        blocks=tuple(blocks),
        batch_rows=batch_rows.reshape(-1, plan.splits),
        cache_ids=cache,
        decoded_ids=decoded,
        eliminated=eliminated,
    )


def _per_symbol(flags: np.ndarray, degrees: np.ndarray) -> np.ndarray:
    """Sums of ``flags`` over consecutive runs of ``degrees`` entries (one run per symbol)."""
    owner = np.repeat(np.arange(degrees.size), degrees)
    return np.bincount(owner, weights=flags, minlength=degrees.size).astype(np.int64)


def _prune(
    steps: list[tuple[np.ndarray, np.ndarray]], demands: np.ndarray, num_subpoints: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Keeps only the steps on which some demanded sub-point depends."""
    needed = np.zeros(num_subpoints, dtype=bool)
    needed[demands] = True
    kept = []
    for targets, sources in reversed(steps):
        keep = needed[targets]
        if not keep.any():
            continue
        targets, sources = targets[keep], sources[keep]
        needed[sources[sources >= 0]] = True
        kept.append((targets, sources))
    return kept[::-1]


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


def arrival_order(program: WorkerProgram) -> tuple[tuple[PoolOp, np.ndarray], ...]:
    """Every op with its rows sorted by ``need``: how many kept symbols (in ``symbol_ids``
    order, the order they arrive in) must be there before the row can be computed.

    A row's need is the largest over its sources (a symbol: its position + 1; a cached row:
    0; a decoded row: that row's need). A row that a later op overwrites (a gap row of the
    densified group) needs 0: it runs first and its value is never read. Running, op by op
    in program order, the rows whose need has been met gives the bytes of the whole program
    (rows of one op are independent: they come from one peeling round).
    """
    need = {BATCH: np.zeros(program.batch_rows.size, np.int64)}
    need[SCRATCH] = np.zeros(program.num_scratch, np.int64)
    final = {BATCH: np.zeros(program.batch_rows.size, bool)}
    final[SCRATCH] = np.zeros(program.num_scratch, bool)
    last = [np.zeros(0, bool)] * len(program.ops)
    for i in range(len(program.ops) - 1, -1, -1):  # the last writer of every row
        op = program.ops[i]
        last[i] = ~final[op.dest][op.targets]
        final[op.dest][op.targets] = True
    out = []
    for i, op in enumerate(program.ops):
        row_need = np.zeros(len(op), np.int64)
        for c, pool in enumerate(op.pools):
            col = op.sources[c]
            if pool == SYM:
                np.maximum(row_need, col + 1, out=row_need)
            elif pool != CACHE:
                np.maximum(row_need, need[pool][col], out=row_need)
        row_need[~last[i]] = 0
        need[op.dest][op.targets] = row_need
        order = np.argsort(row_need, kind="stable")
        if np.array_equal(order, np.arange(len(op))):
            out.append((op, row_need))
            continue
        sources = np.ascontiguousarray(op.sources[:, order])
        targets = op.targets[order]
        starts = tuple(_run_start(col) for col in sources)
        op = replace(
            op,
            targets=targets,
            target_start=_run_start(targets),
            sources=sources,
            starts=starts,
            full_sources=sources,  # streaming reads kept symbols only
            full_starts=starts,
        )
        out.append((op, row_need[order]))
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
