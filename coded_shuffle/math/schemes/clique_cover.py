"""Coding across permutations: demanded sub-points grouped by type and covered by cliques
whose amounts a linear program chooses (a fractional clique cover of index coding).

A delivery for any placement in which every demanded sub-point is wanted by one worker (its
new processor) and known by a set of other workers. Sub-points with the same demander ``d``
and the same other holders ``H`` form a *type* ``(d, H)``; the count of a type does not
depend on how the shuffle splits into permutations, so covering types codes across them.
Types ``u, v`` know each other when the demander of each holds the other's sub-points; a
*clique* of such types is served by one XOR of one sub-point per member (the coded-caching
multicast of Elmahdy & Mohajer 2018, Section III), which every member's
demander decodes with its cache.

The amounts per maximal clique minimise the symbols that cover every type's count (an LP,
HiGHS); they are rounded down and what is left is covered greedily (the clique with the most
types left first), then one symbol per sub-point. Every step is deterministic: master and
workers derive the same plan. E-M adds its own permutation codes to the same LP
(:func:`~.elmahdy_mohajer.permutations_and_cliques`). Directed 3-cycles as a second code were
tried: on the random shuffles of ``scripts/excess_split.py`` they never lowered the LP, so
they are not used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csc_matrix, csr_matrix, hstack, identity

from coded_shuffle.math.assignment import batches
from coded_shuffle.math.plan import subpoints_of
from coded_shuffle.math.schemes.memory_sharing import grouped_blocks
from coded_shuffle.math.state import CacheState

MAX_WORKERS = 12  # the cover is tried up to this K (above it the types run into thousands)
MAX_TYPES = 1000  # ... and up to this many types
MAX_CLIQUES = 50_000  # ... nor above this many maximal cliques
LP_ROUNDS = 4  # LPs solved on what rounding down left, before the greedy cover


@dataclass(frozen=True)
class DemandTypes:
    """Demanded sub-points (``ids``), their types (``kind``), each type's demander and holders."""

    ids: np.ndarray  # (n,) demanded sub-point ids, grouped by type
    kind: np.ndarray  # (n,) the type of each
    demander: np.ndarray  # (types,) the worker that wants the type
    others: np.ndarray  # (types,) bit mask of the other workers that hold it

    @property
    def counts(self) -> np.ndarray:
        return np.bincount(self.kind, minlength=self.demander.size)

    def without(self, served: np.ndarray) -> DemandTypes:
        """The same types without the sub-points in ``served`` (sent by another code)."""
        keep = ~np.isin(self.ids, served)
        return DemandTypes(self.ids[keep], self.kind[keep], self.demander, self.others)


@dataclass(frozen=True)
class CoverProblem:
    """The demand types of one transition, their maximal cliques and the membership matrix."""

    types: DemandTypes
    groups: list[tuple[int, ...]]
    member: csr_matrix | None  # None when there is no clique


def cover_problem(state: CacheState, new_assignment: np.ndarray) -> CoverProblem | None:
    """The clique cover's problem, or ``None`` when the workers, types or cliques are too many
    to try (:data:`MAX_WORKERS`, :data:`MAX_TYPES`, :data:`MAX_CLIQUES`)."""
    if state.num_workers > MAX_WORKERS:
        return None
    types = demand_types(state, new_assignment)
    if types.demander.size > MAX_TYPES:
        return None
    groups = cliques(side_information(types)) if types.demander.size else []
    if len(groups) > MAX_CLIQUES:
        return None
    member = membership(groups, types.demander.size) if groups else None
    return CoverProblem(types, groups, member)


def demand_types(state: CacheState, new_assignment: np.ndarray) -> DemandTypes:
    """Every sub-point a worker needs and does not hold, grouped by ``(demander, holders)``."""
    k = state.num_workers
    holders = np.zeros(state.num_points * state.splits, dtype=np.int64)
    for w in range(k):
        holders[state.caches[w]] |= np.int64(1) << w
    ids, who = [], []
    for w, batch in enumerate(batches(new_assignment, k)):
        wanted = subpoints_of(batch, state.splits)
        wanted = wanted[((holders[wanted] >> w) & 1) == 0]
        ids.append(wanted)
        who.append(np.full(wanted.size, w, dtype=np.int64))
    ids, who = np.concatenate(ids), np.concatenate(who)
    keys = who * (np.int64(1) << k) + holders[ids]
    uniq, kind = np.unique(keys, return_inverse=True)
    order = np.argsort(kind, kind="stable")
    return DemandTypes(ids[order], kind[order], uniq >> k, uniq & ((np.int64(1) << k) - 1))


def side_information(types: DemandTypes) -> np.ndarray:
    """``knows[u, v]``: the demander of type ``u`` holds the sub-points of type ``v``."""
    knows = ((types.others[None, :] >> types.demander[:, None]) & 1).astype(bool)
    np.fill_diagonal(knows, False)
    return knows


def cliques(knows: np.ndarray) -> list[tuple[int, ...]]:
    """Maximal sets of types that know each other pairwise (size >= 2), in a fixed order."""
    import networkx as nx  # 0.1 s to load: only where cliques are searched

    mutual = nx.Graph()
    mutual.add_nodes_from(range(knows.shape[0]))
    mutual.add_edges_from(zip(*np.nonzero(np.triu(knows & knows.T)), strict=True))
    found = [tuple(sorted(int(v) for v in c)) for c in nx.find_cliques(mutual) if len(c) >= 2]
    return sorted(found, key=lambda c: (-len(c), c))


def membership(groups: list[tuple[int, ...]], num_types: int) -> csr_matrix:
    """``(cliques, types)`` 0/1: which types each clique contains."""
    cols = np.concatenate([np.asarray(g, dtype=np.int64) for g in groups])
    rows = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    return csr_matrix((np.ones(cols.size), (rows, cols)), shape=(len(groups), num_types))


def lp_amounts(counts: np.ndarray, member: csr_matrix) -> np.ndarray:
    """Symbols per clique: the fractional clique cover's (:func:`_lp`: fewest symbols that
    cover every type's count, single sub-points allowed), rounded down."""
    amounts = _lp(counts, member)
    if amounts is None:
        return np.zeros(member.shape[0], dtype=np.int64)
    return np.floor(amounts[: member.shape[0]] + 1e-9).astype(np.int64)


def fractional_cover_points(state: CacheState, new_assignment: np.ndarray) -> float | None:
    """The LP's optimum in points: the fewest symbols any mix of clique XORs (and single
    sub-points) can reach with sub-points cut as finely as needed (``None``: not tried)."""
    problem = cover_problem(state, new_assignment)
    if problem is None:
        return None
    counts = problem.types.counts
    if problem.member is None:
        return float(counts.sum()) / state.splits
    amounts = _lp(counts, problem.member)
    return None if amounts is None else float(amounts.sum()) / state.splits


def _lp(counts: np.ndarray, member: csr_matrix) -> np.ndarray | None:
    """The fractional clique cover's amounts (cliques, then single sub-points), or ``None``."""
    cover = cover_columns(member, counts.size)
    return cover_lp(counts, cover, np.ones(cover.shape[1]))


def cover_columns(member: csr_matrix, num_types: int, *more: csc_matrix) -> csc_matrix:
    """``(types, codes)``: the cliques' columns, one column per type (a single sub-point), then
    ``more`` codes' columns (each a code's sub-points of every type per use); one symbol per
    use of a clique or a single sub-point."""
    return hstack([member.T, identity(num_types), *more]).tocsc()


def cover_lp(counts: np.ndarray, cover: csc_matrix, costs: np.ndarray) -> np.ndarray | None:
    """Amounts of the codes (columns of ``cover``: sub-points of each type a use serves) of
    least total cost that serve every type's count; ``None`` if HiGHS fails."""
    solved = cover_lp_with_prices(counts, cover, costs)
    return None if solved is None else solved[0]


def cover_lp_with_prices(
    counts: np.ndarray, cover: csc_matrix, costs: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`cover_lp`'s amounts and the optimal price of one sub-point of each type.

    HiGHS solves the dual (a price per type, at most each code's cost; faster here), whose
    constraint marginals are the amounts at a vertex.
    """
    # scipy.optimize loads in 0.2 s: only where a solver runs (the command starts faster)
    from scipy.optimize import linprog

    res = linprog(
        -counts.astype(float),
        A_ub=cover.T.tocsr(),
        b_ub=costs,
        bounds=(0, None),
        method="highs-ds",
    )
    return (-res.ineqlin.marginals, res.x) if res.status == 0 else None


def greedy_amounts(left: np.ndarray, member: csr_matrix) -> np.ndarray:
    """Greedy cover of what is ``left``: the clique with the most types left (first in order
    on ties), as often as its least one allows, until no clique has two types left."""
    left = left.copy()
    amounts = np.zeros(member.shape[0], dtype=np.int64)
    while True:
        gain = member @ (left > 0).astype(float)
        best = int(np.argmax(gain))
        if gain.size == 0 or gain[best] < 2:
            return amounts
        types = member.indices[member.indptr[best] : member.indptr[best + 1]]
        types = types[left[types] > 0]
        amount = int(left[types].min())
        amounts[best] += amount
        left[types] -= amount


class _Pools:
    """The demanded sub-points of every type not yet in a symbol."""

    def __init__(self, types: DemandTypes) -> None:
        self.ids = types.ids
        bounds = np.concatenate([[0], np.cumsum(types.counts)])
        self.next, self.end = bounds[:-1].copy(), bounds[1:]

    def left(self, members) -> np.ndarray:
        return self.end[list(members)] - self.next[list(members)]

    def take(self, member: int, amount: int) -> np.ndarray:
        start = self.next[member]
        self.next[member] = start + amount
        return self.ids[start : start + amount]


def _clique_rows(pools: _Pools, group: tuple[int, ...], amount: int) -> np.ndarray:
    """``amount`` XORs of one sub-point per member (members run dry are left out)."""
    rows = np.full((amount, len(group)), -1, dtype=np.int64)
    for j, (member, left) in enumerate(zip(group, pools.left(group), strict=True)):
        got = pools.take(member, int(min(amount, left)))
        rows[: got.size, j] = got
    return rows[(rows >= 0).sum(axis=1) > 0]


def cover_rows(types: DemandTypes, problem: CoverProblem) -> list[np.ndarray]:
    """The clique cover of ``types`` (the problem's types, or fewer of their sub-points)."""
    counts = types.counts
    if problem.member is None:
        return [types.ids[:, None]] if types.ids.size else []
    member = problem.member
    amounts = np.zeros(member.shape[0], dtype=np.int64)
    for _ in range(LP_ROUNDS):  # the LP again on what rounding down left
        more = lp_amounts(counts - covered(amounts, member, counts), member)
        if not more.any():
            break
        amounts += more
    amounts += greedy_amounts(counts - covered(amounts, member, counts), member)
    pools = _Pools(types)
    rows = [
        _clique_rows(pools, g, int(a)) for g, a in zip(problem.groups, amounts, strict=True) if a
    ]
    rest = [pools.take(m, int(pools.left([m])[0])) for m in range(counts.size)]
    rows.append(np.concatenate(rest)[:, None])
    return [r for r in rows if r.size]


def covered(amounts: np.ndarray, member: csr_matrix, counts: np.ndarray) -> np.ndarray:
    """Sub-points of every type that the clique amounts serve (at most its count)."""
    return np.minimum(member.T @ amounts, counts).astype(np.int64)


def cover_blocks(problem: CoverProblem) -> tuple:
    """The clique cover of the problem's demands, one dense block per degree."""
    return grouped_blocks(cover_rows(problem.types, problem))


def clique_cover_blocks(state: CacheState, new_assignment: np.ndarray) -> tuple | None:
    """:func:`cover_blocks` of this transition, or ``None`` when the cover is not tried
    (:func:`cover_problem`)."""
    problem = cover_problem(state, new_assignment)
    return None if problem is None else cover_blocks(problem)


def lower_with_clique_cover(
    problem: CoverProblem | None, blocks: tuple, breakdown: dict, key: str
) -> tuple[tuple, dict]:
    """``(blocks, breakdown)`` of the scheme's own delivery or of the clique cover of
    ``problem`` (breakdown ``key (clique cover)``), whichever has fewer symbols: never worse
    than the scheme."""
    if problem is None:
        return blocks, breakdown
    across = cover_blocks(problem)
    count = sum(b.shape[0] for b in across)
    if count >= sum(b.shape[0] for b in blocks):
        return blocks, breakdown
    return across, {f"{key} (clique cover)": int(count)}
