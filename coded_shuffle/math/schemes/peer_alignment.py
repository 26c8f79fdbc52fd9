"""Alignment across senders at corner ``m = 2`` of the decentralized scheme
(docs/decentralized.md, section 2b).

A group ``J = {a, b, u}`` whose member ``u`` needs more than the other two together sends
``u``'s excess uncoded (eq. (1): ``2 max d - sum d`` pieces). Those pieces are *lone*: piece
``(o, n, z)`` of a point moving from owner ``o`` to ``n``, held by ``o`` and its partner ``z``.
Two senders can deliver three lone pieces with two symbols: for workers ``j, r, x, y`` all
different, with points moving ``j -> r`` and ``x -> y``,

* ``x`` sends ``A + B`` and ``j`` sends ``A + C``, where ``A = (j, r, x)``, ``C = (j, r, y)``
  and ``B = (x, y, r)``;
* ``r`` holds ``B`` (its holders are ``x`` and ``r``): it takes ``A``, then ``C``;
  ``y`` holds ``C``: it takes ``A`` from ``j``'s symbol, then ``B`` from ``x``'s.

A bucket ``(o, n, z)`` of lone pieces can be ``A`` of one triple type, ``C`` of another and
``B`` of a third; the triples are matched greedily on counts (:func:`match_triples`, shared by
the plan and the closed form: first a third of every bucket for each of its roles, then what is
left), and what no triple takes is sent uncoded. On the cyclic shift this makes the load 4/3 of
the converse at ``T = 2`` from ``K = 7`` (batches of a multiple of three points; 5/4 at
``K = 6``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coded_shuffle.math.schemes.peer_cliques import sub_ids

SUB_PIECES = 2  # per piece: the corner's own (a triple sends each piece's two halves)
MIN_WORKERS = 6  # below it the cyclic shift has no triple (x outside j - 2 .. j + 2)
ROLES = 3  # A, C, B


def excess(needs: np.ndarray, owners_counts: np.ndarray) -> tuple[int, np.ndarray]:
    """The member of a 3-group that needs more than the other two together, and how many of
    its pieces of each other member's points leave the group (the lower-numbered other
    member's first); ``(-1, zeros)`` when the group is balanced.

    ``needs[i]``: member ``i``'s pieces; ``owners_counts[i, o]``: those of points owned by
    member ``o`` (``o != i``)."""
    u = int(np.argmax(needs))
    e = 2 * int(needs[u]) - int(needs.sum())
    taken = np.zeros(3, dtype=np.int64)
    if e <= 0:
        return -1, taken
    for o in range(3):
        if o != u:
            taken[o] = min(e, int(owners_counts[u, o]))
            e -= int(taken[o])
    return u, taken


@dataclass(frozen=True)
class Triples:
    """Matched triples by type: ``types[t] = (j, r, x, y)`` and ``counts[t]`` of them; what
    is left of every lone bucket ``(o, n, z)``."""

    types: list[tuple[int, int, int, int]]
    counts: list[int]
    left: np.ndarray  # (K, K, K) lone pieces not in a triple

    @property
    def symbols(self) -> int:
        """Sub-piece symbols: four per triple (two halves each way), two per leftover piece
        (its halves, uncoded)."""
        return 2 * SUB_PIECES * sum(self.counts) + SUB_PIECES * int(self.left.sum())


def triple_types(lone: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Every ``(j, r, x, y)`` of four different workers whose three buckets hold lone pieces,
    in lexicographic order."""
    flows = np.argwhere(lone.sum(axis=2) > 0).tolist()  # (owner, receiver) with lone pieces
    return [
        (j, r, x, y)
        for j, r in flows
        for x, y in flows
        if len({j, r, x, y}) == 4 and lone[j, r, x] and lone[j, r, y] and lone[x, y, r]
    ]


def match_triples(lone: np.ndarray) -> Triples:
    """Greedy triples over lone bucket counts ``lone[o, n, z]``, in two passes over the types
    in lexicographic order: first every type takes what a third of each of its buckets allows
    in its role (``A``, ``C``, ``B``: so that a bucket serves all three of its types alike),
    then what is left of the buckets, whatever the role."""
    left = lone.astype(np.int64).copy()
    roles = np.repeat((lone // ROLES)[..., None], ROLES, axis=-1)
    types, counts = [], []
    candidates = triple_types(lone)
    for balanced in (True, False):
        for j, r, x, y in candidates:
            buckets = ((j, r, x), (j, r, y), (x, y, r))  # A, C, B
            t = min(int(left[b]) for b in buckets)
            if balanced:
                t = min(t, *(int(roles[b][i]) for i, b in enumerate(buckets)))
            if t <= 0:
                continue
            for i, b in enumerate(buckets):
                left[b] -= t
                roles[b][i] -= t if balanced else 0
            types.append((j, r, x, y))
            counts.append(t)
    return Triples(types, counts, left)


def triple_rows(
    triples: Triples, pieces: dict[tuple[int, int, int], np.ndarray]
) -> list[tuple[int, np.ndarray]]:
    """``[(sender, rows)]``: every triple's four symbols (the pieces' halves each way) and
    every leftover piece's halves uncoded from its partner. ``pieces[(o, n, z)]``: the lone
    piece ids of that bucket, taken from the front, whatever the role."""
    taken = dict.fromkeys(pieces, 0)
    rows: list[tuple[int, np.ndarray]] = []

    def take(key: tuple[int, int, int], count: int) -> np.ndarray:
        start = taken[key]
        taken[key] += count
        return sub_ids(pieces[key][start : start + count], SUB_PIECES)

    for (j, r, x, y), t in zip(triples.types, triples.counts, strict=True):
        a, c, b = take((j, r, x), t), take((j, r, y), t), take((x, y, r), t)
        rows.append((x, np.stack([a, b], axis=1)))
        rows.append((j, np.stack([a, c], axis=1)))
    for key, ids in pieces.items():
        if ids.size > taken[key]:
            rows.append((key[2], take(key, ids.size - taken[key])[:, None]))
    return rows
