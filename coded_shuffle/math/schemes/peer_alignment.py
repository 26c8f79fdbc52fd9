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

The lone pieces of every bucket ``(o, n, z)`` are dealt to three *roles* (``A``, ``C``, ``B``:
a third of them each, in order) and a triple takes one piece in each of its roles; matched
greedily on counts (:func:`match_triples`, shared by the plan and the closed form), what is
left is sent uncoded. On the cyclic shift this makes the load 4/3 of the converse at ``T = 2``
for every ``K`` once the batches are multiples of three points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    is left of every lone bucket ``(o, n, z)`` per role."""

    types: list[tuple[int, int, int, int]]
    counts: list[int]
    left: np.ndarray  # (K, K, K, ROLES) pieces of each role not in a triple

    @property
    def symbols(self) -> int:
        """Sub-piece symbols: four per triple (two halves each way), two per leftover piece
        (its halves, uncoded)."""
        return 2 * SUB_PIECES * sum(self.counts) + SUB_PIECES * int(self.left.sum())


def role_counts(count: np.ndarray) -> np.ndarray:
    """A bucket's ``count`` pieces dealt to the roles ``A``, ``C``, ``B`` in order: a third
    each, the first roles one more where ``count`` is not a multiple of three."""
    count = np.asarray(count, dtype=np.int64)
    return np.stack([(count + 2) // 3, (count + 1) // 3, count // 3], axis=-1)


def match_triples(lone: np.ndarray) -> Triples:
    """Greedy triples over lone bucket counts ``lone[o, n, z]`` (every type ``(j, r, x, y)``
    in lexicographic order takes as many as its three buckets' roles allow)."""
    left = role_counts(lone)
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
    """``[(sender, rows)]``: every triple's four symbols (the pieces' halves each way) and
    every leftover piece's halves uncoded from its partner. ``pieces[(o, n, z)]``: the lone
    piece ids of that bucket, in order, dealt to the roles by :func:`role_counts`."""
    starts = {key: np.r_[0, np.cumsum(role_counts(ids.size))[:-1]] for key, ids in pieces.items()}
    taken = {key: np.zeros(ROLES, dtype=np.int64) for key in pieces}
    rows: list[tuple[int, np.ndarray]] = []

    def take(key: tuple[int, int, int], role: int, count: int) -> np.ndarray:
        start = int(starts[key][role] + taken[key][role])
        taken[key][role] += count
        ids = pieces[key][start : start + count]
        return (ids[:, None] * SUB_PIECES + np.arange(SUB_PIECES)).reshape(-1)

    for (j, r, x, y), t in zip(triples.types, triples.counts, strict=True):
        a = take((j, r, x), 0, t)
        c = take((j, r, y), 1, t)
        b = take((x, y, r), 2, t)
        rows.append((x, np.stack([a, b], axis=1)))
        rows.append((j, np.stack([a, c], axis=1)))
    for key, ids in pieces.items():
        for role, dealt in enumerate(role_counts(ids.size).tolist()):
            rest = dealt - int(taken[key][role])
            if rest:
                rows.append((key[2], take(key, role, rest)[:, None]))
    return rows
