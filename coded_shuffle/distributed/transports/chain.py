"""``chain``: a pipelined relay broadcast, ``0 -> w_1 -> w_2 -> ... -> w_K``.

The master sends every message once, to the first worker of the chain; every worker forwards
each *segment* of a message (``segment_bytes``, 64 KiB by default) to the next one as soon as
it has arrived, while the following ones are already on their way (``window`` segments
received ahead, sends in flight at the same time). So every link of the chain is busy at once:
the time is about ``R / B + (K - 1) * segment / B`` (``R`` bytes, NICs of ``B`` bytes/s; with
whole 256 KiB messages as the unit the pipeline's fill took four times longer), and the
master's egress is the payload once. A message goes to its checks once all its segments are
in. Point-to-point transfers go over plain TCP connections (``plane: socket``, the default:
:mod:`~coded_shuffle.distributed.transports.sockets`, payloads received into place and relayed
from there) or through gloo's ``isend``/``irecv`` (``plane: gloo``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from coded_shuffle.distributed.transports.base import KeyName, OnMessage, Peer, Stream, Transport
from coded_shuffle.distributed.transports.sockets import (
    SocketPlane,
    Targets,
    check_plane,
    landing,
    receive_into,
    send_message,
)
from coded_shuffle.errors import UsageError

TAG = 0x6368  # gloo tag of the chain's point-to-point messages
IN_FLIGHT = 2  # sends in flight per segment received ahead (memory bound of a relay)


def chain_order(
    order: Sequence[int] | None, world_size: int, key: str = "transport_options['order']"
) -> tuple[int, ...]:
    """The workers in relay order (default ``1..K``); :class:`UsageError` unless a permutation."""
    workers = tuple(range(1, world_size))
    if order is None or len(order) == 0:
        return workers
    got = tuple(int(r) for r in order)
    if sorted(got) != list(workers):
        raise UsageError(f"{key}={list(got)} must list every worker rank 1..{world_size - 1} once")
    return got


@dataclass
class ChainOptions:
    """``dist.chain`` / ``CodedShuffle(transport_options=...)`` of ``chain``."""

    order: list[int] | None = None
    """Worker ranks in relay order; null = 1, 2, ..., workers."""
    window: int = 16
    """Segments every relay receives ahead, >= 1."""
    segment_bytes: int = 64 << 10
    """Bytes a relay forwards at once (a message is cut into segments), >= 1024."""
    plane: str = "socket"
    """socket (plain TCP connections, payloads sent from the rows and received into place) |
    gloo (its point-to-point calls): transports.md, "Data planes"."""

    def check(self, world_size: int, name: KeyName) -> None:
        check_plane(self.plane, name)
        if int(self.window) < 1:
            raise UsageError(f"{name('window')}={self.window} out of range (must be >= 1)")
        if int(self.segment_bytes) < 1024:
            raise UsageError(
                f"{name('segment_bytes')}={self.segment_bytes} out of range (must be >= 1024)"
            )
        chain_order(self.order, world_size, name("order"))


class Chain(Transport):
    """Relay broadcast through the workers in :attr:`order`, pipelined by message."""

    name = "chain"
    summary = "pipelined relay 0 -> 1 -> ... -> K: the master sends the payload once"
    routing = "broadcast"
    Options = ChainOptions

    def __init__(self, peer: Peer, options: ChainOptions | None = None) -> None:
        super().__init__(peer, options)
        self.order = chain_order(self.options.order, peer.world_size)
        self.window = int(self.options.window)
        self.segment = int(self.options.segment_bytes)
        path = (0, *self.order)
        at = path.index(peer.rank)
        self.prev = path[at - 1] if at > 0 else None
        self.next = path[at + 1] if at + 1 < len(path) else None
        self.plane = SocketPlane(peer) if self.zero_copy else None

    def settings(self) -> dict[str, Any]:
        return {
            "order": list(self.order),
            "window": self.window,
            "segment_bytes": self.segment,
            "plane": self.options.plane,
        }

    def close(self) -> None:
        if self.plane is not None:
            self.plane.close()

    def exchange(
        self,
        streams: Sequence[Stream],
        outgoing: Mapping[int, Iterable[Any]],
        on_message: OnMessage,
        targets: Targets | None = None,
    ) -> None:
        self.check_streams(streams)
        for i, stream in enumerate(streams):
            if self.plane is not None and self.prev is None:
                self._send_sockets(outgoing[i])
            elif self.plane is not None:
                self._relay_sockets(i, stream, on_message, targets)
            elif self.prev is None:
                self._send_all(outgoing[i])
            else:
                self._relay(stream, lambda j, buf, i=i: on_message(i, j, buf))

    def _send_sockets(self, messages: Iterable[Any]) -> None:
        assert self.plane is not None
        if self.next is None:
            return
        conn = self.plane.to(self.next)
        for m in messages:
            self.counts.egress += send_message(conn, m)

    def _relay_sockets(
        self, index: int, stream: Stream, on_message: OnMessage, targets: Targets | None
    ) -> None:
        """Every message from the previous rank, its header forwarded at once and its payload
        segment by segment as it arrives (into place where ``targets`` says), to the next."""
        assert self.plane is not None and self.prev is not None
        src = self.plane.of(self.prev)
        dst = self.plane.to(self.next) if self.next is not None else None
        who = f"rank {self.prev}"
        for j, size in enumerate(stream.sizes):
            target = targets(index, j) if targets is not None else None
            buf, head, payload = landing(size, target)
            receive_into(src, head, who)
            if dst is not None:
                dst.sendall(head)
            for a, b in self.segments(len(payload)):
                receive_into(src, payload[a:b], who)
                if dst is not None:
                    dst.sendall(payload[a:b])
            self.counts.ingress += size
            self.counts.egress += size if dst is not None else 0
            on_message(index, j, buf)

    def segments(self, size: int) -> list[tuple[int, int]]:
        """``(start, end)`` of every segment of a message of ``size`` bytes."""
        return [(a, min(a + self.segment, size)) for a in range(0, max(size, 1), self.segment)]

    def _send_all(self, messages: Iterable[torch.Tensor]) -> None:
        if self.next is None:
            return
        sends: deque = deque()
        for m in messages:
            for a, b in self.segments(m.numel()):
                sends.append((m, dist.isend(m[a:b], self.next, group=self.peer.group, tag=TAG)))
                _settle(sends, IN_FLIGHT * self.window)
            self.counts.egress += m.numel()
        _settle(sends, 0)

    def _relay(self, stream: Stream, on_message: Callable[[int, torch.Tensor], None]) -> None:
        """Receives every segment from the previous rank and forwards it to the next one; each
        message goes to ``on_message`` once its last segment is forwarded, while later ones
        arrive. Buffers live only while a message is in flight: memory stays bounded whatever
        the stream."""
        sizes, group = stream.sizes, self.peer.group
        segs = [(i, a, b) for i, size in enumerate(sizes) for a, b in self.segments(size)]
        bufs: dict[int, torch.Tensor] = {}
        recvs: deque = deque()
        sends: deque = deque()
        posted = 0
        for k, (i, a, b) in enumerate(segs):
            while posted < len(segs) and posted < k + self.window:
                j, pa, pb = segs[posted]
                if j not in bufs:
                    bufs[j] = torch.empty(sizes[j], dtype=torch.uint8)
                recvs.append(dist.irecv(bufs[j][pa:pb], self.prev, group=group, tag=TAG))
                posted += 1
            recvs.popleft().wait()
            buf = bufs[i]
            if self.next is not None:
                sends.append((buf, dist.isend(buf[a:b], self.next, group=group, tag=TAG)))
            if b == sizes[i]:  # the message's last segment: it is whole
                self.counts.ingress += sizes[i]
                self.counts.egress += sizes[i] if self.next is not None else 0
                on_message(i, bufs.pop(i))
            _settle(sends, IN_FLIGHT * self.window)
        _settle(sends, 0)


def _settle(sends: deque, keep: int) -> None:
    """Waits for the oldest sends until at most ``keep`` are in flight (their buffers freed)."""
    while len(sends) > keep:
        sends.popleft()[1].wait()
