"""Cliques across groups at corners ``3 <= m <= K - 2`` of the decentralized scheme
(docs/decentralized.md, sections 2c and 2e).

A group ``J`` of ``m + 1`` workers codes at the gain of its demanding members: with ``t`` of
them balanced, each symbol serves ``t`` (eq. (1)). Under a shuffle that sends every batch to
one worker most groups have few: their pieces would go at a gain below ``m - 1``. A piece
``(u, H)`` (receiver ``u``, holders ``H``, ``|H| = m``) is also held by every member of each
``m``-set ``V = H - y + u`` other than ``u`` (``y`` in ``H``): in ``V`` a sender ``s`` XORs one
sub-piece for each of the other ``m - 1`` members, every one held by ``s`` (``V - w`` lies in
the holders of the piece of ``w``) and by every other receiver. A set ``V`` whose members need
``d_w`` sub-pieces sends ``max(ceil(sum d / (m - 1)), max d)`` symbols (eq. (1) with ``m``
members).

Each group keeps what it codes at a gain of ``m - 1`` or more (:func:`kept`); the rest of its
pieces (the *excess*) are dealt to the sets ``V``, a sixth of every bucket at a time, each
share to the set where it adds the fewest symbols, the set that drops the piece's owner first
(:func:`deal`, on counts alone: the plan and the closed form run it alike).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

ROUNDS = 6  # shares of every bucket dealt one round at a time
MIN_CORNER = 3  # at m = 2 a set V is a pair: nothing to code (section 2b aligns instead)


def bits(mask: int) -> list[int]:
    """The workers of a bitmask, in order."""
    return [w for w in range(mask.bit_length()) if (mask >> w) & 1]


def sub_ids(ids: np.ndarray, r: int) -> np.ndarray:
    """The ``r`` sub-pieces of every piece in ``ids``, piece by piece."""
    return (ids[:, None] * r + np.arange(r, dtype=np.int64)).reshape(-1)


def clique_shares(slots: np.ndarray, width: int) -> np.ndarray:
    """Symbols each member of a clique sends, each symbol carrying one sub-piece for each of
    the ``width`` other members, member ``u`` needing ``slots[u]`` (eq. (1)): ``S =
    max(ceil(sum / width), max slots)``; member ``u`` sends at most ``S - slots[u]``, filled
    greedily in member order."""
    slots = np.asarray(slots, dtype=np.int64)
    total = max(-(-int(slots.sum()) // width), int(slots.max(initial=0)))
    shares = np.zeros_like(slots)
    left = total
    for u in range(slots.size):
        shares[u] = min(total - int(slots[u]), left)
        left -= int(shares[u])
    return shares


def clique_symbols(members: list[int], subs: list[np.ndarray]) -> list[tuple[int, np.ndarray]]:
    """``[(sender, rows)]`` of one clique: ``rows[i, c]`` the sub-piece of receiver ``c``
    (the members other than the sender, in order) XORed in the sender's ``i``-th symbol (-1
    none). ``subs[u]``: the sub-pieces member ``u`` needs, each held by every other member."""
    width = len(members) - 1
    shares = clique_shares(np.array([s.size for s in subs], dtype=np.int64), width)
    rows = {s: np.full((int(shares[s]), width), -1, dtype=np.int64) for s in range(len(members))}
    for u, need in enumerate(subs):
        start = 0
        for s in range(len(members)):
            if s == u or start == need.size:
                continue
            take = min(int(shares[s]), need.size - start)
            rows[s][:take, u if u < s else u - 1] = need[start : start + take]
            start += take
        assert start == need.size, "a clique's shares must cover every member's needs"
    return [(members[s], rows[s]) for s in range(len(members)) if rows[s].shape[0]]


def kept(needs: np.ndarray, m: int, rule: str = "gain") -> np.ndarray:
    """What a group of ``m + 1`` codes itself. ``gain``: all of it where eq. (1) serves
    ``m - 1`` receivers a symbol or more (``m sum d >= (m - 1) max(sum d, m max d)``), else
    as ``cap``; ``cap``: each member's up to the largest cap ``c`` at which the group serves
    ``m`` (``m c <= sum min(d, c)``)."""
    needs = np.asarray(needs, dtype=np.int64)
    total = max(int(needs.sum()), m * int(needs.max(initial=0)))
    if rule == "gain" and m * int(needs.sum()) >= (m - 1) * total:
        return needs.copy()
    lo, hi = 0, int(needs.max(initial=0))
    while lo < hi:  # {c : m c <= sum min(d, c)} is an interval from 0 (a concave function)
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if m * mid <= int(np.minimum(needs, mid).sum()) else (lo, mid - 1)
    return np.minimum(needs, lo)


def taken_by_owner(excess: np.ndarray, by_owner: np.ndarray) -> np.ndarray:
    """``taken[u, o]``: member ``u``'s excess pieces of member ``o``'s points, the
    lower-numbered owners first (``by_owner[u, o]``: all of ``u``'s pieces of ``o``'s)."""
    room = np.asarray(by_owner, dtype=np.int64)
    before = np.cumsum(room, axis=1) - room
    return np.clip(np.asarray(excess, dtype=np.int64)[:, None] - before, 0, room)


@dataclass(frozen=True, order=True)
class Bucket:
    """Excess pieces of one group and receiver from one owner: ``units`` sub-pieces."""

    group: int  # mask of J
    receiver: int
    owner: int
    units: int


@dataclass(frozen=True)
class Deal:
    """Per bucket ``[(V mask, sub-pieces)]``, and the symbols of all the sets ``V``."""

    shares: list[list[tuple[int, int]]]
    symbols: int


def share(units: int, rnd: int, width: int) -> int:
    """A bucket's share in round ``rnd``: whole multiples of ``width`` sub-pieces spread over
    the rounds (a set ``V`` pays ``ceil(sum / width)``), the remainder in the last."""
    whole = units // width
    x = (whole // ROUNDS + (1 if rnd < whole % ROUNDS else 0)) * width
    return x + (units % width if rnd == ROUNDS - 1 else 0)


def set_options(bucket: Bucket) -> list[int]:
    """The sets ``V = H - y + u`` a bucket's pieces can go to, the one without the owner
    first (there the receiver's own batch came from outside the set)."""
    holders = bucket.group & ~(1 << bucket.receiver)
    ys = [bucket.owner] + [y for y in range(holders.bit_length()) if y != bucket.owner]
    return [(holders & ~(1 << y)) | (1 << bucket.receiver) for y in ys if (holders >> y) & 1]


@dataclass(frozen=True)
class Split:
    """:func:`best_split`'s answer, per demand ``(group, receiver, units)``: the sub-pieces
    its group keeps, and ``[(V, sub-pieces)]`` dealt to the sets."""

    keep: list[int]
    shares: list[list[tuple[int, int]]]


MAX_SPLIT_SHARES = 3000  # the most (demand, set) pairs :func:`best_split` is asked to solve


@dataclass(frozen=True)
class SplitProgram:
    """:func:`best_split`'s integer program for one set of demands, built once: its
    constraint rows (sparse), their bounds, each variable's upper bound, and the ``(demand,
    set)`` pairs of its ``x`` columns (columns: ``k``, ``x``, ``S``, ``c``)."""

    matrix: Any
    low: np.ndarray
    high: np.ndarray
    upper: np.ndarray
    pairs: tuple[tuple[int, int], ...]
    symbols_from: int  # the first column of ``S`` and ``c``


@lru_cache(maxsize=8)
def split_program(demands: tuple[tuple[int, int, int], ...], m: int) -> SplitProgram | None:
    """:func:`best_split`'s program for ``demands`` (None past ``MAX_SPLIT_SHARES`` pairs):
    built once, solved once per tilt (only the costs change)."""
    from scipy.sparse import coo_matrix

    options = [
        [((group & ~(1 << u)) & ~(1 << y)) | (1 << u) for y in bits(group & ~(1 << u))]
        for group, u, _ in demands
    ]
    pairs = [(d, v) for d, sets in enumerate(options) for v in sets]
    if len(pairs) > MAX_SPLIT_SHARES:
        return None
    groups = sorted({g for g, _, _ in demands})
    sets = sorted({v for _, v in pairs})
    nd, nx = len(demands), len(pairs)
    at_s = {g: nd + nx + i for i, g in enumerate(groups)}  # columns: k, x, S, c
    at_c = {v: nd + nx + len(groups) + i for i, v in enumerate(sets)}
    rows: list[dict[int, float]] = []
    low: list[float] = []
    high: list[float] = []
    for d, (_, _, units) in enumerate(demands):  # k + sum x = d
        rows.append({d: 1.0, **{nd + i: 1.0 for i, (dd, _) in enumerate(pairs) if dd == d}})
        low.append(units)
        high.append(units)
    for g in groups:
        mine = [d for d, (gg, _, _) in enumerate(demands) if gg == g]
        rows.append({at_s[g]: float(m), **{d: -1.0 for d in mine}})
        rows += [{at_s[g]: 1.0, d: -1.0} for d in mine]
        low += [0.0] * (1 + len(mine))
        high += [np.inf] * (1 + len(mine))
    for v in sets:
        into = [i for i, (_, vv) in enumerate(pairs) if vv == v]
        rows.append({at_c[v]: float(m - 1), **{nd + i: -1.0 for i in into}})
        for w in bits(v):
            theirs = [i for i in into if demands[pairs[i][0]][1] == w]
            rows.append({at_c[v]: 1.0, **{nd + i: -1.0 for i in theirs}})
        low += [0.0] * (1 + v.bit_count())
        high += [np.inf] * (1 + v.bit_count())
    size = nd + nx + len(groups) + len(sets)
    r_idx = [r for r, row in enumerate(rows) for _ in row]
    c_idx = [c for row in rows for c in row]
    values = [x for row in rows for x in row.values()]
    matrix = coo_matrix((values, (r_idx, c_idx)), shape=(len(rows), size)).tocsr()
    upper = np.full(size, np.inf)
    upper[:nd] = [units for _, _, units in demands]
    return SplitProgram(matrix, np.array(low), np.array(high), upper, tuple(pairs), nd + nx)


def best_split(demands: list[tuple[int, int, int]], m: int, tilt: int = 0) -> Split | None:
    """Sections 2 and 2c at once, the fewest symbols: an integer program (scipy's HiGHS) over
    what every group keeps and where the rest goes. Variables, in sub-pieces: ``k[J, u]``
    kept by group ``J`` for member ``u``, ``x[J, u, V]`` dealt to each set ``V = J - u - y
    + u``, ``S[J]`` and ``c[V]`` the symbols of each group and set. Minimise ``sum S + sum
    c`` subject to ``k + sum_V x = d`` (every demand met), ``m S[J] >= sum_u k``, ``S[J] >=
    k[J, u]`` (eq. (1) of the group), ``(m - 1) c[V] >= sum x[., ., V]`` and ``c[V] >= sum_J
    x[J, w, V]`` for each receiver ``w`` (eq. (1) of the set). None where it has more than
    ``MAX_SPLIT_SHARES`` pairs, or where HiGHS returns no split (the program is always
    feasible: everything kept). ``tilt`` (from 1): every variable's cost raised by a share of
    a symbol drawn from ``tilt`` (all of them together less than half a symbol), which picks
    another of the splits with the fewest symbols, if there is one: paths (section 2d) may
    save more across its symbols."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    program = split_program(tuple(demands), m)
    if program is None:
        return None
    size = program.upper.size
    cost = np.zeros(size)
    cost[program.symbols_from :] = 1.0
    if tilt:
        cost += np.random.default_rng(tilt).random(size) / (2 * size)
    found = milp(
        cost,
        constraints=LinearConstraint(program.matrix, program.low, program.high),
        integrality=np.ones(size),
        bounds=Bounds(0, program.upper),
    )
    if found.x is None:
        return None
    x = np.rint(found.x).astype(np.int64)
    nd = len(demands)
    shares: list[list[tuple[int, int]]] = [[] for _ in demands]
    for i, (d, v) in enumerate(program.pairs):
        if x[nd + i]:
            shares[d].append((v, int(x[nd + i])))
    return Split([int(k) for k in x[:nd]], shares)


def cheapest(
    options: list[int],
    receiver: int,
    x: int,
    width: int,
    units: dict[int, int],
    top: dict[int, int],
    need: dict[tuple[int, int], int],
) -> int:
    """The first set among ``options`` where ``x`` more sub-pieces for ``receiver`` add the
    fewest symbols (a set pays ``max(ceil(sum / width), max need)``)."""
    best, best_cost = options[0], -1
    for v in options:
        total, most = units.get(v, 0), top.get(v, 0)
        before = -(-total // width)
        before = most if most > before else before
        after = -(-(total + x) // width)
        after = most if most > after else after
        mine = need.get((v, receiver), 0) + x
        cost = (mine if mine > after else after) - before
        if best_cost < 0 or cost < best_cost:
            best, best_cost = v, cost
            if cost == 0:  # nothing is cheaper
                break
    return best


def deal(buckets: list[Bucket], m: int) -> Deal:
    """Deal the buckets, sorted, ``ROUNDS`` shares each, every share to the set ``V`` where
    it adds the fewest symbols (the first such in :func:`set_options`' order)."""
    width = m - 1
    units: dict[int, int] = {}
    top: dict[int, int] = {}
    need: dict[tuple[int, int], int] = {}
    options = [set_options(b) for b in buckets]
    shares: list[dict[int, int]] = [{} for _ in buckets]
    for rnd in range(ROUNDS):
        for b, bucket in enumerate(buckets):
            x = share(bucket.units, rnd, width)
            if x:
                v = cheapest(options[b], bucket.receiver, x, width, units, top, need)
                units[v] = units.get(v, 0) + x
                mine = need[(v, bucket.receiver)] = need.get((v, bucket.receiver), 0) + x
                top[v] = max(top.get(v, 0), mine)
                shares[b][v] = shares[b].get(v, 0) + x
    return Deal([list(s.items()) for s in shares], sets_symbols(units, top, width))


def sets_symbols(units: dict[int, int], top: dict[int, int], width: int) -> int:
    """The symbols of every set ``V`` (eq. (1) of a set): ``max(ceil(units / width), top)``,
    ``units[V]`` the sub-pieces dealt to it, ``top[V]`` the most of them for one receiver."""
    return sum(max(-(-units[v] // width), top[v]) for v in units)


def counted_deal(
    buckets: tuple[Bucket, ...] | list[Bucket], shares: list[list[tuple[int, int]]], m: int
) -> Deal:
    """A deal made elsewhere (``shares[b]``: bucket ``b``'s ``(V, sub-pieces)``), its symbols
    counted as :func:`deal` counts its own (:func:`sets_symbols`)."""
    units: dict[int, int] = {}
    need: dict[tuple[int, int], int] = {}
    for bucket, mine in zip(buckets, shares, strict=True):
        for v, count in mine:
            units[v] = units.get(v, 0) + count
            need[(v, bucket.receiver)] = need.get((v, bucket.receiver), 0) + count
    top: dict[int, int] = {}
    for (v, _), n in need.items():
        top[v] = max(top.get(v, 0), n)
    return Deal(shares, sets_symbols(units, top, m - 1))


def clique_rows(
    buckets: list[Bucket], excess: list[np.ndarray], dealt: Deal
) -> list[tuple[int, np.ndarray]]:
    """``[(sender, rows)]`` of every set ``V``: each bucket's sub-pieces (``excess[b]``)
    taken from the front, share by share."""
    needs: dict[int, dict[int, list[np.ndarray]]] = {}
    for bucket, subs, shares in zip(buckets, excess, dealt.shares, strict=True):
        start = 0
        for v, count in shares:
            needs.setdefault(v, {}).setdefault(bucket.receiver, []).append(
                subs[start : start + count]
            )
            start += count
    rows: list[tuple[int, np.ndarray]] = []
    empty = np.zeros(0, dtype=np.int64)
    for v in sorted(needs):
        members = bits(v)
        subs = [np.concatenate(needs[v].get(w, [empty])) for w in members]
        rows.extend(clique_symbols(members, subs))
    return rows
