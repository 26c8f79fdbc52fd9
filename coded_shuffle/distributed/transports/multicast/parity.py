"""``multicast``'s parity datagrams at a receiver: the XOR of a block of datagrams rebuilds
the one datagram of the block it lacks, without waiting for a repair round; column parity
over a square of blocks rebuilds one of two a block lost, and the block's parity the other.

A square is ``depth`` blocks of ``block`` datagrams; its column ``c`` is the datagram at
position ``c`` of each of its blocks, and its column parity their XOR (the last block and
the last square may be short: they end with the stream, and what lies past it is zeros). A
loss is then lost for good only where it lies on the corners of a rectangle of losses (two
blocks of one square that each lost two, in the same two columns): at 1% loss none to two
streams in ten of ``K = 4`` receivers needed a repair round, against nearly every stream with
block parity alone (docs/benchmarks.md, "Column parity").

The rebuilding is compiled (:func:`rebuild`): the receiver's compiled loop
(:mod:`.drain`) calls it for the parity datagrams it reads, and :class:`Parity` for those the
interpreter takes apart.
"""

from __future__ import annotations

import numpy as np
from numba import njit

FLAG_PARITY = 1
FLAG_COLUMN = 4  # with FLAG_PARITY: a column parity datagram (its number: the column's)
ROW, COLUMN = 0, 1  # the kinds of parity: a block's, a column's
N, TOTAL, BLOCK, DEPTH = range(4)  # a stream's parity dimensions, as :func:`rebuild` takes them


def ending_in(lo: int, hi: int, size: int, n: int) -> list[int]:
    """The units of ``size`` datagrams (blocks, squares; the last ends with the stream's
    ``n``) whose last datagram lies in ``[lo, hi)``: those whose parity may go now."""
    return [u for u in range(lo // size, -(-hi // size)) if lo < min(n, (u + 1) * size) <= hi]


def square_columns(rows: np.ndarray, block: int) -> np.ndarray:
    """``(block, d)``: the column parity of one square's datagrams ``rows`` (``(m, d)``,
    ``m`` at most ``depth * block``; a short last block is padded with zeros)."""
    m, d = rows.shape
    whole = m // block
    out = np.zeros((block, d), dtype=np.uint8)
    if whole:
        np.bitwise_xor.reduce(rows[: whole * block].reshape(whole, block, d), axis=0, out=out)
    rest = rows[whole * block :]
    out[: rest.shape[0]] ^= rest
    return out


@njit(cache=True, nogil=True, boundscheck=False)
def _fill(
    kind: int,
    index: int,
    out: np.ndarray,
    have: np.ndarray,
    store: np.ndarray,
    held: np.ndarray,
    dims: np.ndarray,
) -> int:
    """The one datagram that parity ``index`` of ``kind`` covers and ``have`` lacks, rebuilt
    from the parity (``store[index]``, if ``held``) and the others; its number, or -1 where
    it lacks none or more than one."""
    if index >= held.size or not held[index]:
        return -1
    n, block, depth = dims[N], dims[BLOCK], dims[DEPTH]
    if kind == ROW:
        lo, hi, step = index * block, min(n, (index + 1) * block), 1
    else:
        square, position = index // block, index % block
        lo, hi, step = (
            square * depth * block + position,
            min(n, (square + 1) * depth * block),
            block,
        )
    miss = -1
    for j in range(lo, hi, step):
        if not have[j]:
            if miss >= 0:
                return -1
            miss = j
    if miss < 0:
        return -1
    d = store.shape[1]
    for x in range(dims[TOTAL], out.size):  # zero padding, as in the master's parity
        out[x] = 0
    at = miss * d
    out[at : at + d] = store[index]
    for j in range(lo, hi, step):
        if j != miss:
            out[at : at + d] ^= out[j * d : (j + 1) * d]
    have[miss] = True
    return miss


@njit(cache=True, nogil=True, boundscheck=False)
def rebuild(
    kind: int,
    index: int,
    out: np.ndarray,
    have: np.ndarray,
    parity: tuple[np.ndarray, ...],
) -> int:
    """What parity ``index`` of ``kind`` rebuilds, and what each datagram it rebuilt lets its
    block's and its column's parity rebuild in turn; returns how many. ``parity``: the
    blocks' parity and which are in, the columns' and which are in, the dimensions
    (``N, TOTAL, BLOCK, DEPTH``) and a stack of ``N`` slots (:attr:`Parity.arrays`)."""
    rows, rows_held, cols, cols_held, dims, stack = parity
    if kind == ROW:
        first = _fill(ROW, index, out, have, rows, rows_held, dims)
    else:
        first = _fill(COLUMN, index, out, have, cols, cols_held, dims)
    if first < 0:
        return 0
    block, depth = dims[BLOCK], dims[DEPTH]
    stack[0], top, count = first, 1, 1
    while top > 0 and depth > 0:
        top -= 1
        j = stack[top]
        got = _fill(ROW, j // block, out, have, rows, rows_held, dims)
        if got >= 0:
            stack[top], top, count = got, top + 1, count + 1
        column = j // (depth * block) * block + j % block
        got = _fill(COLUMN, column, out, have, cols, cols_held, dims)
        if got >= 0:
            stack[top], top, count = got, top + 1, count + 1
    return count


@njit(cache=True, nogil=True, boundscheck=False)
def keep(
    kind: int,
    index: int,
    payload: np.ndarray,
    out: np.ndarray,
    have: np.ndarray,
    parity: tuple[np.ndarray, ...],
) -> int:
    """Parity datagram ``index`` of ``kind`` (``payload``) kept, unless it is held already or
    the stream has no such parity; returns how many datagrams it rebuilt (:func:`rebuild`)."""
    rows, rows_held, cols, cols_held, _, _ = parity
    store, held = (rows, rows_held) if kind == ROW else (cols, cols_held)
    if index >= held.size or held[index]:
        return 0
    store[index, : payload.size] = payload
    held[index] = True
    return rebuild(kind, index, out, have, parity)


class Parity:
    """A receiver's parity datagrams of one stream, and the datagrams they rebuild."""

    def __init__(self, total: int, d: int, block: int, depth: int = 0) -> None:
        self.n, self.d, self.block, self.total = -(-total // d), d, block, total
        self.depth = depth if block else 0
        n = self.n
        blocks = -(-n // block) if block else 0
        self.data = np.zeros((blocks, d), dtype=np.uint8)
        self.have = np.zeros(blocks, dtype=bool)
        columns = -(-blocks // self.depth) * block if self.depth else 0
        self.columns = np.zeros((columns, d), dtype=np.uint8)
        self.column_have = np.zeros(columns, dtype=bool)
        dims = np.array([n, total, block, self.depth], dtype=np.int64)
        stack = np.zeros(max(n, 1), dtype=np.int64)
        self.arrays = (self.data, self.have, self.columns, self.column_have, dims, stack)

    def receive(
        self, b: int, payload: np.ndarray, out: np.ndarray, have: np.ndarray, column: bool = False
    ) -> int:
        """Keeps block ``b``'s parity (or column ``b``'s); returns how many datagrams it
        rebuilt, with those that these in turn let the other parity rebuild (:func:`keep`)."""
        return keep(COLUMN if column else ROW, b, payload, out, have, self.arrays)

    def rebuild_all(self, out: np.ndarray, have: np.ndarray) -> int:
        """Every block and column whose parity is in and that lacks exactly one datagram,
        rebuilt, and what that lets the others rebuild."""
        if not self.block:
            return 0
        blocks = self.have.size
        lacks = np.zeros(blocks * self.block, dtype=np.int64)
        lacks[: self.n] = ~have[: self.n]
        rebuilt = 0
        for b in np.flatnonzero(self.have & (lacks.reshape(blocks, -1).sum(axis=1) == 1)):
            rebuilt += rebuild(ROW, int(b), out, have, self.arrays)
        if self.depth:
            square = self.depth * self.block
            every = np.zeros(self.column_have.size // self.block * square, dtype=np.int64)
            every[: self.n] = ~have[: self.n]
            by_column = every.reshape(-1, self.depth, self.block).sum(axis=1).reshape(-1)
            for c in np.flatnonzero(self.column_have & (by_column == 1)):
                rebuilt += rebuild(COLUMN, int(c), out, have, self.arrays)
        return rebuilt
