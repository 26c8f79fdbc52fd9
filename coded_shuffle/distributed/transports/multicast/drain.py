"""A ``multicast`` receiver's common reads taken in compiled code, without the interpreter.

At 400 Mbit/s a receiver keeps up with the stream, so nearly every read is one coalesced run
of at most 64 KiB (``UDP_GRO``, :mod:`.batches`): about 350 reads for 15 MB, each of which
cost the interpreter tens of microseconds (the call, its control message, the source's
address, the headers' comparison, the copy) on top of the kernel's copy (docs/benchmarks.md,
"Multicast at the cluster's default MTU"). :class:`Drain` reads (``recvmsg`` through libc,
never waiting) and takes every read of the common case (this round's data datagrams from the
stream's sender, full, numbered one after the other, none held yet; this round's repair
datagrams, each kept and what it lets its window rebuild rebuilt: :func:`~.parity.keep`) in
a numba-compiled loop, until the socket is empty, the round holds every datagram, or a read
is anything else: that read is left in the buffer for :class:`~.receive.Round` to take
apart.
"""

from __future__ import annotations

import socket

import numpy as np
from numba import njit, types

from coded_shuffle.costs.wire import DGRAM_HEADER
from coded_shuffle.distributed.transports.multicast.batches import (
    GRO_MAX_SEGMENTS,
    RECEIVE_BYTES,
    UDP_GRO,
)
from coded_shuffle.distributed.transports.multicast.parity import (
    FLAG_PARITY,
    LOW_FLAGS,
    REPAIRS_SHIFT,
    STRIDE,
    WINDOWS,
    Parity,
    keep,
)
from coded_shuffle.distributed.transports.multicast.receive import Round

EMPTY, OTHER, DONE = 0, 1, 2  # the socket held nothing more; a read for Round; all held
NAME_BYTES = 16  # a sockaddr_in
CONTROL_BYTES = 64  # room for the coalescing control message (and any other)
STATE = ("status", "nbytes", "segment", "taken", "ingress", "rebuilt")
STATUS, NBYTES, SEGMENT, TAKEN, INGRESS, REBUILT = range(len(STATE))
# struct msghdr (x86-64 and every LP64 Linux), as 8-byte words: name, namelen, iov, iovlen,
# control, controllen, flags
NAME, NAMELEN, IOV, IOVLEN, CONTROL, CONTROLLEN, FLAGS = range(7)

SEQ_AT, FLAGS_AT, HEADER_BYTES, MASK = range(4)  # a header layout's entries; the mask last


def header_layout(header: np.dtype = DGRAM_HEADER) -> np.ndarray:
    """The datagram header as the compiled loop reads it, derived from its one definition
    (:data:`~coded_shuffle.costs.wire.DGRAM_HEADER`): the offsets of ``seq`` (little-endian
    u32) and ``flags`` (little-endian u16) and the header's size, then one entry per header
    byte, 1 where the byte must equal this round's header (the job, the stream, the round)."""
    for field, kind in (("seq", "<u4"), ("flags", "<u2")):
        if header.fields[field][0] != np.dtype(kind):
            raise ValueError(
                f"the compiled loop reads {field} as {kind}, the header has it as "
                f"{header.fields[field][0].str}"
            )
    seq, flags = header.fields["seq"][1], header.fields["flags"][1]
    mask = np.ones(header.itemsize, dtype=np.int64)
    mask[seq : seq + 4] = 0
    mask[flags : flags + 2] = 0
    return np.concatenate([[seq, flags, header.itemsize], mask]).astype(np.int64)


# libc's, linked by name (a ctypes function's address would keep numba from caching the loop)
_recvmsg = types.ExternalFunction("recvmsg", types.intp(types.int32, types.voidptr, types.int32))
_DONTWAIT = int(socket.MSG_DONTWAIT)
_SOL_UDP = int(socket.SOL_UDP)


@njit(cache=True, nogil=True, boundscheck=False)
def _u32(buf: np.ndarray, at: int) -> int:
    """The little-endian 32-bit unsigned integer at ``buf[at]``, as a signed 64-bit one."""
    value = np.int64(0)
    for i in range(4):
        value |= np.int64(buf[at + i]) << (8 * i)
    return value


@njit(cache=True, nogil=True, boundscheck=False)
def _segment(control: np.ndarray, length: int, nbytes: int) -> int:
    """The coalesced datagrams' size from the ``UDP_GRO`` control message (else ``nbytes``),
    as :func:`~.batches.segment_size` reads it."""
    at = 0
    while at + 16 <= length:
        size = _u32(control, at) | (_u32(control, at + 4) << 32)  # cmsg_len
        if size < 16:
            break
        if _u32(control, at + 8) == _SOL_UDP and _u32(control, at + 12) == UDP_GRO:
            value = np.int64(control[at + 16]) | (np.int64(control[at + 17]) << 8)
            if size >= 20:
                value = _u32(control, at + 16)
            return value if value else nbytes
        at += (size + 7) & ~7
    return nbytes


@njit(cache=True, nogil=True, boundscheck=False)
def _flags(buf: np.ndarray, at: int, layout: np.ndarray) -> int:
    """The flags of the datagram at ``buf[at]`` (``layout``: :func:`header_layout`)."""
    f = at + layout[FLAGS_AT]
    return np.int64(buf[f]) | (np.int64(buf[f + 1]) << 8)


@njit(cache=True, nogil=True, boundscheck=False)
def _kind(flags: int, seq: int, parity: tuple[np.ndarray, ...]) -> int:
    """What a datagram with ``flags`` and number ``seq`` is: data (-1), a repair of one of
    this stream's windows (0), or neither (-2: the stream has no such window, or the
    datagram is another kind)."""
    _, _, _, dims, _ = parity
    if flags == 0:
        return -1
    if flags & LOW_FLAGS != FLAG_PARITY or flags >> REPAIRS_SHIFT == 0:
        return -2
    return 0 if seq // STRIDE < dims[WINDOWS] else -2


@njit(cache=True, nogil=True, boundscheck=False)
def _common(
    buf: np.ndarray,
    nbytes: int,
    segment: int,
    head: np.ndarray,
    have: np.ndarray,
    parity: tuple[np.ndarray, ...],
    layout: np.ndarray,
) -> int:
    """The data datagrams in a read of the common case (-1: it is not), after checking every
    header (laid out as ``layout`` says: :func:`header_layout`) against ``head`` (this
    round's, sequence number and flags aside): data datagrams not held yet, numbered one
    after the other, and repair datagrams of this stream's windows (``parity``: the round's,
    :attr:`~.parity.Parity.arrays`)."""
    hb = layout[HEADER_BYTES]
    d = segment - hb
    k = nbytes // segment
    if d <= 0 or k * segment != nbytes or k > GRO_MAX_SEGMENTS or k == 0:
        return -1
    first, data = -1, 0
    for i in range(k):
        at = i * segment
        for b in range(hb):
            if layout[MASK + b] and buf[at + b] != head[b]:
                return -1
        seq = _u32(buf, at + layout[SEQ_AT])
        kind = _kind(_flags(buf, at, layout), seq, parity)
        if kind == -1:  # data
            if first < 0:
                first = seq
            if seq != first + data or seq >= have.size or have[seq]:
                return -1
            data += 1
        elif kind == -2:
            return -1
    return data


@njit(cache=True, nogil=True, boundscheck=False)
def _drain(
    fd: int,
    io: tuple[np.ndarray, ...],
    head: np.ndarray,
    have: np.ndarray,
    out: np.ndarray,
    missing: int,
    parity: tuple[np.ndarray, ...],
    layout: np.ndarray,
) -> None:
    """Reads until the socket is empty, ``missing`` datagrams were taken or rebuilt, or a
    read is not the common case (left in the buffer; its size and segment in ``state``).
    ``io``: the ``msghdr``, its name, the sender's address, its control buffer, the read
    buffer and the state; ``out``: the round's slots, ``out.size // have.size`` stream bytes
    per datagram; ``parity``: the round's (:attr:`~.parity.Parity.arrays`); ``layout``: the
    header's (:func:`header_layout`)."""
    msg, name, source, control, buf, state = io
    d, hb = out.size // have.size, layout[HEADER_BYTES]
    state[TAKEN] = 0
    state[INGRESS] = 0
    state[REBUILT] = 0
    while state[TAKEN] + state[REBUILT] < missing:
        msg[NAMELEN] = name.size
        msg[CONTROLLEN] = control.size
        msg[FLAGS] = 0
        nbytes = _recvmsg(fd, msg.ctypes.data, _DONTWAIT)
        if nbytes < 0:
            state[STATUS] = EMPTY
            return
        segment = _segment(control, msg[CONTROLLEN], nbytes)
        state[NBYTES] = nbytes
        state[SEGMENT] = segment
        k = -1
        if segment == hb + d and msg[NAMELEN] == name.size:
            same = True
            for b in range(source.size):
                same = same and name[b] == source[b]
            if same:
                k = _common(buf, nbytes, segment, head, have, parity, layout)
        if k < 0:
            state[STATUS] = OTHER
            return
        for i in range(nbytes // segment):
            at = i * segment
            if _flags(buf, at, layout) == 0:  # data
                seq = _u32(buf, at + layout[SEQ_AT])
                out[seq * d : (seq + 1) * d] = buf[at + hb : at + segment]
                have[seq] = True
        state[TAKEN] += k
        for i in range(nbytes // segment):  # after the data: its window may lack fewer
            at = i * segment
            flags = _flags(buf, at, layout)
            if flags == 0:
                continue  # data; :func:`_common` found every other datagram a repair
            seq = _u32(buf, at + layout[SEQ_AT])
            state[REBUILT] += keep(seq, flags, buf[at + hb : at + segment], out, have, parity)
        state[INGRESS] += nbytes
    state[STATUS] = DONE


def sockaddr(address: tuple[str, int]) -> np.ndarray:
    """The first 8 bytes of the ``sockaddr_in`` a datagram from ``address`` arrives with."""
    host, port = address
    raw = socket.AF_INET.to_bytes(2, "little") + port.to_bytes(2, "big") + socket.inet_aton(host)
    return np.frombuffer(raw, dtype=np.uint8).copy()


class Drain:
    """One receiving socket's compiled reads into ``buffer`` (the reads' buffer the
    interpreter's path uses too: a read left over is there)."""

    def __init__(self, sock: socket.socket, buffer: np.ndarray) -> None:
        self.fd, self.buffer = sock.fileno(), buffer
        self.name = np.zeros(NAME_BYTES, dtype=np.uint8)
        self.control = np.zeros(CONTROL_BYTES, dtype=np.uint8)
        self.iov = np.array([buffer.ctypes.data, min(buffer.size, RECEIVE_BYTES)], np.int64)
        self.msg = np.zeros(7, dtype=np.int64)  # points at the arrays above: kept with them
        self.msg[[NAME, IOV, IOVLEN, CONTROL]] = (
            self.name.ctypes.data,
            self.iov.ctypes.data,
            1,
            self.control.ctypes.data,
        )
        self.state = np.zeros(len(STATE), dtype=np.int64)
        self.source = np.zeros(8, dtype=np.uint8)
        self.layout = header_layout()

    def _io(self) -> tuple[np.ndarray, ...]:
        return self.msg, self.name, self.source, self.control, self.buffer, self.state

    def expect(self, sender: tuple[str, int]) -> None:
        """Reads from any address but ``sender`` are left to the interpreter."""
        self.source[:] = sockaddr(sender)

    def warm(self) -> None:
        """Compiles (or loads from numba's cache) the loop now, not in the first delivery: a
        read of no socket, which takes nothing."""
        head = np.zeros(DGRAM_HEADER.itemsize, dtype=np.uint8)
        none, one = np.zeros(1, dtype=bool), np.zeros(1, dtype=np.uint8)
        _drain(-1, self._io(), head, none, one, 1, Parity(1, 1, 0).arrays, self.layout)

    def run(self, now: Round) -> int:
        """Takes the common reads into ``now``'s slots (its counts updated); returns
        :data:`EMPTY`, :data:`DONE`, or :data:`OTHER` (:attr:`nbytes` and :attr:`segment`
        describe the read left in the buffer, :meth:`sender` where it came from)."""
        slots = now.out[: now.have.size * now.d]
        missing = now.have.size - now.count
        parity = now.parity.arrays
        _drain(self.fd, self._io(), now.head, now.have, slots, missing, parity, self.layout)
        taken, rebuilt = int(self.state[TAKEN]), int(self.state[REBUILT])
        now.count += taken + rebuilt
        now.received += taken
        now.rebuilt += rebuilt
        now.counts.ingress += int(self.state[INGRESS])
        return int(self.state[STATUS])

    @property
    def taken(self) -> int:
        """Datagrams the last :meth:`run` took."""
        return int(self.state[TAKEN])

    @property
    def nbytes(self) -> int:
        return int(self.state[NBYTES])

    @property
    def segment(self) -> int:
        return int(self.state[SEGMENT])

    def sender(self) -> tuple[str, int]:
        """The address the read left in the buffer came from."""
        raw = self.name.tobytes()
        return socket.inet_ntoa(raw[4:8]), int.from_bytes(raw[2:4], "big")
