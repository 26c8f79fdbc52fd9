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

Every lone piece is cut into three *roles* (``A``, ``C``, ``B``: two of its six sub-pieces
each) and a triple takes one role of each of its three pieces; matched greedily on counts
(:func:`match_triples`, shared by the plan and the closed form), what is left is sent uncoded.
On the cyclic shift this makes the load 4/3 of the converse at ``T = 2`` for every ``K``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SUB_PIECES = 6  # per piece: two per role
MIN_WORKERS = 6  # below it the cyclic shift has no triple (x outside j - 2 .. j + 2)
ROLES = 3  # A, C, B
UNITS = SUB_PIECES // ROLES  # sub-pieces per role


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
    is left of every lone bucket ``(o, n, z)`` per role."""

    types: list[tuple[int, int, int, int]]
    counts: list[int]
    left: np.ndarray  # (K, K, K, ROLES) role units not in a triple

    @property
    def symbols(self) -> int:
        """Sub-piece symbols: two per triple role unit pair, one per leftover sub-piece."""
        return 2 * UNITS * sum(self.counts) + UNITS * int(self.left.sum())


def match_triples(lone: np.ndarray) -> Triples:
    """Greedy triples over lone bucket counts ``lone[o, n, z]`` (every type ``(j, r, x, y)``
    in lexicographic order takes as many as its three buckets' roles allow)."""
    left = np.repeat(lone[..., None], ROLES, axis=-1).astype(np.int64)
    types, counts = [], []
    flows = np.argwhere(lone.sum(axis=2) > 0)  # (owner, receiver) with lone pieces
    for j, r in flows.tolist():
        for x, y in flows.tolist():
            if len({j, r, x, y}) < 4:
                continue
            t = min(left[j, r, x, 0], left[j, r, y, 1], left[x, y, r, 2])
            if t > 0:
                left[j, r, x, 0] -= t
                left[j, r, y, 1] -= t
                left[x, y, r, 2] -= t
                types.append((j, r, x, y))
                counts.append(int(t))
    return Triples(types, counts, left)


def triple_rows(
    triples: Triples, pieces: dict[tuple[int, int, int], np.ndarray]
) -> list[tuple[int, np.ndarray]]:
    """``[(sender, rows)]``: every triple's four symbols (two role sub-pieces each way) and
    every leftover role's sub-pieces uncoded from the piece's partner. ``pieces[(o, n, z)]``:
    the lone piece ids of that bucket, in order; each role takes them from the front."""
    taken = {key: np.zeros(ROLES, dtype=np.int64) for key in pieces}
    rows: list[tuple[int, np.ndarray]] = []

    def take(key: tuple[int, int, int], role: int, count: int) -> np.ndarray:
        start = int(taken[key][role])
        taken[key][role] += count
        ids = pieces[key][start : start + count]
        return (ids[:, None] * SUB_PIECES + role * UNITS + np.arange(UNITS)).reshape(-1)

    for (j, r, x, y), t in zip(triples.types, triples.counts, strict=True):
        a = take((j, r, x), 0, t)
        c = take((j, r, y), 1, t)
        b = take((x, y, r), 2, t)
        rows.append((x, np.stack([a, b], axis=1)))
        rows.append((j, np.stack([a, c], axis=1)))
    for key, ids in pieces.items():
        for role in range(ROLES):
            rest = ids.size - int(taken[key][role])
            if rest:
                rows.append((key[2], take(key, role, rest)[:, None]))
    return rows
