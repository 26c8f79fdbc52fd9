"""``unicast``: the master sends each worker exactly the rows it needs, nothing else.

The honest uncoded baseline when only the master holds the data: every worker's stream goes
straight to it (``plane: socket``, the default: a plain TCP connection per worker, one sender
thread each, :mod:`~coded_shuffle.distributed.transports.sockets`; or gloo ``isend``/``irecv``),
all streams in flight at once so that the master's NIC is never idle. The master's egress is
the sum of what the workers need (the placement included); a row that two workers need travels
twice. Coded symbols are meant for several workers at once, so a coded scheme on this
transport is a configuration error.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

import torch
import torch.distributed as dist

from coded_shuffle.costs.model import Cost, Network, Reach, Traffic
from coded_shuffle.distributed.transports.base import (
    KeyName,
    OnMessage,
    Peer,
    Stream,
    Transport,
    empty_messages,
)
from coded_shuffle.distributed.transports.sockets import (
    SocketPlane,
    Targets,
    check_plane,
    receive_message,
    send_message,
)

TAG = 0x7563  # gloo tag of direct point-to-point messages
IN_FLIGHT = 8  # messages in flight per destination at a sender


@dataclass
class UnicastOptions:
    """``dist.unicast`` / ``CodedShuffle(transport_options=...)`` of ``unicast``."""

    plane: str = "socket"
    """socket (plain TCP connections, payloads sent from the rows and received into place) |
    gloo (its point-to-point calls): transports.md, "Data planes"."""

    def check(self, world_size: int | None, name: KeyName) -> None:
        del world_size
        check_plane(self.plane, name)


class UnicastCost(Cost):
    """The master's streams at once: the master's NIC carries ``R_u`` (a shared medium: at the
    slower of the master's NIC and the medium), each worker's NIC its ``1 / K`` share (the
    slowest worker's bounds it)."""

    def busy(self, stream: float, traffic: Traffic, net: Network, reach: Reach | None) -> float:
        del reach
        k = traffic.workers
        share = net.tcp(stream / k) / net.slowest(k)
        master = net.master_rate / 8
        if net.topology == "shared":
            master = min(master, net.rate / 8)
        return max(net.tcp(stream) / master, share)


class Unicast(Transport):
    """Point-to-point streams, each to one worker; the master is the only sender."""

    name = "unicast"
    summary = "uncoded only: the master sends each worker its own rows (placement included)"
    routing = "master"
    Options = UnicastOptions
    cost = UnicastCost()

    def __init__(self, peer: Peer, options: Any = None) -> None:
        super().__init__(peer, options)
        self.plane = SocketPlane(peer, lambda: self.counts) if self.zero_copy else None

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
        if self.plane is not None:
            self._exchange_sockets(streams, outgoing, on_message, targets)
            return
        me, group = self.peer.rank, self.peer.group
        inbound = []  # (stream, message index, buffer, work), in posting order
        for i, stream in enumerate(streams):
            if me in stream.dsts:
                for j, buf in enumerate(empty_messages(stream.sizes)):
                    src = self.peer.at(stream.src)
                    inbound.append((i, j, buf, dist.irecv(buf, src, group=group, tag=TAG)))
                self.counts.ingress += stream.total
        sends: deque = deque()
        mine = [_addressed(s.dsts[0], outgoing[i]) for i, s in enumerate(streams) if s.src == me]
        # round robin over the destinations: every stream makes progress together
        for batch in zip_longest(*mine):
            for item in batch:
                if item is not None:
                    dst, m = item
                    sends.append((m, dist.isend(m, self.peer.at(dst), group=group, tag=TAG)))
                    self.counts.egress += m.numel()
            while len(sends) > IN_FLIGHT * len(mine):  # bounded memory at the sender
                sends.popleft()[1].wait()
        for i, j, buf, work in _arrival_order(inbound):
            work.wait()
            on_message(i, j, buf)
        for _, w in sends:
            w.wait()

    def _exchange_sockets(
        self,
        streams: Sequence[Stream],
        outgoing: Mapping[int, Iterable[Any]],
        on_message: OnMessage,
        targets: Targets | None,
    ) -> None:
        """Every stream this rank sends on a thread of its own (all destinations at once),
        every stream it receives in turn, payloads into place where ``targets`` says."""
        assert self.plane is not None
        me, plane = self.peer.rank, self.plane
        errors: list[BaseException] = []
        sent = [0] * len(streams)

        def send(i: int, conn: Any) -> None:
            try:
                for m in outgoing[i]:
                    sent[i] += send_message(conn, m)
            except BaseException as exc:  # re-raised by the caller
                errors.append(exc)

        threads = [
            threading.Thread(target=send, args=(i, plane.to(s.dsts[0])), daemon=True)
            for i, s in enumerate(streams)
            if s.src == me
        ]
        for t in threads:
            t.start()
        try:
            for i, stream in enumerate(streams):
                if me not in stream.dsts:
                    continue
                conn = plane.of(stream.src)
                for j, size in enumerate(stream.sizes):
                    target = targets(i, j) if targets is not None else None
                    msg = receive_message(conn, size, target, self.peer.label(stream.src))
                    on_message(i, j, msg)
                self.counts.ingress += stream.total
        finally:
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        self.counts.egress += sum(sent)


def _addressed(dst: int, messages: Iterable[torch.Tensor]) -> Iterator[tuple[int, torch.Tensor]]:
    for m in messages:
        yield dst, m


def _arrival_order(inbound: list) -> list:
    """Messages of several streams interleaved, each stream in order (round robin)."""
    by_stream: dict[int, list] = {}
    for item in inbound:
        by_stream.setdefault(item[0], []).append(item)
    out = []
    for batch in zip_longest(*by_stream.values()):
        out.extend(item for item in batch if item is not None)
    return out
