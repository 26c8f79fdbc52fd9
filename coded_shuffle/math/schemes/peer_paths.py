"""Paths of symbols across groups for the decentralized scheme (docs/decentralized.md,
section 2d).

A symbol of a plan has *receivers* (the workers that need one of its terms) and *knowers*
(the workers that store every term). Take symbols ``A_1 .. A_L`` whose knowers share a worker
``s``, such that every receiver of each ``A_i`` knows some other ``A_j`` whole. Then ``s``
sends the ``L - 1`` sums ``A_1 + A_2, A_2 + A_3, .., A_{L-1} + A_L`` in their place: a
receiver ``v`` of ``A_i`` that knows ``A_j`` adds the sums between them, gets ``A_i + A_j``,
strips ``A_j`` and is left with ``A_i``, which it decodes as before. One symbol saved per path.

Symbols are grouped by *type* (receivers, knowers) with a count, so the plan and the closed
form run one search (:func:`find_paths`) on the same counts.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from coded_shuffle.math.jit import LazyJit
from coded_shuffle.math.schemes import peer_cliques as cliques

MAX_LENGTH = 24  # symbols per path the search grows before it gives a start up
MAX_WORKERS = 16  # masks fit the popcount table
MAX_TYPES = 6000  # past this many types no path is searched (K = 16, T = 8: 61,522 types, 5 min)


@dataclass(frozen=True, order=True)
class SymbolType:
    """Bitmasks over the workers: who needs a term of the symbol, who stores all of them."""

    receivers: int
    knowers: int


@dataclass(frozen=True)
class Path:
    """``copies`` paths sent by ``sender``, each made of one symbol of every type in ``types``
    (in order; a type may recur)."""

    sender: int
    types: tuple[SymbolType, ...]
    copies: int


POPCOUNT = np.array([bin(i).count("1") for i in range(1 << MAX_WORKERS)], dtype=np.int64)


class Pool:
    """The types left to paths, as arrays in type order: receivers, knowers, counts."""

    def __init__(self, counts: dict[SymbolType, int]) -> None:
        self.types = sorted(pathable(counts))
        self.receivers = np.array([t.receivers for t in self.types], dtype=np.int64)
        self.knowers = np.array([t.knowers for t in self.types], dtype=np.int64)
        self.counts = np.array([counts[t] for t in self.types], dtype=np.int64)
        self.by_sender = {w: np.flatnonzero((self.knowers >> w) & 1) for w in range(MAX_WORKERS)}

    def grow(self, start: int, sender: int) -> tuple[list[int], bool]:
        """The path from type ``start`` sent by ``sender`` (:func:`grow_path`): the types
        taken and whether they make a path."""
        out = np.empty(MAX_LENGTH + 2, dtype=np.int64)
        n, closed = grow_path(
            start, self.by_sender[sender], self.receivers, self.knowers, self.counts, POPCOUNT, out
        )
        return out[:n].tolist(), bool(closed)


@LazyJit
def grow_path(
    start: int,
    candidates: np.ndarray,
    receivers: np.ndarray,
    knowers: np.ndarray,
    counts: np.ndarray,
    popcount: np.ndarray,
    out: np.ndarray,
) -> tuple[int, bool]:
    """Grows a path from type ``start`` into ``out``: add the candidate type (one left) that
    covers the most open receivers (receivers of a member that know no other member whole:
    the members' receivers less their knowers, since a receiver never knows its own symbol)
    less the new ones it opens, the first such in type order, until none is open. Returns
    the types taken (``out[:n]``) and whether they make a path (nothing left uncovered within
    :data:`MAX_LENGTH` + 1 types). ``counts`` is the same after as before."""
    out[0] = start
    n = 1
    counts[start] -= 1
    reach, known = receivers[start], knowers[start]
    closed = False
    while n <= out.size - 2:
        open_ = reach & ~known
        if open_ == 0:
            closed = True
            break
        best, best_value = -1, -(1 << 62)
        for i in range(candidates.size):
            t = candidates[i]
            if counts[t] <= 0:
                continue
            gain = popcount[open_ & knowers[t]]
            if gain == 0:
                continue
            value = (gain - popcount[receivers[t] & ~known]) * 64 + gain
            if value > best_value:
                best, best_value = t, value
        if best < 0:
            break
        out[n] = best
        n += 1
        counts[best] -= 1
        reach |= receivers[best]
        known |= knowers[best]
    for i in range(n):
        counts[out[i]] += 1
    return n, closed


class Search:
    """Grows of (start, sender) pairs, remembered: a grow that found no path finds none
    again while the counts of the types it took are unchanged (the greedy's every choice is
    the first best among what is left, and only running out changes what is left)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.failed: dict[tuple[int, int], tuple[list[int], np.ndarray]] = {}

    def grow(self, start: int, sender: int) -> list[int] | None:
        key = (start, sender)
        if key in self.failed:
            tried, counts = self.failed[key]
            if np.array_equal(self.pool.counts[tried], counts):
                return None
        path, closed = self.pool.grow(start, sender)
        if closed:
            self.failed.pop(key, None)
            return path
        self.failed[key] = (path, self.pool.counts[path].copy())
        return None


def find_paths(counts: dict[SymbolType, int]) -> list[Path]:
    """Paths over symbols of ``counts``' types, in rounds: every (start type, sender) with a
    start left grows one; the shortest is taken first, as many times as its types' counts
    allow, and a path whose types ran out is grown again from its start; the next round
    grows every start again (what ran out changes the greedy's choices), until a round takes
    nothing; none past :data:`MAX_TYPES` types. Deterministic in the counts."""
    if len(pathable(counts)) > MAX_TYPES:
        return []
    pool = Pool(counts)
    search = Search(pool)
    paths: list[Path] = []
    while True:
        heap: list[tuple[int, int, int, list[int]]] = []
        for start in np.flatnonzero(pool.counts > 0).tolist():
            for sender in cliques.bits(int(pool.knowers[start])):
                path = search.grow(start, sender)
                if path:
                    heapq.heappush(heap, (len(path), start, sender, path))
        taken = len(paths)
        while heap:
            _, start, sender, path = heapq.heappop(heap)
            need = Counter(path)
            copies = min(int(pool.counts[t]) // n for t, n in need.items())
            if copies:
                for t, n in need.items():
                    pool.counts[t] -= n * copies
                paths.append(Path(sender, tuple(pool.types[t] for t in path), copies))
            if pool.counts[start] > 0:
                again = search.grow(start, sender)
                if again:
                    heapq.heappush(heap, (len(again), start, sender, again))
        if len(paths) == taken:
            return paths


def saved(paths: Iterable[Path]) -> int:
    """Symbols the paths save: one per path sent."""
    return sum(p.copies for p in paths)


def row_types(terms: np.ndarray, receiver_of: np.ndarray, holders_of: np.ndarray) -> np.ndarray:
    """Per row of ``terms`` (sub-piece ids, ``-1`` padded), its receivers' and knowers' masks
    as an ``(n, 2)`` array: ``receiver_of[i]``/``holders_of[i]`` the receiver's bit and the
    holders' mask of term ``i``'s piece (flattened like ``terms``). A row that carries two
    terms for one receiver (section 2b's ``A + C``, decoded with the help of another row)
    gets no knowers: it stays out of every path, as does an empty row."""
    valid = terms >= 0
    rec = np.bitwise_or.reduce(np.where(valid, receiver_of.reshape(terms.shape), 0), axis=1)
    hold = np.bitwise_and.reduce(np.where(valid, holders_of.reshape(terms.shape), -1), axis=1)
    one_each = POPCOUNT[rec] == valid.sum(axis=1)
    return np.stack([rec, np.where(one_each & (rec != 0), hold, 0)], axis=1)


def pathable(counts: dict[SymbolType, int]) -> dict[SymbolType, int]:
    """The types a path may take: with a receiver and a knower."""
    return {t: c for t, c in counts.items() if t.receivers and t.knowers and c}


def path_rows(
    rows: np.ndarray, types: np.ndarray, paths: list[Path]
) -> tuple[list[tuple[int, np.ndarray]], np.ndarray]:
    """The paths' sums ``[(sender, rows)]`` and a mask of the ``rows`` they used: each path
    takes the first unused row of each of its types."""
    order = np.lexsort((types[:, 1], types[:, 0]))
    keys = types[order]
    cuts = np.flatnonzero(np.any(np.diff(keys, axis=0) != 0, axis=1)) + 1
    starts = np.r_[0, cuts] if keys.size else cuts
    pools = {
        SymbolType(int(keys[a, 0]), int(keys[a, 1])): list(part)
        for a, part in zip(starts, np.split(order, cuts), strict=False)
    }
    taken = {t: 0 for t in pools}
    used = np.zeros(rows.shape[0], dtype=bool)
    out: list[tuple[int, np.ndarray]] = []
    for path in paths:
        picks = []
        for t in path.types:
            picks.append(np.array(pools[t][taken[t] : taken[t] + path.copies], dtype=np.int64))
            taken[t] += path.copies
        for a, b in pairwise(picks):
            out.append((path.sender, np.concatenate([rows[a], rows[b]], axis=1)))
            used[a] = True
            used[b] = True
    return out, used


def clique_type_counts(members: list[int], segments: list[list[tuple[int, int]]]) -> Counter:
    """The types of the rows :func:`.peer_cliques.clique_symbols` makes, from counts alone:
    ``segments[u]`` lists ``(sub-pieces, holders' mask)`` of member ``u``'s needs, in order."""
    sizes = np.array([sum(c for c, _ in seg) for seg in segments], dtype=np.int64)
    shares = cliques.clique_shares(sizes, len(members) - 1)
    placed: list[list[tuple[int, int, int]]] = [[] for _ in members]  # (u, start, take)
    for u, size in enumerate(sizes.tolist()):
        start = 0
        for sender, placed_by in enumerate(placed):
            if sender == u or start == size:
                continue
            take = min(int(shares[sender]), size - start)
            placed_by.append((u, start, take))
            start += take
    out: Counter = Counter()
    for parts in placed:
        cuts = {0}
        for u, start, take in parts:
            cuts.add(take)
            pos = 0
            for count, _ in segments[u]:
                pos += count
                if 0 < pos - start < take:
                    cuts.add(pos - start)
        for a, b in pairwise(sorted(cuts)):
            receivers, knowers = 0, -1
            for u, start, take in parts:
                if a < take:
                    receivers |= 1 << members[u]
                    knowers &= holders_at(segments[u], start + a)
            if receivers:
                out[SymbolType(receivers, knowers)] += b - a
    return out


def holders_at(segments: list[tuple[int, int]], position: int) -> int:
    """The holders' mask of the sub-piece at ``position`` of a member's segments."""
    for count, holders in segments:
        if position < count:
            return holders
        position -= count
    raise IndexError(position)
