"""``chain``: a pipelined relay broadcast, ``0 -> w_1 -> w_2 -> ... -> w_K``.

The master sends every message once, to the first worker of the chain; every worker forwards
each piece of a message to the next one as soon as it has arrived: on the socket plane,
whatever one receive returns (up to ``segment_bytes``, 64 KiB by default: cut-through, so a
relay waits for no whole segment, which at 4 Mbit/s cost 0.4 s a delivery); on gloo's plane
each *segment* of ``segment_bytes``, while the following ones are already on their way
(``window`` segments received ahead, sends in flight at the same time). So every link of the
chain is busy at once: the time is about ``R / B`` plus the relays' delays (``R`` bytes, NICs
of ``B`` bytes/s; on gloo's plane ``(K - 1) * segment / B``), and the master's egress is the
payload once. A message goes to its checks once all its segments are
in. A relay forwards only the messages that some worker after it keeps a row of: the master
sends each stream's *reach table* first (for every message, the position of the last worker
that keeps one of its rows, :func:`~coded_shuffle.costs.wire.chain_reach`), and every relay
passes it on; an uncoded stream, ordered by worker, crosses about ``(K + 1) / 2`` links instead
of ``K``. Point-to-point transfers go over plain TCP connections (``plane: socket``, the default:
:mod:`~coded_shuffle.distributed.transports.sockets`, payloads received into place and relayed
from there) or through gloo's ``isend``/``irecv`` (``plane: gloo``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from coded_shuffle.costs.model import BroadcastCost, Network, Reach, Traffic
from coded_shuffle.costs.wire import REACH_DTYPE, chain_bytes, chain_reach
from coded_shuffle.distributed.transports.base import KeyName, OnMessage, Peer, Stream, Transport
from coded_shuffle.distributed.transports.sockets import (
    SocketPlane,
    Targets,
    check_plane,
    landing,
    receive_into,
    relay_into,
    send_message,
)
from coded_shuffle.errors import UsageError, VerificationError

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
    """The most a relay forwards at once (socket plane: what one receive returned, up to
    this; gloo plane: a message is cut into segments of this), >= 1024."""
    plane: str = "socket"
    """socket (plain TCP connections, payloads sent from the rows and received into place) |
    gloo (its point-to-point calls): transports.md, "Data planes"."""

    def check(self, world_size: int | None, name: KeyName) -> None:
        check_plane(self.plane, name)
        if int(self.window) < 1:
            raise UsageError(f"{name('window')}={self.window} out of range (must be >= 1)")
        if int(self.segment_bytes) < 1024:
            raise UsageError(
                f"{name('segment_bytes')}={self.segment_bytes} out of range (must be >= 1024)"
            )
        if world_size is not None:  # known once the job has started
            chain_order(self.order, world_size, name("order"))


class ChainCost(BroadcastCost):
    """Relayed cut-through: every link of the chain busy at once, each taking the messages
    that cross it one after another, a message starting on a link no sooner than it started
    on the one before and ending no sooner than it ended there (the relays' socket buffers
    hold what a slow link has not taken yet). A message crosses as far as the last worker that
    keeps one of its rows (``reach``, from the plan, in the relay order; None: every message
    every link, the stream at the slowest link's rate). The workers relay fastest first (the
    cluster command orders the chain so: a slow host last slows only what reaches it, and
    what reaches it early in the stream overlaps the rest). On a switch ``K - 1`` frames more
    (what a relay receives before it forwards). On a shared medium every relay's copy
    crosses it: every message on as many links as it reaches (``reach.links`` per byte;
    None: ``K``)."""

    def busy(self, stream: float, traffic: Traffic, net: Network, reach: Reach | None) -> float:
        k = traffic.workers
        rates = net.receivers(k)
        between = tuple(map(min, rates, rates[1:]))  # a relay's link to the next
        if net.topology == "shared":
            medium = net.tcp(stream * (k if reach is None else reach.links)) / (net.rate / 8)
            links = (rates[0], *between)
            relays = 0.0 if reach is None else self.relayed(net.tcp(stream), reach, links)
            return max(medium, relays)
        into = (min(net.master_rate / 8, rates[0]), *between)
        if reach is None:
            busy = net.tcp(stream) / min(into)
        else:
            busy = self.relayed(net.tcp(stream), reach, into)
        return busy + (k - 1) * net.tcp(min(stream, net.mtu)) / rates[-1]

    @staticmethod
    def relayed(wire: float, reach: Reach, into: tuple[float, ...]) -> float:
        """Seconds until the last message has crossed the last link it crosses: the stream's
        ``wire`` bytes (TCP/IP and Ethernet framing included) in ``reach``'s messages (their
        sizes scaled to it), the link into position ``j + 1`` at ``into[j]`` bytes/s."""
        sizes = np.asarray(reach.sizes, dtype=float)
        sizes *= wire / max(sizes.sum(), 1.0)
        ends = np.asarray(reach.ends)
        began, done, last = np.zeros(sizes.size), np.zeros(sizes.size), 0.0
        for j, rate in enumerate(into):
            free = 0.0
            for i in np.flatnonzero(ends > j):
                began[i] = max(free, began[i])
                done[i] = max(began[i] + sizes[i] / rate, done[i])
                free = done[i]
            last = max(last, free)
        return last


class Chain(Transport):
    """Relay broadcast through the workers in :attr:`order`, pipelined by message."""

    name = "chain"
    summary = "pipelined relay 0 -> 1 -> ... -> K: the master sends the payload once"
    routing = "broadcast"
    prunes = True
    Options = ChainOptions
    cost = ChainCost()

    def __init__(self, peer: Peer, options: ChainOptions | None = None) -> None:
        super().__init__(peer, options)
        self.order = chain_order(self.options.order, peer.world_size)
        self.window = int(self.options.window)
        self.segment = int(self.options.segment_bytes)
        path = (0, *self.order)
        at = path.index(peer.rank)
        self.position = at  # 0: the master, 1..K: the workers in relay order
        self.prev = path[at - 1] if at > 0 else None
        self.next = path[at + 1] if at + 1 < len(path) else None
        self.prev_label = peer.label(self.prev) if self.prev is not None else ""  # in errors
        self.plane = SocketPlane(peer, lambda: self.counts) if self.zero_copy else None

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
        keepers: Sequence[np.ndarray] | None = None,
    ) -> None:
        """``keepers[i]`` (at the master; None: every message to every worker):
        :func:`~coded_shuffle.costs.wire.message_keepers` of stream ``i`` (a relay takes its
        reach table from the wire instead)."""
        self.check_streams(streams)
        for i, stream in enumerate(streams):
            reach = self._reach_table(stream, None if keepers is None else keepers[i])
            if self.plane is not None and self.prev is None:
                self._send_sockets(outgoing[i])
            elif self.plane is not None:
                self._relay_sockets(i, stream, reach, on_message, targets)
            elif self.prev is None:
                self._send_all(outgoing[i])
            else:
                self._relay(stream, reach, lambda j, buf, i=i: on_message(i, j, buf))

    def network_bytes(self, stream: Stream, keepers: np.ndarray | None) -> int:
        """The bytes ``stream`` puts on the chain's links (its byte model, from the plan)."""
        return chain_bytes(stream.sizes, self._reach(stream, keepers), len(self.order))

    def _reach(self, stream: Stream, keepers: np.ndarray | None) -> np.ndarray:
        k, m = len(self.order), len(stream.sizes)
        if keepers is None:
            return np.full(m, k, dtype=REACH_DTYPE)
        if keepers.shape != (k, m):
            raise ValueError(f"keepers of shape {keepers.shape}, expected {(k, m)}")
        return chain_reach(keepers, self.order)

    def _reach_table(self, stream: Stream, keepers: np.ndarray | None) -> np.ndarray:
        """The stream's reach table: computed at the master, received from the previous rank
        elsewhere (and checked), passed on to the next; counted as control bytes."""
        k, m = len(self.order), len(stream.sizes)
        if m == 0:
            return np.zeros(0, dtype=REACH_DTYPE)
        if self.prev is None:
            reach = self._reach(stream, keepers)
        else:
            reach = np.empty(m, dtype=REACH_DTYPE)
            if self.plane is not None:
                receive_into(
                    self.plane.of(self.prev),
                    memoryview(reach).cast("B"),
                    self.prev_label,
                )
            else:
                dist.recv(_bytes_of(reach), self.peer.at(self.prev), group=self.peer.group, tag=TAG)
            self.counts.ingress += reach.nbytes
            if reach.min() < 1 or reach.max() > k:
                raise VerificationError(
                    f"{self.prev_label} passed a chain reach table with positions "
                    f"{int(reach.min())}..{int(reach.max())}, outside 1..{k}"
                )
        if self.next is not None:
            if self.plane is not None:
                self.plane.to(self.next).sendall(memoryview(reach).cast("B"))
            else:
                dist.send(_bytes_of(reach), self.peer.at(self.next), group=self.peer.group, tag=TAG)
            self.counts.egress += reach.nbytes
            self.counts.control += reach.nbytes
        return reach

    def _send_sockets(self, messages: Iterable[Any]) -> None:
        assert self.plane is not None
        if self.next is None:
            return
        conn = self.plane.to(self.next)
        for m in messages:
            self.counts.egress += send_message(conn, m)

    def _relay_sockets(
        self,
        index: int,
        stream: Stream,
        reach: np.ndarray,
        on_message: OnMessage,
        targets: Targets | None,
    ) -> None:
        """Every message that reaches this rank, from the previous one; where it reaches
        further, its header forwarded at once and its payload segment by segment as it
        arrives (into place where ``targets`` says), to the next."""
        assert self.plane is not None and self.prev is not None
        src = self.plane.of(self.prev)
        dst = self.plane.to(self.next) if self.next is not None else None
        who = self.prev_label
        for j, size in enumerate(stream.sizes):
            if reach[j] < self.position:
                continue
            out = dst if reach[j] > self.position else None
            target = targets(index, j) if targets is not None else None
            buf, head, payload = landing(size, target)
            receive_into(src, head, who)
            if out is not None:
                out.sendall(head)
            relay_into(src, payload, out, self.segment, who)
            self.counts.ingress += size
            self.counts.egress += size if out is not None else 0
            on_message(index, j, buf)

    def segments(self, size: int) -> list[tuple[int, int]]:
        """``(start, end)`` of every segment of a message of ``size`` bytes."""
        return [(a, min(a + self.segment, size)) for a in range(0, max(size, 1), self.segment)]

    def _send_all(self, messages: Iterable[torch.Tensor]) -> None:
        if self.next is None:
            return
        sends: deque = deque()
        to = self.peer.at(self.next)
        for m in messages:
            for a, b in self.segments(m.numel()):
                sends.append((m, dist.isend(m[a:b], to, group=self.peer.group, tag=TAG)))
                _settle(sends, IN_FLIGHT * self.window)
            self.counts.egress += m.numel()
        _settle(sends, 0)

    def _relay(
        self,
        stream: Stream,
        reach: np.ndarray,
        on_message: Callable[[int, torch.Tensor], None],
    ) -> None:
        """Receives every segment that reaches this rank from the previous one and forwards
        it to the next one where it reaches further; each message goes to ``on_message`` once
        its last segment is in, while later ones arrive. Buffers live only while a message is
        in flight: memory stays bounded whatever the stream."""
        sizes, group, here = stream.sizes, self.peer.group, self.position
        assert self.prev is not None
        prev = self.peer.at(self.prev)
        nxt = self.peer.at(self.next) if self.next is not None else -1
        segs = [
            (i, a, b)
            for i, size in enumerate(sizes)
            if reach[i] >= here
            for a, b in self.segments(size)
        ]
        bufs: dict[int, torch.Tensor] = {}
        recvs: deque = deque()
        sends: deque = deque()
        posted = 0
        for k, (i, a, b) in enumerate(segs):
            while posted < len(segs) and posted < k + self.window:
                j, pa, pb = segs[posted]
                if j not in bufs:
                    bufs[j] = torch.empty(sizes[j], dtype=torch.uint8)
                recvs.append(dist.irecv(bufs[j][pa:pb], prev, group=group, tag=TAG))
                posted += 1
            recvs.popleft().wait()
            buf = bufs[i]
            forward = self.next is not None and reach[i] > here
            if forward:
                sends.append((buf, dist.isend(buf[a:b], nxt, group=group, tag=TAG)))
            if b == sizes[i]:  # the message's last segment: it is whole
                self.counts.ingress += sizes[i]
                self.counts.egress += sizes[i] if forward else 0
                on_message(i, bufs.pop(i))
            _settle(sends, IN_FLIGHT * self.window)
        _settle(sends, 0)


def _bytes_of(array: np.ndarray) -> torch.Tensor:
    """A numpy array's bytes as a uint8 tensor (shared memory: gloo receives into it)."""
    return torch.from_numpy(array.view(np.uint8))


def _settle(sends: deque, keep: int) -> None:
    """Waits for the oldest sends until at most ``keep`` are in flight (their buffers freed)."""
    while len(sends) > keep:
        sends.popleft()[1].wait()
