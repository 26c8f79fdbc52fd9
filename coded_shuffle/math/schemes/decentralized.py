"""Decentralized coded shuffling: the workers code for each other (Wan, Tuninetti, Ji, Caire,
Piantanida, "Fundamental Limits of Decentralized Data Shuffling", IEEE Trans. IT 2020; the
construction and its proofs: docs/decentralized.md).

Corner ``m`` (storage ``T = m`` batches, ``m`` in ``1..K``): every point is cut into
``C(K-1, m-1)`` *pieces*, one per ``m``-subset ``H`` of the workers that contains the point's
owner (its *holders*), and, for ``1 < m < K``, every piece into ``m`` *sub-pieces*. Worker
``k`` stores the pieces whose holders contain it: its batch whole and ``(m-1)/(K-1)`` of every
other point, ``m q`` points in all (section 1 of the docs).

Delivery (section 2): a point moving from ``j`` to ``k`` leaves ``k`` without the pieces whose
``H`` misses ``k``; each such piece belongs to the group ``J = H + k`` of ``m + 1`` workers, in
which every other member holds it. A group whose members need ``d_u`` pieces each sends
``max(sum d, m max d)`` sub-pieces' worth of symbols, shared out among its members as senders:
sender ``s`` XORs, per symbol, one sub-piece needed by each other member, all of which it holds
(eq. (1) of the docs; optimal for the group on its own). Every symbol carries its sender.
At ``m = 2`` (from ``K = 6``) what a group would send uncoded goes into triples across two
senders instead, three pieces for two symbols (section 2b, :mod:`.peer_alignment`); at
``3 <= m <= K - 2`` a group keeps what it codes at a gain of ``m - 1`` or more and deals the
rest to cliques of ``m`` workers across groups where that costs fewer symbols (section 2c,
:mod:`.peer_cliques`); at ``m = K - 2``, where those are every single-sender code, the best
split between the two is an integer program where the greedy ones, paths and all, are above
the converse (section 2e). At every corner, symbols whose receivers each know another one
whole go as a path of sums from a worker that stores them all, one symbol fewer a path (section
2d, :mod:`.peer_paths`).

Update (section 3): the new owner keeps the point whole; a piece whose holders missed it is
now held by ``H - j + k`` (the old owner drops it); nothing is sent, and every worker again
stores ``m q`` points.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import combinations
from math import comb

import numpy as np

from coded_shuffle.math.assignment import shuffle_matrix
from coded_shuffle.math.plan import DeliveryPlan, held_at
from coded_shuffle.math.rate_memory import decentralized_converse
from coded_shuffle.math.schemes import peer_alignment as alignment
from coded_shuffle.math.schemes import peer_cliques as cliques
from coded_shuffle.math.schemes import peer_paths as paths
from coded_shuffle.math.schemes.base import batch_plan_fields
from coded_shuffle.math.schemes.memory_sharing import CornerScheme
from coded_shuffle.math.state import CacheState

MAX_WORKERS = 16  # C(K-1, m-1) pieces per point: 6,435 at K = 16, m = 8


@dataclass(frozen=True)
class PeerLabels:
    """Corner ``m``'s placement: ``holders[p, i]`` = bitmask of the workers holding piece ``i``
    of point ``p`` (an ``m``-subset containing the point's owner)."""

    m: int
    holders: np.ndarray  # (N, C(K-1, m-1)) int64


def aligned(num_workers: int, m: int) -> bool:
    """Whether corner ``m`` aligns lone pieces across senders (section 2b: ``m = 2``)."""
    return m == 2 and num_workers >= alignment.MIN_WORKERS


def cliqued(num_workers: int, m: int) -> bool:
    """Whether corner ``m`` may deal groups' excess to cliques across groups (section 2c)."""
    return cliques.MIN_CORNER <= m <= num_workers - 2


def sub_pieces(num_workers: int, m: int) -> int:
    """Sub-pieces per piece: ``m`` where groups code (``1 < m < K``), else 1; ``2 m`` at
    ``m = 3`` where cliques of two receivers code (section 2c: each set pays ``ceil(sum /
    2)``, and halves keep every sum even)."""
    if cliqued(num_workers, m) and m == cliques.MIN_CORNER:
        return m * (m - 1)
    return m if 1 < m < num_workers else 1


def corner_splits(num_workers: int, m: int) -> int:
    """Sub-points per point at corner ``m``: ``C(K-1, m-1)`` pieces of ``sub_pieces``."""
    return comb(num_workers - 1, m - 1) * sub_pieces(num_workers, m)


def holder_table(num_workers: int, m: int) -> np.ndarray:
    """``(K, C(K-1, m-1))``: row ``j`` = the ``m``-subsets containing ``j`` (combinations order
    of the other ``m - 1``), as bitmasks."""
    rows = []
    for j in range(num_workers):
        others = [w for w in range(num_workers) if w != j]
        rows.append([(1 << j) | sum(1 << w for w in c) for c in combinations(others, m - 1)])
    return np.array(rows, dtype=np.int64)


def peer_state(assignment: np.ndarray, holders: np.ndarray, num_workers: int, m: int) -> CacheState:
    """Worker ``k`` caches every sub-piece of every piece whose holders contain ``k``."""
    r = sub_pieces(num_workers, m)
    caches = []
    for k in range(num_workers):
        pieces = np.flatnonzero((holders >> k) & 1).astype(np.int64)
        caches.append((pieces[:, None] * r + np.arange(r, dtype=np.int64)).reshape(-1))
    return CacheState(
        assignment=np.asarray(assignment, dtype=np.int64),
        num_workers=num_workers,
        splits=holders.shape[1] * r,
        caches=tuple(caches),
        labels=PeerLabels(m, holders),
    )


def peer_initial_state(assignment: np.ndarray, num_workers: int, m: int) -> CacheState:
    """Section 1: piece ``i`` of a point owned by ``j`` is held by the ``i``-th ``m``-subset
    containing ``j``."""
    assignment = np.asarray(assignment, dtype=np.int64)
    holders = holder_table(num_workers, m)[assignment]
    return peer_state(assignment, holders, num_workers, m)


def peer_next_state(state: CacheState, new_assignment: np.ndarray) -> CacheState:
    """Section 3: a moved point's pieces that the new owner lacked pass from the old owner to
    it (``H - j + k``); the others keep their holders. No message."""
    labels: PeerLabels = state.labels
    new = np.asarray(new_assignment, dtype=np.int64)
    old = state.assignment
    holders = labels.holders.copy()
    moved = np.flatnonzero(old != new)
    h = holders[moved]
    lacked = ((h >> new[moved, None]) & 1) == 0
    swap = (np.int64(1) << old[moved, None]) | (np.int64(1) << new[moved, None])
    holders[moved] = np.where(lacked, h ^ swap, h)
    return peer_state(new, holders, state.num_workers, labels.m)


def group_shares(needs: np.ndarray, m: int, r: int) -> np.ndarray:
    """Sub-pieces each member sends in a group whose members need ``needs`` pieces of ``r``
    sub-pieces (eq. (1)).

    With ``r = m`` the group sends ``S = max(sum d, m max d)`` sub-pieces' worth: member
    ``u``'s ``m d_u`` sub-pieces must be covered by the others' shares, so ``L_u <= S - m
    d_u``, and the shares sum to ``S``; filled greedily in member order (at ``m = 1``, ``r =
    1``: each member sends what the other needs)."""
    return cliques.clique_shares(np.asarray(needs, dtype=np.int64) * r, m)


def demanded_pieces(state: CacheState, new: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(group mask, receiver, piece id)`` of every piece a worker lacks, sorted by group,
    receiver and piece (section 2)."""
    labels: PeerLabels = state.labels
    c = labels.holders.shape[1]
    moved = np.flatnonzero(state.assignment != new)
    h = labels.holders[moved]
    receiver = np.repeat(new[moved], c).reshape(-1, c)
    lacked = ((h >> receiver) & 1) == 0
    groups = (h | (np.int64(1) << receiver))[lacked]
    receivers = receiver[lacked]
    ids = (moved[:, None] * c + np.arange(c, dtype=np.int64))[lacked]
    order = np.lexsort((ids, receivers, groups))
    return groups[order], receivers[order], ids[order]


def peer_plan(state: CacheState, new_assignment: np.ndarray, scheme: str) -> DeliveryPlan:
    """Section 2: every group's symbols, each with the member that sends it; at ``m = 2`` the
    lone pieces' triples (section 2b), at ``3 <= m <= K - 2`` the groups' excess in cliques
    where they cost fewer symbols (section 2c); then the closed form's paths (section 2d)."""
    labels: PeerLabels = state.labels
    k, m = state.num_workers, labels.m
    r = sub_pieces(k, m)
    new = np.asarray(new_assignment, dtype=np.int64)
    groups, receivers, ids = demanded_pieces(state, new)
    rows: list[tuple[int, np.ndarray]] = []
    lone: dict[tuple[int, int, int], list[np.ndarray]] = {}
    excess: dict[cliques.Bucket, np.ndarray] = {}
    costs = group_costs(shuffle_matrix(state.assignment, new, k), m)
    deals = costs.cliques_pay
    dealt = {(b.group, b.receiver, b.owner): b for b in costs.buckets} if deals else {}
    owners = state.assignment[ids // labels.holders.shape[1]]
    cuts = np.flatnonzero(np.diff(groups)) + 1
    starts = np.r_[0, cuts] if groups.size else cuts  # no group at all: nothing to send
    splits = zip(*(np.split(a, cuts) for a in (receivers, ids, owners)), strict=True)
    for mask, (g_rcv, g_ids, g_own) in zip(groups[starts], splits, strict=False):
        members = cliques.bits(int(mask))
        pieces = [g_ids[g_rcv == w] for w in members]
        mine = [g_own[g_rcv == w] for w in members]
        if aligned(k, m):
            pieces = set_lone_apart(members, pieces, mine, lone)
        if deals:
            subs = set_excess_apart(int(mask), members, pieces, mine, excess, dealt, r)
        else:
            subs = [cliques.sub_ids(p, r) for p in pieces]
        at = sending_order(members, costs.orders)
        rows.extend(cliques.clique_symbols([members[i] for i in at], [subs[i] for i in at]))
    breakdown = {f"m={m}": int(sum(r.shape[0] for _, r in rows))}
    if lone:
        aligned_rows = lone_rows(lone, k)
        rows.extend(aligned_rows)
        for name, width in (("aligned", 2), ("lone uncoded", 1)):
            breakdown[name] = int(sum(r.shape[0] for _, r in aligned_rows if r.shape[1] == width))
    if excess:
        buckets = sorted(excess)
        assert tuple(buckets) == costs.buckets, "the plan's excess must be the closed form's"
        dealt_rows = cliques.clique_rows(buckets, [excess[b] for b in buckets], costs.deal)
        rows.extend(dealt_rows)
        breakdown["cliques"] = int(sum(r.shape[0] for _, r in dealt_rows))
    rows = with_paths(rows, labels, new, r, costs)
    if costs.paths:
        breakdown["saved by paths"] = paths.saved(costs.paths)
    symbols, senders = sender_blocks(rows)
    return DeliveryPlan(
        scheme=scheme,
        symbols=symbols,
        senders=senders,
        breakdown=breakdown,
        **batch_plan_fields(state, new),
    )


def padded(rows: list[tuple[int, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """``-1``-padded rows as one matrix, and the sender of each."""
    width = max((r.shape[1] for _, r in rows), default=1)
    counts = [r.shape[0] for _, r in rows]
    terms = np.full((sum(counts), width), -1, dtype=np.int64)
    start = 0
    for _, r in rows:
        terms[start : start + r.shape[0], : r.shape[1]] = r
        start += r.shape[0]
    return terms, np.repeat(np.array([s for s, _ in rows], dtype=np.int64), counts)


def symbol_types(terms: np.ndarray, labels: PeerLabels, new: np.ndarray, r: int) -> np.ndarray:
    """Receivers' and knowers' masks of every row (section 2d)."""
    piece = np.maximum(terms, 0).reshape(-1) // r
    c = labels.holders.shape[1]
    receiver = np.int64(1) << new[piece // c]
    return paths.row_types(terms, receiver, labels.holders.reshape(-1)[piece])


def with_paths(
    rows: list[tuple[int, np.ndarray]],
    labels: PeerLabels,
    new: np.ndarray,
    r: int,
    costs: GroupCosts,
) -> list[tuple[int, np.ndarray]]:
    """The rows with the closed form's paths across them (section 2d), which the rows' own
    types must match."""
    if not costs.paths:
        return rows
    terms, who = padded(rows)
    types = symbol_types(terms, labels, new, r)
    assert paths.pathable(type_counts(types)) == paths.pathable(costs.types), (
        "the plan's symbol types must be the closed form's"
    )
    summed, used = paths.path_rows(terms, types, list(costs.paths))
    kept = [(int(w), terms[(who == w) & ~used]) for w in np.unique(who[~used])]
    return [(s, x) for s, x in kept if x.shape[0]] + summed


def type_counts(types: np.ndarray) -> dict[paths.SymbolType, int]:
    """How many rows of each type."""
    keys, counts = np.unique(types, axis=0, return_counts=True)
    return {
        paths.SymbolType(int(a), int(b)): int(n) for (a, b), n in zip(keys, counts, strict=True)
    }


def owner_counts(members: list[int], owners: list[np.ndarray]) -> np.ndarray:
    """``counts[u, o]``: member ``u``'s pieces of member ``o``'s points."""
    return np.array([[int(np.count_nonzero(own == o)) for o in members] for own in owners])


def set_apart(
    pieces: list[np.ndarray], owners: list[np.ndarray], members: list[int], taken: np.ndarray
) -> tuple[list[np.ndarray], list[tuple[int, int, np.ndarray]]]:
    """The members' pieces less ``taken[u, o]`` of member ``o``'s points (the first by id), and
    ``(u, o, ids)`` of those set apart."""
    rest, apart = [], []
    for u, (ids, own) in enumerate(zip(pieces, owners, strict=True)):
        keep = np.ones(ids.size, dtype=bool)
        for o in np.flatnonzero(taken[u]):
            first = np.flatnonzero(own == members[o])[: int(taken[u, o])]
            keep[first] = False
            apart.append((u, int(o), ids[first]))
        rest.append(ids[keep])
    return rest, apart


def set_excess_apart(
    group: int,
    members: list[int],
    pieces: list[np.ndarray],
    owners: list[np.ndarray],
    excess: dict[cliques.Bucket, np.ndarray],
    dealt: dict[tuple[int, int, int], cliques.Bucket],
    r: int,
) -> list[np.ndarray]:
    """A group's sub-pieces less its excess (section 2c: what it does not code itself), which
    goes to ``excess``: as many of each receiver's sub-pieces of each owner's points as the
    closed form's bucket holds (``dealt``, by group, receiver and owner), the first by id."""
    rest = []
    for receiver, ids, own in zip(members, pieces, owners, strict=True):
        subs, sub_owners = cliques.sub_ids(ids, r), np.repeat(own, r)
        keep = np.ones(subs.size, dtype=bool)
        for owner in members:
            bucket = dealt.get((group, receiver, owner))
            if bucket is not None:
                first = np.flatnonzero(sub_owners == owner)[: bucket.units]
                assert first.size == bucket.units, "a bucket's sub-pieces must be the group's"
                keep[first] = False
                excess[bucket] = subs[first]
        rest.append(subs[keep])
    return rest


def set_lone_apart(
    members: list[int],
    pieces: list[np.ndarray],
    owners: list[np.ndarray],
    lone: dict[tuple[int, int, int], list[np.ndarray]],
) -> list[np.ndarray]:
    """A 3-group's pieces less its lone ones (section 2b: the excess of a member that needs
    more than the other two together), which go to ``lone[(owner, receiver, partner)]``."""
    needs = np.array([p.size for p in pieces], dtype=np.int64)
    u, taken = alignment.excess(needs, owner_counts(members, owners))
    if u < 0:
        return pieces
    matrix = np.zeros((3, 3), dtype=np.int64)
    matrix[u] = taken
    rest, apart = set_apart(pieces, owners, members, matrix)
    for _, o, ids in apart:
        lone.setdefault((members[o], members[u], members[3 - u - o]), []).append(ids)
    return rest


def lone_rows(lone: dict[tuple[int, int, int], list[np.ndarray]], k: int) -> list:
    """The lone pieces' symbols: triples across senders, the rest uncoded (section 2b)."""
    pieces = {key: np.sort(np.concatenate(parts)) for key, parts in lone.items()}
    counts = np.zeros((k, k, k), dtype=np.int64)
    for (o, n, z), ids in pieces.items():
        counts[o, n, z] = ids.size
    return alignment.triple_rows(alignment.match_triples(counts), pieces)


def sender_blocks(rows: list[tuple[int, np.ndarray]]) -> tuple[tuple, tuple]:
    """``-1``-padded rows with their senders -> one dense block per sender and degree, in
    sender order (so every worker's symbols, sorted by id, come sender by sender: a receiver
    decodes each sender's rows as its stream ends), and per block the sender of every
    symbol."""
    if not rows:
        return (), ()
    terms, who = padded(rows)
    valid = terms >= 0
    degree = valid.sum(axis=1)
    blocks, senders = [], []
    for w in np.unique(who):
        for d in np.unique(degree[(who == w) & (degree > 0)]):
            sel = (who == w) & (degree == d)
            blocks.append(np.ascontiguousarray(terms[sel][valid[sel]].reshape(-1, int(d))))
            senders.append(who[sel])
    return tuple(blocks), tuple(senders)


def group_moves(moves: np.ndarray, m: int) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """Per group ``J`` of ``m + 1`` workers, the points moving between its members (``sub[o,
    u]``: from ``o`` to ``u``), from the shuffle matrix alone (the placement's invariant fixes
    every point's holder sets): member ``u`` needs one piece of each point that moves to it
    from another member, held by the group's other members."""
    k = moves.shape[0]
    out = []
    for members in combinations(range(k), m + 1):
        idx = np.array(members)
        sub = moves[np.ix_(idx, idx)].copy()
        np.fill_diagonal(sub, 0)
        out.append((members, sub))
    return out


def excess_buckets(
    group: int, members: tuple[int, ...], by_owner: np.ndarray, excess: np.ndarray
) -> list[cliques.Bucket]:
    """A group's excess (section 2c) by receiver and owner, in sub-pieces (``by_owner``,
    ``excess``: in sub-pieces too)."""
    taken = cliques.taken_by_owner(excess, by_owner)
    return [
        cliques.Bucket(group, members[u], members[o], int(taken[u, o]))
        for u, o in np.argwhere(taken > 0)
    ]


Orders = tuple[tuple[int, ...], ...]  # groups' members in the order they send (section 2f)


@dataclass(frozen=True)
class GroupCosts:
    """Symbols (sub-pieces' worth) of a delivery at corner ``m``: ``plain`` = eq. (1) summed
    over the groups (section 2) with, at ``m = 2``, the lone pieces' triples (section 2b);
    where corner ``m`` deals cliques (section 2c), ``dealt`` = the groups' kept pieces plus
    the cliques' symbols, with the excess ``buckets`` (sorted) and their ``deal``; ``types``:
    the chosen delivery's symbols by type, and the ``paths`` across them (section 2d);
    ``orders``: groups whose members send in another order than by number (section 2f)."""

    plain: int
    dealt: int | None = None
    buckets: tuple[cliques.Bucket, ...] = ()
    deal: cliques.Deal | None = None
    orders: Orders = ()
    types: dict[paths.SymbolType, int] = field(default_factory=dict)
    paths: tuple[paths.Path, ...] = ()

    @property
    def cliques_pay(self) -> bool:
        return self.dealt is not None and self.dealt < self.plain

    @property
    def symbols(self) -> int:
        return (self.dealt if self.cliques_pay else self.plain) - paths.saved(self.paths)


def group_costs(moves: np.ndarray, m: int) -> GroupCosts:
    """:class:`GroupCosts` for shuffle matrix ``moves``, from the counts alone (remembered
    for the last few matrices: a plan and its closed form ask for the same one)."""
    return _group_costs(*_matrix_key(moves), m)


def _matrix_key(moves: np.ndarray) -> tuple[bytes, int]:
    """A shuffle matrix as the remembered counts key it: its bytes and ``K``."""
    matrix = np.ascontiguousarray(moves, dtype=np.int64)
    return matrix.tobytes(), matrix.shape[0]


@dataclass(frozen=True)
class Unpathed:
    """A delivery's counts before paths (section 2d): its :class:`GroupCosts` without types
    and paths, and what their types are counted from (each group's needs, the triples)."""

    costs: GroupCosts
    plain_needs: list[tuple[tuple[int, ...], np.ndarray]]
    kept_needs: list[tuple[tuple[int, ...], np.ndarray]]
    triples: alignment.Triples | None
    groups: GroupNeeds  # each group's members, the moves among them and their needs
    target: float  # the converse in sub-pieces (section 2e asks for more only above it)


@lru_cache(maxsize=16)
def _unpathed(moves_bytes: bytes, k: int, m: int) -> Unpathed:
    moves = np.frombuffer(moves_bytes, dtype=np.int64).reshape(k, k)
    r = sub_pieces(k, m)
    plain = 0
    lone = np.zeros((k, k, k), dtype=np.int64)
    plain_needs, groups = [], []
    for members, sub in group_moves(moves, m):
        needs = sub.sum(axis=0)
        if aligned(k, m):
            u, taken = alignment.excess(needs, sub.T)
            for o in np.flatnonzero(taken):
                lone[members[o], members[u], members[3 - u - o]] += taken[o]
                needs[u] -= taken[o]
        plain += int(group_shares(needs, m, r).sum())
        plain_needs.append((members, needs * r))
        groups.append((members, sub, needs))
    triples = alignment.match_triples(lone) if aligned(k, m) else None
    if triples is not None:
        plain += triples.symbols  # r = 2: the triples' halves
    target = float(decentralized_converse(k, int(moves.sum()), m)) * corner_splits(k, m)
    if not cliqued(k, m) or (m == k - 2 and plain <= target + 1e-9):  # section 2e: only above
        return Unpathed(GroupCosts(plain), plain_needs, [], triples, groups, target)
    rules = KEEP_RULES if m == k - 2 else KEEP_RULES[:1]
    tries = [kept_and_dealt(groups, m, r, rule) for rule in rules]
    symbols, kept_needs, buckets, deal = min(tries, key=lambda x: x[0])
    costs = GroupCosts(plain, symbols, buckets, deal)
    return Unpathed(costs, plain_needs, kept_needs, triples, groups, target)


KEEP_RULES = ("gain", "cap")  # what a group keeps before its excess is dealt (cliques.kept)
Dealt = tuple[int, list, tuple[cliques.Bucket, ...], cliques.Deal]
GroupNeeds = list[tuple[tuple[int, ...], np.ndarray, np.ndarray]]  # members, moves, needs


def kept_and_dealt(groups: GroupNeeds, m: int, r: int, rule: str) -> Dealt:
    """Section 2c with keep rule ``rule`` (``gain`` keeps whole pieces, ``cap`` sub-pieces):
    the symbols of the groups' kept pieces and the greedy deal of the rest, the kept needs,
    the excess buckets (sorted) and the deal."""
    kept, kept_needs, buckets = 0, [], []
    for members, sub, needs in groups:
        units = needs * r
        keep = cliques.kept(needs, m, rule) * r if rule == "gain" else cliques.kept(units, m, rule)
        kept += int(cliques.clique_shares(keep, m).sum())
        kept_needs.append((members, keep))
        group = sum(1 << w for w in members)
        buckets.extend(excess_buckets(group, members, sub.T * r, units - keep))
    ordered = tuple(sorted(buckets))
    dealt = cliques.deal(list(ordered), m)
    return kept + dealt.symbols, kept_needs, ordered, dealt


def best_split_dealt(groups: GroupNeeds, m: int, r: int, tilt: int = 0) -> Dealt | None:
    """Section 2c as :func:`~.peer_cliques.best_split` solves it (None where it is too large
    to ask; ``tilt``: its tie-break among the fewest symbols): the kept needs, and every
    demand's excess in buckets by owner (the lower-numbered owners first), each bucket's
    shares of the demand's in set order."""
    demands, rows = [], []
    for members, sub, needs in groups:
        group = sum(1 << w for w in members)
        for u in np.flatnonzero(needs):
            demands.append((group, members[u], int(needs[u]) * r))
            rows.append((members, sub.T[u] * r))
    split = cliques.best_split(demands, m, tilt) if demands else None
    if split is None:
        return None
    kept_needs, kept = [], 0
    at = 0
    for members, _, needs in groups:
        keep = np.zeros(len(members), dtype=np.int64)
        for u in np.flatnonzero(needs):
            keep[u] = split.keep[at]
            at += 1
        kept += int(cliques.clique_shares(keep, m).sum())
        kept_needs.append((members, keep))
    shares: dict[cliques.Bucket, list[tuple[int, int]]] = {}
    for (group, receiver, units), keep, (members, by_owner), dealt in zip(
        demands, split.keep, rows, split.shares, strict=True
    ):
        taken = cliques.taken_by_owner(np.array([units - keep]), by_owner[None, :])[0]
        owned = [(members[o], int(t)) for o, t in enumerate(taken) if t]
        shares.update(owner_shares(group, receiver, owned, dealt))
    ordered = tuple(sorted(shares))
    deal = cliques.counted_deal(ordered, [shares[b] for b in ordered], m)
    return kept + deal.symbols, kept_needs, ordered, deal


def owner_shares(
    group: int, receiver: int, owned: list[tuple[int, int]], dealt: list[tuple[int, int]]
) -> dict[cliques.Bucket, list[tuple[int, int]]]:
    """A demand's excess by owner (``owned``: ``(owner, sub-pieces)``), each owner's bucket
    taking the demand's shares ``dealt`` (``(V, sub-pieces)``) in turn."""
    out: dict[cliques.Bucket, list[tuple[int, int]]] = {}
    queue = [list(x) for x in dealt]
    for owner, units in owned:
        bucket, left = cliques.Bucket(group, receiver, owner, units), units
        while left:
            v, n = queue[0]
            take = min(n, left)
            out.setdefault(bucket, []).append((v, take))
            left -= take
            queue[0][1] -= take
            if queue[0][1] == 0:
                queue.pop(0)
    return out


SPLIT_TILTS = 64  # the program's splits tried after its first, for their paths (section 2e) ...
TILTED_PAIRS = 4096  # ... fewer where the program is larger: at most this many pairs in all


@lru_cache(maxsize=16)
def _group_costs(moves_bytes: bytes, k: int, m: int) -> GroupCosts:
    found = _unpathed(moves_bytes, k, m)
    options = [found.costs]
    if found.costs.cliques_pay and m == k - 2:  # the groups alone may save more by paths
        options.append(GroupCosts(found.costs.plain))
    best = min((with_path_counts(costs, found) for costs in options), key=lambda c: c.symbols)
    if m != k - 2 or not cliqued(k, m) or best.symbols <= found.target + 1e-9:
        return best
    best = reordered(best, options, found)
    if best.symbols <= found.target + 1e-9:
        return best
    pairs = m * sum(int(np.count_nonzero(needs)) for _, _, needs in found.groups)
    for tilt in range(min(SPLIT_TILTS, TILTED_PAIRS // max(pairs, 1)) + 1):
        other = tilted_split(found, k, m, tilt)
        if other is not None and other.symbols < best.symbols:
            best = other
        if best.symbols <= found.target + 1e-9:
            break
    return best


ORDER_TRIES = 32  # the groups' senders in other orders, for their paths (section 2f)


def reordered(best: GroupCosts, options: list[GroupCosts], found: Unpathed) -> GroupCosts:
    """Section 2f: ``options`` with every demanding group's members sending in the order drawn
    from seed ``1, 2, ...`` (eq. (1) holds in any order), with their paths (section 2d): the
    first at or below the converse, else the fewest symbols of ``best`` and those tried."""
    members = [g for g, _, needs in found.groups if needs.any()]
    for trial in range(1, ORDER_TRIES + 1):
        rng = np.random.default_rng(trial)
        orders = tuple(tuple(int(w) for w in rng.permutation(g)) for g in members)
        for costs in options:
            other = with_path_counts(replace(costs, orders=orders), found)
            if other.symbols < best.symbols:
                best = other
            if best.symbols <= found.target + 1e-9:
                return best
    return best


def sending_order(members: list[int] | tuple[int, ...], orders: Orders) -> list[int]:
    """The positions of a group's ``members`` in the order they send (section 2f): as
    ``orders`` lists that group, else as numbered."""
    for order in orders:
        if sorted(order) == sorted(members):
            return [list(members).index(w) for w in order]
    return list(range(len(members)))


def tilted_split(found: Unpathed, k: int, m: int, tilt: int) -> GroupCosts | None:
    """Section 2e's program (``tilt`` from 1: tie-broken by it), with its paths (section 2d):
    a split of the fewest symbols before paths, another for each ``tilt``, which may save more
    by them (None where the program is not asked or the split is not below the groups alone)."""
    split = best_split_dealt(found.groups, m, sub_pieces(k, m), tilt)
    if split is None:
        return None
    symbols, kept_needs, buckets, deal = split
    costs = GroupCosts(found.costs.plain, symbols, buckets, deal)
    if not costs.cliques_pay:
        return None
    return with_path_counts(costs, replace(found, costs=costs, kept_needs=kept_needs))


def with_path_counts(costs: GroupCosts, found: Unpathed) -> GroupCosts:
    """``costs`` with its symbols' types and the paths across them (section 2d)."""
    needs = found.kept_needs if costs.cliques_pay else found.plain_needs
    types = group_types(needs, costs.orders)
    if costs.cliques_pay:
        assert costs.deal is not None
        types.update(dealt_types(costs.buckets, costs.deal))
    if found.triples is not None:
        types.update(triple_types(found.triples))
    return replace(costs, types=dict(types), paths=tuple(paths.find_paths(types)))


def group_types(needs: list[tuple[tuple[int, ...], np.ndarray]], orders: Orders = ()) -> Counter:
    """The groups' symbols by type (section 2d): member ``u`` of ``J`` needs sub-pieces held
    by ``J - u``; the members send in ``orders``' order where it lists the group (2f)."""
    out: Counter = Counter()
    for members, slots in needs:
        mask = sum(1 << w for w in members)
        at = sending_order(members, orders)
        senders = [members[i] for i in at]
        segments = [[(int(slots[i]), mask & ~(1 << members[i]))] for i in at]
        out.update(paths.clique_type_counts(senders, segments))
    return out


def dealt_types(buckets: tuple[cliques.Bucket, ...], dealt: cliques.Deal) -> Counter:
    """The cliques' symbols by type (sections 2c, 2d): in set ``V``, a bucket's pieces are
    held by its group less its receiver, in bucket order."""
    segments: dict[int, dict[int, list[tuple[int, int]]]] = {}
    for bucket, shares in zip(buckets, dealt.shares, strict=True):
        holders = bucket.group & ~(1 << bucket.receiver)
        for v, count in shares:
            segments.setdefault(v, {}).setdefault(bucket.receiver, []).append((count, holders))
    out: Counter = Counter()
    for v in sorted(segments):
        members = cliques.bits(v)
        out.update(paths.clique_type_counts(members, [segments[v].get(w, []) for w in members]))
    return out


def triple_types(triples: alignment.Triples) -> Counter:
    """The lone pieces' symbols by type (sections 2b, 2d): ``x``'s ``A + B`` serves ``r`` and
    ``y``; ``j``'s ``A + C`` serves ``r`` twice (kept out of paths); a leftover piece serves
    its receiver from its two holders."""
    out: Counter = Counter()
    half = alignment.SUB_PIECES
    for (_, r, x, y), t in zip(triples.types, triples.counts, strict=True):
        out[paths.SymbolType((1 << r) | (1 << y), 1 << x)] += half * t
        out[paths.SymbolType(1 << r, 0)] += half * t
    for o, n, z in np.argwhere(triples.left > 0).tolist():
        out[paths.SymbolType(1 << n, (1 << o) | (1 << z))] += half * int(triples.left[o, n, z])
    return out


def decentralized_load(moves: np.ndarray, m: int) -> float:
    """The delivery's load in points for shuffle matrix ``moves`` at corner ``m``: the fewer
    symbols of :func:`group_costs`' two less what the paths save, in sub-pieces of ``1/(r
    C(K-1, m-1))`` point."""
    k = moves.shape[0]
    if m >= k:
        return 0.0
    return group_costs(moves, m).symbols / corner_splits(k, m)


def load_before_paths(moves: np.ndarray, m: int) -> float:
    """:func:`decentralized_load` before the paths save (section 2d), an upper bound on it,
    found without counting the symbols' types (a third of the time at ``K = 16``)."""
    k = moves.shape[0]
    if m >= k:
        return 0.0
    return _unpathed(*_matrix_key(moves), m).costs.symbols / corner_splits(k, m)


def sender_holds(plan: DeliveryPlan) -> bool:
    """Every symbol's sender stores every sub-point the symbol XORs (a decentralized plan is
    sent from the workers' own storage)."""
    for block, who in zip(plan.symbols, plan.senders, strict=True):
        for w in np.unique(who):
            if held_at(plan.caches[int(w)], block[who == w]) is None:
                return False
    return True


class Decentralized(CornerScheme):
    """Decentralized coded shuffling: after the master's placement, the workers send every
    reshuffle from what they store (docs/decentralized.md)."""

    name = "decentralized"
    summary = "workers send every reshuffle from their own storage T (integer corners, sharing)"
    sender = "workers"
    bound_label = "worst-case converse"
    max_workers = MAX_WORKERS

    def corners(self, num_workers: int) -> list[tuple[int, float, int, float]]:
        k = num_workers
        return [
            (m, float(m), corner_splits(k, m), k * (k - m) / (m * (k - 1)) if k > 1 else 0.0)
            for m in range(1, k + 1)
        ]

    def corner_state(self, assignment: np.ndarray, num_workers: int, param: int) -> CacheState:
        return peer_initial_state(assignment, num_workers, param)

    def corner_plan(self, state: CacheState, new_assignment: np.ndarray) -> DeliveryPlan:
        return peer_plan(state, new_assignment, self.name)

    def corner_next(self, state: CacheState, new_assignment: np.ndarray) -> CacheState:
        return peer_next_state(state, new_assignment)

    def transition_bound(self, state: CacheState, new_assignment: np.ndarray) -> tuple[float, bool]:
        """The decentralized converse at the storage in use (a worst case over shuffles: a
        shuffle that moves fewer points can be delivered below it)."""
        q = state.num_points / state.num_workers
        storage = float(self.stored_points(state).max()) / q
        value = decentralized_converse(state.num_workers, state.num_points, storage)
        return float(value), True
