"""``multicast``'s datagrams in batches: one system call moves many of them.

A datagram fits one Ethernet frame (no IP fragments). The master hands the kernel a batch of
datagrams laid end to end in one buffer with ``UDP_SEGMENT`` (generic segmentation offload,
Linux 4.18): the kernel, or the NIC, cuts it into datagrams of one size (the last may be
shorter), each a frame with its own UDP/IP headers and the job's 20-byte header. A receiver
sets ``UDP_GRO`` (Linux 5.0): the kernel hands it a run of datagrams of one flow as one read,
with their size in a control message; without either (an older kernel, a NIC without the
offload) the same code sends and reads one datagram per call. What crosses a link is the same
frames either way: the byte counts and the cost model count datagrams, not calls.
"""

from __future__ import annotations

import socket
import struct

import numpy as np

from coded_shuffle.costs.wire import DGRAM_HEADER, DGRAM_HEADER_BYTES
from coded_shuffle.distributed.transports.multicast.parity import FLAG_PARITY, REPAIRS_SHIFT

UDP_SEGMENT, UDP_GRO = 103, 104  # linux/udp.h (the socket module names neither)
FLAG_END = 2  # a round's last datagram: its header alone, after every datagram of the round
GSO_MAX_BYTES = 65507  # one UDP send: what an IPv4 length field allows
GSO_MAX_SEGMENTS = 64  # UDP_MAX_SEGMENTS (linux/udp.h): the kernel's cap on one send
BURST_SECONDS = 0.001  # a batch is at most a millisecond on the wire at the rate
GATHER_MAX_SECONDS = 0.003  # a receiver's pause between reads while the stream flows
GATHER_MIN_SECONDS = 0.0005  # ... and none where its buffer allows less than this
RECEIVE_BYTES = 1 << 17  # a read: a coalesced run (at most 64 KiB) or one datagram
GRO_MAX_SEGMENTS = 64  # datagrams the kernel coalesces into one read at most (UDP_GRO_CNT_MAX)
GRO_CMSG_BYTES = socket.CMSG_SPACE(4)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)


def batch_datagrams(rate: float, frame_bytes: int, datagram_bytes: int) -> int:
    """Datagrams per send: a millisecond of frames at ``rate`` bits/s (the emulated cluster's
    shapers pass a burst of 2 ms whole), within the kernel's limits; 1 means no batching."""
    by_time = int(rate * BURST_SECONDS / 8 // frame_bytes)
    by_size = GSO_MAX_BYTES // (DGRAM_HEADER_BYTES + datagram_bytes)
    return max(1, min(by_time, by_size, GSO_MAX_SEGMENTS))


def gather_seconds(rate: float, buffer_bytes: int) -> float:
    """How long a receiver that emptied its socket while the stream flows pauses before it
    reads again, so that one wake-up takes many datagrams (each wake-up costs a context
    switch and the interpreter's turn): :data:`GATHER_MAX_SECONDS`, or less where a quarter
    of the socket's receive buffer (``buffer_bytes``, as the kernel reports it) fills sooner
    at ``rate`` bits/s; 0 (it reads at the next datagram) below :data:`GATHER_MIN_SECONDS`."""
    seconds = min(GATHER_MAX_SECONDS, buffer_bytes / 4 / (rate / 8)) if rate > 0 else 0.0
    return seconds if seconds >= GATHER_MIN_SECONDS else 0.0


def enable_gro(sock: socket.socket) -> bool:
    """Asks the kernel to coalesce this socket's datagrams; False where it cannot."""
    try:
        sock.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    except OSError:
        return False
    return True


def set_buffer(sock: socket.socket, send: bool, nbytes: int) -> None:
    """Sets ``sock``'s send (``send``) or receive buffer to ``nbytes``: ``SO_SNDBUFFORCE`` /
    ``SO_RCVBUFFORCE`` where privileged (the emulated cluster), else ``SO_SNDBUF`` /
    ``SO_RCVBUF`` within the kernel's cap; the kernel doubles either for its bookkeeping
    (socket(7))."""
    force, plain = (
        (SO_SNDBUFFORCE, socket.SO_SNDBUF) if send else (SO_RCVBUFFORCE, socket.SO_RCVBUF)
    )
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, nbytes)
    except OSError:  # not privileged: the kernel's cap applies
        sock.setsockopt(socket.SOL_SOCKET, plain, nbytes)


def enlarge_send_buffer(sock: socket.socket, nbytes: int) -> int:
    """Lets ``sock`` hold ``nbytes`` in flight (never less than it held); returns what it holds."""
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2 < nbytes:
        set_buffer(sock, True, nbytes)
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2


def segment_size(ancdata: list, nbytes: int) -> int:
    """The size of the datagrams a read coalesced (``UDP_GRO``'s control message), or the
    whole read where it holds one datagram."""
    for level, kind, value in ancdata:
        if level == socket.SOL_UDP and kind == UDP_GRO and len(value) >= 2:
            (size,) = struct.unpack("=i", value[:4].ljust(4, b"\0"))
            return size or nbytes
    return nbytes


class SendBatch:
    """The master's buffer of up to ``capacity`` datagrams of ``d`` stream bytes each,
    headers in place, sent with one call (``UDP_SEGMENT``) or one call per datagram where
    the kernel refuses segmentation."""

    def __init__(self, sock: socket.socket, capacity: int, d: int) -> None:
        self.sock, self.d, self.capacity = sock, d, capacity
        self.rows = np.zeros(capacity, dtype=[("head", DGRAM_HEADER), ("payload", np.uint8, (d,))])
        self.raw = self.rows.view(np.uint8).reshape(-1)
        self.segment = DGRAM_HEADER_BYTES + d
        self.gso = capacity > 1
        self.cmsg = [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("=H", self.segment))]

    def send(
        self,
        data: np.ndarray,
        seqs: np.ndarray,
        stream: tuple[int, int, int],
        size: int,
        to: tuple[str, int] | None = None,
    ) -> int:
        """Datagrams ``seqs`` (ascending) of the first ``size`` bytes of ``data`` (zero padded
        to whole datagrams) with header ``stream`` = (job, stream, round), to the socket's
        group or to ``to``; returns the bytes handed to the socket."""
        k, d = seqs.size, self.d
        head = self.rows["head"][:k]
        head["job"], head["stream"], head["round"] = stream
        head["seq"], head["flags"] = seqs, 0
        first = int(seqs[0])
        if int(seqs[-1]) - first == k - 1:  # one run (every first round): copied once
            self.rows["payload"][:k] = data[first * d : (first + k) * d].reshape(k, d)
        else:
            self.rows["payload"][:k] = data.reshape(-1, d)[seqs]
        last = min(d, size - int(seqs[-1]) * d)  # the stream's last datagram may be shorter
        return self._flush(k, (k - 1) * self.segment + DGRAM_HEADER_BYTES + last, to)

    def send_repairs(
        self, repairs: np.ndarray, first: int, count: int, stream: tuple[int, int, int]
    ) -> int:
        """Repair datagrams ``repairs`` (at most ``capacity`` rows of ``d`` bytes) of a window
        of ``count`` repairs, numbered ``first``, ``first + 1``, ..., with header ``stream``
        and the repair flags (:mod:`~.parity`), in one call; returns the bytes handed over."""
        k = repairs.shape[0]
        head = self.rows["head"][:k]
        head["job"], head["stream"], head["round"] = stream
        head["seq"] = np.arange(first, first + k)
        head["flags"] = FLAG_PARITY | count << REPAIRS_SHIFT
        self.rows["payload"][:k] = repairs
        return self._flush(k, k * self.segment)

    def send_end(self, stream: tuple[int, int, int], to: tuple[str, int] | None = None) -> int:
        """The round's end (header ``stream`` with the end flag, no payload), to the socket's
        group or to ``to``: a receiver that reads it has read every datagram of the round it
        will get (one path, in order); returns the bytes handed over."""
        head = self.rows["head"][:1]
        head["job"], head["stream"], head["round"] = stream
        head["seq"], head["flags"] = 0, FLAG_END
        return self._flush(1, DGRAM_HEADER_BYTES, to)

    def _flush(self, k: int, length: int, to: tuple[str, int] | None = None) -> int:
        """The first ``k`` datagrams of the buffer (``length`` bytes) handed to the socket, for
        its group or for ``to``."""
        view = memoryview(self.raw)[:length]
        where = () if to is None else (0, to)
        if k > 1 and self.gso:
            try:
                return self.sock.sendmsg([view], self.cmsg, *where)
            except OSError:  # no segmentation offload on this path: one call per datagram
                self.gso = False
        step = self.segment
        one = [view[i : i + step] for i in range(0, length, step)]
        return sum(self.sock.sendmsg([datagram], [], *where) for datagram in one)


def headers(buffer: np.ndarray, nbytes: int, segment: int) -> np.ndarray:
    """The headers of the datagrams a read of ``nbytes`` holds, every ``segment`` bytes."""
    k = -(-nbytes // segment)
    return np.ndarray((k,), dtype=DGRAM_HEADER, buffer=buffer, strides=(segment,))


def payloads(buffer: np.ndarray, k: int, segment: int, d: int) -> np.ndarray:
    """The stream bytes of the first ``k`` datagrams of a read, ``d`` each (a view; the last
    one's may run past its datagram into the read buffer's spare room)."""
    return np.ndarray((k, d), np.uint8, buffer, DGRAM_HEADER_BYTES, (segment, 1))
