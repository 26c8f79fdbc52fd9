"""The generic index decoder over GF(2) (docs/model.md, decoding).

For one worker: cancel what it caches, peel (a symbol with one unknown left yields it), and
fall back to Gaussian elimination over GF(2) on the connected components where peeling
stalls. The result is a :class:`WorkerProgram`: XOR steps over the worker's own workspace
rows, which the byte codec executes. A plan that some worker cannot decode raises
:class:`UndecodableError`; so every plan the project sends is proved decodable first.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from coded_shuffle.errors import UndecodableError
from coded_shuffle.math.gf2 import gauss_jordan
from coded_shuffle.math.plan import DeliveryPlan, XorBlock, ranges, subpoints_of
from coded_shuffle.math.worker_program import WorkerProgram

MAX_ELIMINATION_UNKNOWNS = 4096


def distinct(values: np.ndarray, size: int) -> np.ndarray:
    """Sorted distinct ``values`` (all in ``0 .. size - 1``): a mask over ``size`` when the
    values are many (linear, no sort), ``np.unique`` when they are few."""
    if values.size * 64 < size:
        return np.unique(values)
    mask = np.zeros(size, dtype=bool)
    mask[values] = True
    return np.flatnonzero(mask)


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


def peer_routes(
    plan: DeliveryPlan, known: dict[int, np.ndarray] | None = None
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """Routes of a plan whose symbols carry their senders (:attr:`DeliveryPlan.senders`): per
    worker, the symbols its decoder keeps (a triple's ``A`` learnt on the way, docs/
    decentralized.md section 2b; the sums of a path between a receiver's row and the row it
    knows, section 2d), and the worker that sends each. ``known``: the workers' kept symbols
    already decoded (by worker); only the others are decoded here. Returns ``(needs,
    senders)`` (sorted symbol ids; 0-based workers)."""
    known = known or {}
    who = np.concatenate(plan.senders) if plan.senders else np.zeros(0, dtype=np.int64)
    index = PlanIndex(plan) if len(known) < plan.num_workers else None
    needs = tuple(
        known[k] if k in known else decode_worker(plan, k, index).symbol_ids
        for k in range(plan.num_workers)
    )
    return needs, tuple(who[n] for n in needs)


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
        return steps_program(
            steps,
            plan,
            worker,
            self.cache,
            self.index.num_symbols,
            self.index.num_subpoints,
            self.eliminated,
        )


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
