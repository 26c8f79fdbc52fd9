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
senders instead, three pieces for two symbols (section 2b, :mod:`.peer_alignment`).

Update (section 3): the new owner keeps the point whole; a piece whose holders missed it is
now held by ``H - j + k`` (the old owner drops it); nothing is sent, and every worker again
stores ``m q`` points.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import comb

import numpy as np

from coded_shuffle.math.plan import DeliveryPlan, held_at
from coded_shuffle.math.rate_memory import decentralized_converse
from coded_shuffle.math.schemes import peer_alignment as alignment
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


def sub_pieces(num_workers: int, m: int) -> int:
    """Sub-pieces per piece: ``m`` where groups code (``1 < m < K``), else 1."""
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


def group_shares(needs: np.ndarray, m: int) -> np.ndarray:
    """Sub-pieces each member sends in a group whose members need ``needs`` pieces (eq. (1)).

    The group sends ``S = max(sum d, m max d)`` sub-pieces' worth: member ``u``'s ``m d_u``
    sub-pieces must be covered by the others' shares, so ``L_u <= S - m d_u``, and the shares
    sum to ``S``; filled greedily in member order."""
    needs = np.asarray(needs, dtype=np.int64)
    if m == 1:  # no sub-pieces: each member sends what the other needs
        return needs[::-1].copy()
    total = max(int(needs.sum()), m * int(needs.max(initial=0)))
    caps = total - m * needs
    shares = np.zeros_like(needs)
    left = total
    for u in range(needs.size):
        shares[u] = min(int(caps[u]), left)
        left -= int(shares[u])
    return shares


def group_symbols(members: list[int], pieces: list[np.ndarray], m: int, r: int) -> list:
    """``[(sender, rows)]`` of one group: ``rows[i, c]`` the sub-piece of receiver ``c``
    (members other than the sender, in order) XORed in the sender's ``i``-th symbol (-1 none).

    ``pieces[u]``: the piece ids (``p * C + i``) member ``u`` needs."""
    needs = np.array([p.size for p in pieces], dtype=np.int64)
    shares = group_shares(needs, m)
    width = len(members) - 1
    rows = {s: np.full((int(shares[s]), width), -1, dtype=np.int64) for s in range(len(members))}
    for u, ids in enumerate(pieces):
        subs = (ids[:, None] * r + np.arange(r, dtype=np.int64)).reshape(-1)
        start = 0
        for s in range(len(members)):
            if s == u or start == subs.size:
                continue
            take = min(int(shares[s]), subs.size - start)
            rows[s][:take, u if u < s else u - 1] = subs[start : start + take]
            start += take
        assert start == subs.size, "a group's shares must cover every member's needs"
    return [(members[s], rows[s]) for s in range(len(members)) if rows[s].shape[0]]


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
    """Section 2: every group's symbols, each with the member that sends it."""
    labels: PeerLabels = state.labels
    k, m = state.num_workers, labels.m
    r = sub_pieces(k, m)
    new = np.asarray(new_assignment, dtype=np.int64)
    groups, receivers, ids = demanded_pieces(state, new)
    rows: list[tuple[int, np.ndarray]] = []
    lone: dict[tuple[int, int, int], list[np.ndarray]] = {}
    owners = state.assignment[ids // labels.holders.shape[1]]
    cuts = np.flatnonzero(np.diff(groups)) + 1
    starts = np.r_[0, cuts] if groups.size else cuts  # no group at all: nothing to send
    splits = zip(*(np.split(a, cuts) for a in (receivers, ids, owners)), strict=True)
    for mask, (g_rcv, g_ids, g_own) in zip(groups[starts], splits, strict=False):
        members = [w for w in range(k) if (int(mask) >> w) & 1]
        pieces = [g_ids[g_rcv == w] for w in members]
        if aligned(k, m):
            pieces = set_lone_apart(members, pieces, [g_own[g_rcv == w] for w in members], lone)
        rows.extend(group_symbols(members, pieces, m, r))
    breakdown = {f"m={m}": int(sum(r.shape[0] for _, r in rows))}
    if lone:
        aligned_rows = lone_rows(lone, k)
        rows.extend(aligned_rows)
        for name, width in (("aligned", 2), ("lone uncoded", 1)):
            breakdown[name] = int(sum(r.shape[0] for _, r in aligned_rows if r.shape[1] == width))
    symbols, senders = sender_blocks(rows)
    return DeliveryPlan(
        scheme=scheme,
        symbols=symbols,
        senders=senders,
        breakdown=breakdown,
        **batch_plan_fields(state, new),
    )


def set_lone_apart(
    members: list[int],
    pieces: list[np.ndarray],
    owners: list[np.ndarray],
    lone: dict[tuple[int, int, int], list[np.ndarray]],
) -> list[np.ndarray]:
    """A 3-group's pieces less its lone ones (section 2b: the excess of a member that needs
    more than the other two together), which go to ``lone[(owner, receiver, partner)]``."""
    needs = np.array([p.size for p in pieces], dtype=np.int64)
    by_owner = np.array(
        [[int(np.count_nonzero(owners[i] == o)) for o in members] for i in range(3)]
    )
    u, taken = alignment.excess(needs, by_owner)
    if u < 0:
        return pieces
    keep = np.ones(pieces[u].size, dtype=bool)
    for o in range(3):
        if taken[o]:
            mine = np.flatnonzero(owners[u] == members[o])[: int(taken[o])]
            keep[mine] = False
            partner = members[3 - u - o]
            lone.setdefault((members[o], members[u], partner), []).append(pieces[u][mine])
    return [p if i != u else p[keep] for i, p in enumerate(pieces)]


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
    width = max(r.shape[1] for _, r in rows)
    terms = np.concatenate(
        [np.pad(r, ((0, 0), (0, width - r.shape[1])), constant_values=-1) for _, r in rows]
    )
    who = np.concatenate([np.full(r.shape[0], s, dtype=np.int64) for s, r in rows])
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


def decentralized_load(moves: np.ndarray, m: int) -> float:
    """The delivery's load in points for shuffle matrix ``moves`` at corner ``m``: eq. (1) summed
    over the groups, in pieces of ``1/C(K-1, m-1)`` point (section 2), and at ``m = 2`` the
    lone pieces' triples (section 2b)."""
    k = moves.shape[0]
    if m >= k:
        return 0.0
    r = sub_pieces(k, m)
    total = 0
    lone = np.zeros((k, k, k), dtype=np.int64)
    for members, sub in group_moves(moves, m):
        needs = sub.sum(axis=0)
        if aligned(k, m):
            u, taken = alignment.excess(needs, sub.T)
            for o in np.flatnonzero(taken):
                lone[members[o], members[u], members[3 - u - o]] += taken[o]
                needs[u] -= taken[o]
        total += int(group_shares(needs, m).sum())
    if aligned(k, m):
        total += alignment.match_triples(lone).symbols
    return total / (comb(k - 1, m - 1) * r)


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
