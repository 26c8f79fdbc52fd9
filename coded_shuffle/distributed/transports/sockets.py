"""The ``socket`` data plane: plain TCP connections between ranks, for ``unicast`` and ``chain``.

Over gloo every message is a point-to-point call (a chain relay makes four per 256 KiB
message) and the bytes pass through a fresh buffer, a CRC-32 and a copy into place. This plane
moves the same framed messages over one TCP connection per pair of ranks: the master sends a
header and the rows it points at in one ``sendmsg`` (no copy into a message buffer), a worker
reads the header, then the payload straight into its rows where it keeps a message whole
(:meth:`~coded_shuffle.distributed.transports.framing.Inbox.target`). Every header field is
still checked on receipt; the payload has TCP's checksum on every link and the batch SHA-256
end to end (no CRC-32: ``checksums = False``).

Every rank listens on the address that routes to the job's master (``GLOO_SOCKET_IFNAME``'s
when set); the addresses are gathered when the transport is built (a collective, like every
transport's construction). Connections open on first use and close with the transport. A
connection opens with a hello, ``rank u32, job u64`` (:data:`HELLO`, connection set-up like
TCP's handshake: not counted as message bytes); a listener keeps it only when the hello arrives
within :data:`HELLO_SECONDS`, carries the job's identifier and a rank that has not connected
yet, and comes from the address gathered for that rank. It closes any other with a log line
and counts it (:attr:`~.base.HostBytes.refused`): another job on the network, or a stranger
that announces a rank, never gets a byte in.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from coded_shuffle.costs.wire import HEADER_BYTES
from coded_shuffle.distributed.transports.base import HostBytes, KeyName, Peer
from coded_shuffle.errors import UsageError

SIOCGIFADDR = 0x8915
HELLO = struct.Struct("<IQ")  # rank, job identifier
HELLO_SECONDS = 5.0  # a rank sends its hello with the connection; a stranger may send nothing
log = logging.getLogger("coded_shuffle")
PLANES = ("gloo", "socket")  # the data planes of unicast and chain (``plane`` option)
Targets = Callable[[int, int], torch.Tensor | None]  # (stream, message) -> payload in place


def check_plane(plane: str, name: KeyName) -> None:
    """:class:`UsageError` for a ``plane`` option other than :data:`PLANES`."""
    if plane not in PLANES:
        raise UsageError(f"{name('plane')}={plane!r} unknown; valid: {', '.join(PLANES)}")


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (``SIOCGIFADDR``); ``OSError`` if it
    has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = struct.pack("256s", name.encode()[:15])
        return socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, packed)[20:24])


def local_address() -> str:
    """This host's address for the other ranks: ``GLOO_SOCKET_IFNAME``'s IPv4 address, else
    the one the kernel routes to ``MASTER_ADDR`` from (loopback when unset); ``OSError`` when
    neither is there."""
    name = os.environ.get("GLOO_SOCKET_IFNAME")
    if name:
        return interface_address(name)
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(master), 9))  # no packet: only the route is looked up
        return s.getsockname()[0]


class SocketPlane:
    """One rank's TCP connections to the others (opened on first use); ``counts()`` is where
    a refused connection is counted."""

    def __init__(self, peer: Peer, counts: Callable[[], HostBytes]) -> None:
        self.peer, self.counts = peer, counts
        self.seconds = peer.timeout.total_seconds()
        host = local_address()
        self.listener = socket.create_server((host, 0), backlog=max(64, peer.world_size))
        self.listener.settimeout(self.seconds)
        mine = (host, self.listener.getsockname()[1])
        addresses: list = [None] * peer.world_size
        dist.all_gather_object(addresses, mine, group=peer.group)
        self.addresses = [tuple(a) for a in peer.roles.by_role(addresses)]  # by role
        self.sending: dict[int, socket.socket] = {}
        self.receiving: dict[int, socket.socket] = {}

    def to(self, dst: int) -> socket.socket:
        """The connection this rank sends to ``dst`` on (from its own gathered address, which
        the listener checks)."""
        if dst not in self.sending:
            mine = (self.addresses[self.peer.rank][0], 0)
            conn = socket.create_connection(
                self.addresses[dst], timeout=self.seconds, source_address=mine
            )
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(HELLO.pack(self.peer.rank, self.peer.job))
            self.sending[dst] = conn
        return self.sending[dst]

    def of(self, src: int) -> socket.socket:
        """The connection this rank receives from ``src`` on (accepted when it arrives; any
        connection that is not a rank of this job is closed on the way)."""
        while src not in self.receiving:
            conn, address = self.listener.accept()
            rank = self._admit(conn, address[0])
            if rank is not None:
                conn.settimeout(self.seconds)
                self.receiving[rank] = conn
        return self.receiving[src]

    def _admit(self, conn: socket.socket, address: str) -> int | None:
        """The rank a new connection's hello announces, if it is this job's from that rank's
        address; else the connection closed, logged and counted (None)."""
        conn.settimeout(min(HELLO_SECONDS, self.seconds))
        buf = bytearray(HELLO.size)
        try:
            receive_into(conn, memoryview(buf), "a connecting rank")
        except OSError as exc:  # ConnectionError, a timeout
            return self._refuse(conn, address, f"no hello ({exc})")
        rank, job = HELLO.unpack(buf)
        if job != self.peer.job:
            return self._refuse(conn, address, f"job identifier {job:#018x} is not this job's")
        if not 0 <= rank < self.peer.world_size or rank == self.peer.rank:
            return self._refuse(conn, address, f"rank {rank} is no other rank of this job")
        if address != self.addresses[rank][0]:
            return self._refuse(conn, address, f"rank {rank} is at {self.addresses[rank][0]}")
        if rank in self.receiving:
            return self._refuse(conn, address, f"rank {rank} is connected already")
        return rank

    def _refuse(self, conn: socket.socket, address: str, why: str) -> None:
        conn.close()
        self.counts().refused += 1
        log.warning(f"{self.peer.label()}: refused a connection from {address}: {why}")

    def close(self) -> None:
        for conn in [*self.sending.values(), *self.receiving.values(), self.listener]:
            conn.close()
        self.sending, self.receiving = {}, {}


def receive_into(conn: socket.socket, view: memoryview, who: str) -> None:
    """Fills ``view`` from ``conn``; ``ConnectionError`` naming ``who`` if it closes first."""
    relay_into(conn, view, None, max(len(view), 1), who)


def relay_into(
    conn: socket.socket, view: memoryview, out: socket.socket | None, most: int, who: str
) -> None:
    """Fills ``view`` from ``conn`` and forwards every piece to ``out`` (if any) as soon as it
    has arrived, at most ``most`` bytes at a time (cut-through: a relay that waited for whole
    segments would hold every byte back by a segment's time at each hop)."""
    got, size = 0, len(view)
    while got < size:
        n = conn.recv_into(view[got : min(size, got + most)])
        if n == 0:
            raise ConnectionError(f"{who} closed the connection after {got} of {size} bytes")
        if out is not None:
            out.sendall(view[got : got + n])
        got += n


def send_parts(conn: socket.socket, parts: Iterable[memoryview]) -> int:
    """Sends every part in order (``sendmsg``, gathered by the kernel); the bytes sent."""
    views = [p for p in parts if len(p)]
    total = sum(len(v) for v in views)
    while views:
        sent = conn.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]
    return total


def as_view(t: torch.Tensor) -> memoryview:
    """A contiguous uint8 tensor's bytes, without a copy."""
    return memoryview(t.numpy()).cast("B")


def send_message(conn: socket.socket, message: Any) -> int:
    """Sends one message (:class:`~coded_shuffle.distributed.transports.framing.Parts` or a
    joined tensor); its bytes."""
    if isinstance(message, torch.Tensor):
        return send_parts(conn, [as_view(message)])
    return send_parts(conn, [memoryview(message.header), as_view(message.payload)])


def landing(size: int, target: torch.Tensor | None) -> tuple[torch.Tensor, memoryview, memoryview]:
    """Where a message of ``size`` bytes lands: ``(what the receiver is handed, header view,
    payload view)``; the header alone with the payload in ``target``, or the whole message in
    a buffer of its own."""
    buf = torch.empty(HEADER_BYTES if target is not None else size, dtype=torch.uint8)
    payload = as_view(target) if target is not None else as_view(buf)[HEADER_BYTES:]
    if len(payload) != size - HEADER_BYTES:
        raise ConnectionError(f"message of {size} bytes for a {len(payload)}-byte target")
    return buf, as_view(buf)[:HEADER_BYTES], payload


def receive_message(
    conn: socket.socket, size: int, target: torch.Tensor | None, who: str
) -> torch.Tensor:
    """One message of ``size`` bytes where :func:`landing` puts it; what the receiver is
    handed."""
    buf, head, payload = landing(size, target)
    receive_into(conn, head, who)
    receive_into(conn, payload, who)
    return buf
