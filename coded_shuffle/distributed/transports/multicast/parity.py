"""``multicast``'s parity: repair datagrams over windows of a stream, sized by the loss.

After every window of ``window`` datagrams of a stream's first round (the last ones shorter,
:func:`window_edges`; what lies past the stream is zeros) the master sends ``R`` repair
datagrams, repair
``r`` the XOR of the window's datagrams whose equations hold ``r``: each datagram is in
:data:`EQUATIONS` of the ``R`` equations, chosen by a hash of its place in the window
(:func:`equations`; a sparse random code over GF(2), as LDPC codes for erasures are built,
RFC 5170). ``R`` follows the loss the receivers reported of the last stream (:func:`repairs`):
the expected losses of a window, three standard deviations and :data:`SPARE` more, so the code
costs what the loss calls for (3.0% of a 15 MB stream at 1%, 1.4% at 0.1%, 8% at 5%), where
the block and column parity before it cost 6.25% at any loss (docs/benchmarks.md, "Repair
windows").

A receiver that lacks ``e`` datagrams of a window and holds ``h >= e`` of its repairs solves
for them all at once (:func:`solve`: Gaussian elimination over GF(2), on the equations'
incidence with the lacking datagrams, the payloads carried along): a random sparse code with
``h`` a little above ``e`` has full rank with high probability (simulated at 1% loss, windows
of 2,048, four receivers: a repair round in none of 200 streams of 11,600 datagrams; measured
on the emulated cluster, none in 40 coded deliveries at 1%, and at 5% none after the first,
where the block and column parity left one in 7 at 1% and every one at 5%). A window it cannot solve
waits for the repair round, as a loss did before any parity.

The decoding is compiled: the receiver's compiled loop (:mod:`.drain`) keeps the repairs it
reads (:func:`keep`), and :class:`Parity` does for those the interpreter takes apart and at a
round's end (:meth:`Parity.rebuild_all`).

Wire: a repair datagram's flags are ``FLAG_PARITY | R << REPAIRS_SHIFT``, its number
``window * STRIDE + r``, its payload ``datagram_bytes`` long.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

FLAG_PARITY = 1
REPAIRS_SHIFT = 8  # a repair's flags: FLAG_PARITY | R << 8 (R: its window's repairs)
LOW_FLAGS = (1 << REPAIRS_SHIFT) - 1
MOST_REPAIRS = 255  # repairs of one window, at most (its flags' high byte)
STRIDE = 256  # a repair's number: window * STRIDE + r
EQUATIONS = 8  # the equations each datagram is in (half of them where R is below 16)
SIGMAS = 3.0  # repairs above a window's expected losses, in standard deviations ...
SPARE = 10  # ... and these more (solving needs a few more equations than unknowns)
LOSS_PRIOR = 0.01  # the loss assumed for a job's first stream, before any report
RING = 4  # windows whose repairs a receiver keeps at once (the latest ones)
WINDOW, COUNT, TRIED, SOLVED = range(4)  # a ring entry's fields
N, TOTAL, WINDOWS = range(3)  # a stream's dimensions: datagrams, bytes, windows
SMALLEST = 16  # the stream's last two windows: a sixteenth of a window, at least this many


def repairs(size: int, loss: float) -> int:
    """Repair datagrams for a window of ``size`` datagrams at ``loss`` (a share): its
    expected losses, :data:`SIGMAS` standard deviations (Poisson) and :data:`SPARE` more, at
    most :data:`MOST_REPAIRS` and ``size``; 0 at no loss."""
    if loss <= 0 or size <= 0:
        return 0
    mean = size * loss
    return min(MOST_REPAIRS, size, math.ceil(mean + SIGMAS * math.sqrt(mean) + SPARE))


def is_repair(flags: np.ndarray | int) -> np.ndarray | bool:
    """Whether datagrams with ``flags`` are repair datagrams."""
    return ((flags & LOW_FLAGS) == FLAG_PARITY) & ((flags >> REPAIRS_SHIFT) > 0)


def window_edges(n: int, size: int) -> np.ndarray:
    """Where a stream of ``n`` datagrams' windows begin, and its end: windows of ``size``,
    but the last ones halve, down to a sixteenth of it, which the last two are (``size``
    2,048: ..., 2048, 1024, 512, 256, 128, 128). A window's losses wait for its repairs, and
    what they hold up (checks, decoding) follows at once: after the stream's last window, on
    the delivery's path; a short last window keeps that short, for a few more repairs."""
    if n <= 0 or size <= 0:
        return np.zeros(1, dtype=np.int64)
    smallest = max(SMALLEST, size // 16)
    tail = [smallest]
    while tail[-1] < size:
        tail.append(min(size, smallest * 2 ** (len(tail) - 1)))
    tail = tail[:-1]  # smallest, smallest, 2 * smallest, ...: a whole window before them
    sizes, left = [], n
    for s in tail:
        if left <= 0:
            break
        sizes.append(min(s, left))
        left -= sizes[-1]
    sizes += [size] * (left // size) + ([left % size] if left % size else [])
    return np.concatenate([[0], np.cumsum(sizes[::-1])]).astype(np.int64)


def ending_in(lo: int, hi: int, edges: np.ndarray) -> list[int]:
    """The windows (``edges``: :func:`window_edges`) whose last datagram lies in ``[lo, hi)``:
    those whose repairs may go now."""
    ends = edges[1:]
    return np.flatnonzero((lo < ends) & (ends <= hi)).tolist()


@njit(cache=True, nogil=True)
def _mix(x: np.uint64) -> np.uint64:
    """SplitMix64's finalizer: a 64-bit hash."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, nogil=True, boundscheck=False)
def equations(position: int, count: int, into: np.ndarray) -> int:
    """The equations (of ``count``) that datagram ``position`` of a window is in, put in
    ``into``; returns how many: :data:`EQUATIONS`, or half of ``count`` where that is fewer
    (were it in all of them, they would all be one equation)."""
    k = min(EQUATIONS, max(1, count // 2))
    got, t = 0, np.uint64(0)
    seed = np.uint64(position) * np.uint64(0x100000001B3)
    while got < k:
        e = np.int64(_mix(seed + t) % np.uint64(count))
        t += np.uint64(1)
        new = True
        for j in range(got):
            if into[j] == e:
                new = False
        if new:
            into[got] = e
            got += 1
    return k


@njit(cache=True, nogil=True, boundscheck=False)
def encode(rows: np.ndarray, out: np.ndarray) -> None:
    """The repairs of one window: ``out[r]`` (``out`` is ``(R, d)``) the XOR of the rows of
    ``rows`` (the window's datagrams, zero padded) whose equations hold ``r``."""
    out[:] = 0
    count = out.shape[0]
    into = np.empty(EQUATIONS, dtype=np.int64)
    for i in range(rows.shape[0]):
        for j in range(equations(i, count, into)):
            _xor(out[into[j]], rows[i])


@njit(cache=True, nogil=True, boundscheck=False)
def solve(entry: int, out: np.ndarray, have: np.ndarray, code: tuple[np.ndarray, ...]) -> int:
    """Every datagram that ring ``entry``'s window lacks, from its repairs in hand and the
    datagrams it holds (Gauss-Jordan elimination over GF(2)); returns how many (0 where the
    repairs in hand leave one undetermined: nothing is written then)."""
    store, held, meta, dims, edges = code
    n = dims[N]
    window, count = meta[entry, WINDOW], meta[entry, COUNT]
    lo, hi, d = edges[window], edges[window + 1], store.shape[1]
    if hi == n:  # the stream's last datagram: zero past the stream, as the master's
        out[dims[TOTAL] : n * d] = 0
    rows = out[: n * d].reshape(n, d)  # row views: the loops below then run as vectors
    column = np.empty(hi - lo, dtype=np.int64)  # each lacking datagram's unknown
    lacking, m = np.empty(hi - lo, dtype=np.int64), 0  # each unknown's datagram
    for i in range(hi - lo):
        column[i] = -1 if have[lo + i] else m
        if not have[lo + i]:
            lacking[m] = i
            m += 1
    row, h = np.empty(count, dtype=np.int64), 0
    for r in range(count):  # each repair in hand's equation
        row[r] = h if held[entry, r] else -1
        h += held[entry, r]
    a = np.zeros((h, m), dtype=np.uint8)
    b = np.empty((h, d), dtype=np.uint8)  # the syndromes
    for r in range(count):
        if row[r] >= 0:
            b[row[r]] = store[entry * STRIDE + r]
    into = np.empty(EQUATIONS, dtype=np.int64)
    for i in range(hi - lo):
        for j in range(equations(i, count, into)):
            q = row[into[j]]
            if q < 0:
                continue
            if column[i] >= 0:
                a[q, column[i]] = 1
            else:
                _xor(b[q], rows[lo + i])
    for c in range(m):
        pivot = -1
        for q in range(c, h):
            if a[q, c]:
                pivot = q
                break
        if pivot < 0:
            return 0
        if pivot != c:
            _swap(a[c], a[pivot])
            _swap(b[c], b[pivot])
        for q in range(h):
            if q != c and a[q, c]:
                _xor(a[q], a[c])
                _xor(b[q], b[c])
    for c in range(m):
        rows[lo + lacking[c]] = b[c]
        have[lo + lacking[c]] = True
    return m


@njit(cache=True, nogil=True, boundscheck=False)
def _xor(into: np.ndarray, other: np.ndarray) -> None:
    for x in range(into.size):
        into[x] ^= other[x]


@njit(cache=True, nogil=True, boundscheck=False)
def _swap(one: np.ndarray, other: np.ndarray) -> None:
    for x in range(one.size):
        one[x], other[x] = other[x], one[x]


@njit(cache=True, nogil=True, boundscheck=False)
def attempt(entry: int, out: np.ndarray, have: np.ndarray, code: tuple[np.ndarray, ...]) -> int:
    """Ring ``entry``'s window solved (:func:`solve`) if it lacks datagrams, holds as many
    repairs, and more to spare than at its last try; returns how many it rebuilt."""
    _, held, meta, _, edges = code
    if meta[entry, WINDOW] < 0 or meta[entry, SOLVED]:
        return 0
    lo, hi = edges[meta[entry, WINDOW]], edges[meta[entry, WINDOW] + 1]
    lacks = 0
    for j in range(lo, hi):
        lacks += not have[j]
    if lacks == 0:
        meta[entry, SOLVED] = 1
        return 0
    inhand = 0
    for r in range(meta[entry, COUNT]):
        inhand += held[entry, r]
    spare = inhand - lacks
    if spare < 0 or spare <= meta[entry, TRIED]:
        return 0
    meta[entry, TRIED] = spare
    got = solve(entry, out, have, code)
    meta[entry, SOLVED] = got > 0
    return got


@njit(cache=True, nogil=True, boundscheck=False)
def keep(
    seq: int,
    flags: int,
    payload: np.ndarray,
    out: np.ndarray,
    have: np.ndarray,
    code: tuple[np.ndarray, ...],
) -> int:
    """Repair datagram ``seq`` (``flags``, ``payload``) kept, unless the stream has no such
    window, the repair is held already, or its window's room in the ring went to a later
    window. A window is solved (:func:`attempt`) after its last repair, or, where that was
    lost, once a later window's first repair comes (they are sent in order, and solving
    costs as much with fewer repairs as with all); returns how many datagrams it rebuilt."""
    store, held, meta, dims, _ = code
    count, window, r = flags >> REPAIRS_SHIFT, seq // STRIDE, seq % STRIDE
    if count == 0 or r >= count or window >= dims[WINDOWS]:
        return 0
    entry, rebuilt = window % RING, 0
    if meta[entry, WINDOW] != window:
        if meta[entry, WINDOW] > window:
            return 0
        for other in range(meta.shape[0]):  # the windows before it whose last repair was lost
            if 0 <= meta[other, WINDOW] < window:
                rebuilt += attempt(other, out, have, code)
        meta[entry, WINDOW], meta[entry, COUNT] = window, count
        meta[entry, TRIED], meta[entry, SOLVED] = -1, 0
        held[entry, :] = False
    if meta[entry, COUNT] != count or held[entry, r]:
        return rebuilt
    store[entry * STRIDE + r, : payload.size] = payload
    held[entry, r] = True
    if r == count - 1:
        rebuilt += attempt(entry, out, have, code)
    return rebuilt


class Parity:
    """A receiver's repair datagrams of one stream (the latest :data:`RING` windows'), and
    the datagrams they rebuild."""

    def __init__(self, total: int, d: int, window: int) -> None:
        self.d, n = d, -(-total // d)
        rooms = RING if window else 0
        store = np.zeros((rooms * STRIDE, d), dtype=np.uint8)
        held = np.zeros((rooms, STRIDE), dtype=bool)
        meta = np.full((rooms, 4), -1, dtype=np.int64)
        edges = window_edges(n, window)
        dims = np.array([n, total, edges.size - 1], dtype=np.int64)
        self.arrays = (store, held, meta, dims, edges)

    def receive(
        self, seq: int, flags: int, payload: np.ndarray, out: np.ndarray, have: np.ndarray
    ) -> int:
        """Keeps repair ``seq``; returns how many datagrams it let its window rebuild."""
        return keep(seq, flags, payload, out, have, self.arrays)

    def rebuild_all(self, out: np.ndarray, have: np.ndarray) -> int:
        """Every window in the ring that its repairs in hand can solve now, solved."""
        return sum(attempt(e, out, have, self.arrays) for e in range(self.arrays[2].shape[0]))


def warm() -> None:
    """Compiles (or loads from numba's cache) what the interpreter calls of the parity,
    now and not in a job's first delivery: a window of 16 datagrams encoded, one of them
    lost, rebuilt by its repairs."""
    rows = np.arange(64, dtype=np.uint8).reshape(16, 4)
    count = repairs(16, LOSS_PRIOR)
    payloads = np.empty((count, 4), dtype=np.uint8)
    encode(rows, payloads)
    parity, out, have = Parity(64, 4, 16), rows.reshape(-1).copy(), np.ones(16, dtype=bool)
    out[12:16], have[3] = 0, False
    for r in range(count):
        parity.receive(r, FLAG_PARITY | count << REPAIRS_SHIFT, payloads[r], out, have)
    parity.rebuild_all(out, have)
    if not have.all() or not np.array_equal(out, rows.reshape(-1)):
        raise RuntimeError("multicast parity: a window of 16 lacking one was not rebuilt")
