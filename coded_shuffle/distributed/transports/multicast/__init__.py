"""``multicast``: UDP IP multicast, the papers' shared link made physical.

The master cuts a stream's messages into datagrams and sends each one once to a multicast
group; the network (a switch or the emulated cluster's bridge) copies it to every worker.
Datagrams are paced, since UDP has no congestion control. After each round the master tells
every worker, over the process group, that the round is complete; the workers report what
they missed (a bitmap per worker, and how many datagrams they lost or got late, gathered at the
master; a worker that holds every datagram reports at once, without waiting for that), the
master sends every worker the union of the bitmaps and multicasts those datagrams again, round
after round, until every worker holds every byte.

Two things keep the rate up where receivers lose datagrams:

* **Adaptive pacing**: ``rate`` is the ceiling (a little below the slowest NIC); the pace
  starts there, drops by a quarter after a round in which some receiver lost or got late 2%
  of the datagrams more than the loss no pace removed (random loss), rises by a tenth after
  a round without more, and stays within ``[rate / 16, rate]`` (:class:`~.pacing.Pace`).
* **Catching up**: a master that was held up sends what fell due meanwhile at once, up to
  2 MiB of wire bytes, so a busy CPU does not slow the pace.
* **Parity**: after every window of ``parity_window`` datagrams of a stream's first round
  (the stream's last windows shorter) the master sends repair datagrams, each the XOR of a
  pseudo-random part of the window (every datagram is in 8 of them), as many as the loss
  the receivers reported of the last stream calls for; a receiver that lost a few datagrams
  of a window solves for them when its repairs arrive, without waiting for a repair round
  (:mod:`~.parity`). Parity is sent while the network loses datagrams (the first stream,
  and every stream after a lossy one) and not after a clean one.

Repairs and parity datagrams are counted (:attr:`HostBytes.repairs`, :attr:`HostBytes.parity`),
and so is the feedback (:attr:`HostBytes.control`, its share of a host's egress). ``drop``
(debug) makes every receiver discard that fraction of the datagrams it gets; ``slow_seconds``
(debug) makes rank 1 sleep after every datagram it reads (a receiver that cannot keep up).

Under ``peer-multicast`` (:mod:`~coded_shuffle.distributed.transports.peer_multicast`) any
worker is a stream's sender as the master is here: its receivers report to it, it repairs, and
a rank the stream is not for (the master) takes no part; every rank's sending address is known
to all, and a receiver drops, uncounted, the datagrams of the job's other senders (its own,
looped back, among them).

Only the stream's sender in the job is heard: every datagram carries the job's identifier
(:func:`~coded_shuffle.distributed.transports.base.job_identifier`), and a receiver drops,
and counts (:attr:`HostBytes.foreign`), any datagram that carries another or does not come from
the sender's address and port (which every rank hands to every other when the transport is
built). Unless ``group`` and ``port`` are set, they are derived from the identifier
(:func:`~.options.job_group`), so two jobs on one network do not even share a group.

Datagram: ``job u64, stream u32, seq u32, round u16, flags u16`` (20 bytes) + up to
``datagram_bytes`` of the stream's message bytes at offset ``seq * datagram_bytes`` (a repair
datagram: flag 1, its window's count of repairs in the high byte of the flags, ``seq`` the
window's number times 256 and its own, ``datagram_bytes`` long: :mod:`~.parity`).
The messages inside keep their own headers, checked as for every transport; their payloads
carry no CRC-32 (``digests``): UDP's checksum covers every datagram on the way, the master's
SHA-256 every worker's batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from coded_shuffle.costs.model import BroadcastCost, Network, Reach, Traffic
from coded_shuffle.costs.rates import parse_rate
from coded_shuffle.costs.wire import (
    DGRAM_HEADER_BYTES,
    default_datagram_bytes,
    wire_bytes,
)
from coded_shuffle.distributed.transports.base import OnMessage, Peer, Stream, Transport
from coded_shuffle.distributed.transports.multicast.batches import (
    GRO_CMSG_BYTES,
    RECEIVE_BYTES,
    SendBatch,
    batch_datagrams,
    enable_gro,
    enlarge_send_buffer,
    gather_seconds,
    segment_size,
    set_buffer,
)
from coded_shuffle.distributed.transports.multicast.drain import DONE, EMPTY, Drain
from coded_shuffle.distributed.transports.multicast.feedback import (
    CONTROL_TAG,
    REPORT_TAG,
    UNION_TAG,
    Arrival,
    feedback_bytes,
)
from coded_shuffle.distributed.transports.multicast.lanes import (
    IP_MULTICAST_ALL,
    SLOW_LANES,
    Lanes,
    datagram_groups,
    datagram_keeps,
    group_address,
    memberships,
    slow_lanes,
)
from coded_shuffle.distributed.transports.multicast.options import (
    MulticastOptions,
    MulticastUnavailable,
    interface_of,
    job_group,
    mreqn,
)
from coded_shuffle.distributed.transports.multicast.pacing import (
    SLEEP_AHEAD_SECONDS,
    Pace,
    Pacer,
    send_buffer_bytes,
    sleep_until,
)
from coded_shuffle.distributed.transports.multicast.parity import (
    LOSS_PRIOR,
    STRIDE,
    Parity,
    encode,
    ending_in,
    repairs,
    window_edges,
)
from coded_shuffle.distributed.transports.multicast.parity import warm as warm_parity
from coded_shuffle.distributed.transports.multicast.receive import Debug, Handover, Round
from coded_shuffle.math.worker_program import first_missing

POLL_SECONDS = 0.005
GRACE_MIN_SECONDS = 0.002  # the shortest drain after "round sent", once no datagram was late
log = logging.getLogger("coded_shuffle")

__all__ = ["Multicast", "MulticastCost", "MulticastOptions", "MulticastUnavailable"]


def warm() -> None:
    """Compiles (or loads from numba's cache) the transport's compiled parts, a receiver's
    loop (:meth:`~.drain.Drain.warm`) and the parity (:func:`~.parity.warm`): for a process
    that forks ranks to load once (:func:`~coded_shuffle.tools.ranks.load_own_loop_imports`),
    where each rank would otherwise compile or load them itself."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        Drain(sock, np.empty(RECEIVE_BYTES, dtype=np.uint8)).warm()
    warm_parity()


class MulticastCost(BroadcastCost):
    """``R_c`` in full datagrams once, on any topology, paced at ``pace_share`` of the
    slowest NIC, the master's or a worker's: every receiver takes the whole stream. Where some
    workers are slower than the master and the fastest worker (and ``reach`` says what each
    keeps), a slow worker's lane (:func:`~.lanes.slow_lanes`, ``SLOW_LANES`` of them, the
    default) takes only the datagrams any of its workers keeps, at its slowest's rate, and the
    stream lasts as long as its busiest link (:mod:`.lanes`)."""

    paced = True

    def busy(self, stream: float, traffic: Traffic, net: Network, reach: Reach | None) -> float:
        rates = net.receivers(traffic.workers)  # bytes/s, fastest first
        top = min(net.master_rate / 8, rates[0])
        if net.topology == "shared":
            top = min(top, net.rate / 8)
        workers = net.nics(traffic.workers)
        lanes = slow_lanes(top, workers, SLOW_LANES)  # as the transport cuts them
        if reach is None or not reach.keepers or not lanes:
            return net.datagrams(stream) / (net.pace_share * min(top, rates[-1]))
        position = {w: p for p, w in enumerate(net.relay_order(traffic.workers), start=1)}
        scale = stream / max(sum(reach.sizes), 1)  # the reach's sizes scaled to the stream
        busy = net.datagrams(stream) / top
        for lane in lanes:
            heard = reach.heard([position[w] for w in lane]) * scale
            busy = max(busy, net.datagrams(heard) / workers[lane[0] - 1])
        return busy / net.pace_share


class Multicast(Transport):
    """Paced UDP multicast from the master, with repair rounds driven by the workers' reports."""

    name = "multicast"
    summary = "UDP IP multicast paced to a rate, lost datagrams repaired: the shared link"
    routing = "broadcast"
    prunes = True  # with slow workers, each hears only the messages it keeps (:mod:`.lanes`)
    Options = MulticastOptions
    cost = MulticastCost()
    digests = False  # every datagram carries UDP's checksum, every batch the master's SHA-256
    peer_sends = False  # True: every worker sends streams of its own too (``peer-multicast``)

    def __init__(self, peer: Peer, options: MulticastOptions | None = None) -> None:
        super().__init__(peer, options)
        o = self.options
        own = o.master_rate if peer.rank == 0 and o.master_rate is not None else o.rate
        self.rate, self.job = parse_rate(own, "rate"), peer.job
        group, port = job_group(self.job)
        self.group = o.group if o.group is not None else group
        self.port = int(o.port) if o.port is not None else port
        self._receivers([parse_rate(r, "receiver_rates") for r in o.receiver_rates or ()])
        self.drop, self.grace = float(o.drop), float(o.grace_seconds)
        self.ifindex, self.mtu = interface_of(o.interface or os.environ.get("GLOO_SOCKET_IFNAME"))
        self.datagram_bytes = o.datagram_bytes or default_datagram_bytes(self.mtu)
        self.frame_bytes = wire_bytes(DGRAM_HEADER_BYTES + self.datagram_bytes, self.mtu)
        self.rng = np.random.default_rng([o.seed, peer.rank, 0x6D63])
        self.parity_window, self.rcvbuf = int(o.parity_window), int(o.rcvbuf_bytes)
        self.slow = float(o.slow_seconds) if peer.rank == 1 else 0.0
        self.tx = self._open(send=True) if peer.rank == 0 or self.peer_sends else None
        self.sock = self._open(send=False) if peer.rank > 0 else None
        self.batch = (
            SendBatch(
                self.tx,
                batch_datagrams(self.rate, self.frame_bytes, self.datagram_bytes),
                self.datagram_bytes,
            )
            if self.tx is not None
            else None
        )
        self.send_buffer = 0  # bytes the sending socket holds in flight (0: it sends nothing)
        if self.batch is not None:
            wanted = send_buffer_bytes(self.rate, self.batch.capacity * self.frame_bytes)
            self.send_buffer = enlarge_send_buffer(self.batch.sock, wanted)
        self.reads = np.empty(RECEIVE_BYTES + self.datagram_bytes, dtype=np.uint8)
        self.drain: Drain | None = None  # a receiver's common reads, compiled (no debug knob)
        self.poller = select.poll()
        if self.sock is not None:
            enable_gro(self.sock)  # where the kernel cannot, one datagram per read
            self.poller.register(self.sock, select.POLLIN)
            if not (self.drop or self.slow):
                self.drain = Drain(self.sock, self.reads)
                self.drain.warm()
        if self.parity_window:
            warm_parity()
        self.gather_seconds = 0.0  # a receiver's pause between reads (:class:`_Reader`)
        if self.drain is not None:
            fastest = max(
                self.rate, parse_rate(o.master_rate, "master_rate") if o.master_rate else 0
            )
            held = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            self.gather_seconds = gather_seconds(fastest, held)
        self.sources = self._agree_sources()
        self.master = self.sources[0]
        self.stranger: tuple[str, int] | None = None  # the last foreign datagram's source
        self.stream_id = 0
        self.rounds = 0  # repair rounds of the last stream (0: none needed)
        self.pace = Pace(self.rate)  # adapted round by round within [rate/16, rate]
        # the loss the next stream's parity is sized for (0: none): the last stream's
        self.loss = LOSS_PRIOR if self.parity_window else 0.0
        self.rebuilt = 0  # datagrams this receiver rebuilt from parity (all streams)
        self.tail: float | None = None  # the latest a datagram came in a drain (None: no drain)

    def _receivers(self, rates: Sequence[float]) -> None:
        """The lanes of slow workers (:mod:`~.lanes`: the master's streams), each lane's pace
        (its slowest's) and the groups' addresses; where the workers send (``peer-multicast``)
        the pace is the slowest's."""
        most = int(self.options.slow_lanes)
        self.lanes = () if self.peer_sends else slow_lanes(self.rate, rates, most)
        self.slow_workers = sorted(w for lane in self.lanes for w in lane)
        self.slow_rates = [rates[lane[0] - 1] for lane in self.lanes]
        if rates and not self.lanes:
            self.rate = min(self.rate, *rates)
        count = 2 ** len(self.lanes)
        self.addresses = [(group_address(self.group, g), self.port) for g in range(count)]

    @property
    def paced(self) -> float:
        """The bits/s this stream goes at: the pace, a share of it in the background
        (``background_share``: what a training loop's own traffic is left)."""
        return self.pace.bits * (float(self.options.background_share) if self.background else 1.0)

    # ---------------------------------------------------------------- set-up

    def _open(self, send: bool) -> socket.socket:
        """A socket connected to the group (``send``), or one bound to it that has joined."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            if send:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
                sock.setsockopt(
                    socket.IPPROTO_IP, socket.IP_MULTICAST_IF, mreqn(self.group, self.ifindex)
                )
                sock.connect((self.group, self.port))
            else:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                set_buffer(sock, False, self.rcvbuf)
                self._join(sock)
        except OSError as exc:
            sock.close()
            where = f"interface index {self.ifindex}" if self.ifindex else "the default route"
            raise MulticastUnavailable(
                f"multicast unavailable on {self.peer.label()}: group {self.group}:{self.port} "
                f"via {where}: {exc.strerror or exc}; use dist.transport=chain, or run inside "
                "`coded-shuffle cluster` (its hosts route 224.0.0.0/4)"
            ) from None
        return sock

    def _join(self, sock: socket.socket) -> None:
        """A receiver's socket bound to the job's group and joined to it; with slow workers
        (:mod:`~.lanes`), bound to the port and joined to this worker's groups alone."""
        if not self.lanes:
            sock.bind((self.group, self.port))
            sock.setsockopt(
                socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreqn(self.group, self.ifindex)
            )
            return
        sock.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
        sock.bind(("0.0.0.0", self.port))
        for g in memberships(self.peer.rank, self.lanes):
            group = self.addresses[g][0]
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreqn(group, self.ifindex))

    def _agree_sources(self) -> list[tuple[str, int] | None]:
        """Per rank, the address and port its datagrams come from (its sending socket's,
        connected to the group; None for a rank that never sends), known to every rank: a
        receiver hears only the current stream's sender.

        The collective also makes sure every receiver has joined before anything is sent.
        """
        mine = self.tx.getsockname() if self.tx is not None else None
        every: list[Any] = [None] * self.peer.world_size
        dist.all_gather_object(every, mine, group=self.peer.group)
        return [None if a is None else tuple(a) for a in self.peer.roles.by_role(every)]

    def settings(self) -> dict[str, Any]:
        return {
            "rate_bits": self.rate,
            "pace_bits": round(self.pace.bits),
            "parity_window": self.parity_window if self.loss else 0,
            "parity_loss": self.loss,
            "datagram_bytes": self.datagram_bytes,
            "batch_datagrams": self.batch.capacity if self.batch else 0,
            "gso": bool(self.batch and self.batch.gso),
            "send_buffer_bytes": self.send_buffer,
            "mtu": self.mtu,
            "group": self.group,
            "port": self.port,
            "slow_workers": list(self.slow_workers),
            "slow_lanes": [list(lane) for lane in self.lanes],
        }

    def close(self) -> None:
        for sock in (self.tx, self.sock):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()

    # ---------------------------------------------------------------- streams

    def exchange(
        self,
        streams: Sequence[Stream],
        outgoing: Mapping[int, Iterable[torch.Tensor]],
        on_message: OnMessage,
        keepers: Sequence[np.ndarray] | None = None,
    ) -> None:
        """``keepers[i]`` (:attr:`~.base.Transport.prunes`): at the master, who keeps a row of
        each message of stream ``i``; at a worker, which messages it keeps. With slow workers
        (:mod:`~.lanes`) a slow worker hears only the datagrams of the messages it keeps."""
        self.check_streams(streams)
        for i, stream in enumerate(streams):
            self.stream_id += 1
            if stream.total == 0:
                continue
            keeps = None if keepers is None else keepers[i]
            if self.peer.rank == stream.src:
                self._serve(stream, outgoing[i], keeps)
            elif self.peer.rank in stream.dsts:
                deliver = lambda j, msg, i=i: on_message(i, j, msg)  # noqa: E731
                self._receive(stream.sizes, deliver, stream.src, keeps)
            # a rank the stream is not for (the master, between the workers) takes no part:
            # the feedback stays between the stream's sender and its receivers

    def _count(self, total: int) -> int:
        return -(-total // self.datagram_bytes)

    def scratch_shapes(self, stream_bytes: int) -> list[tuple[int, int]]:
        """The stream's datagrams, whole: the sender keeps them for repairs, a receiver
        puts them in place (:meth:`_serve`, :meth:`_receive`)."""
        return [(self._count(stream_bytes), self.datagram_bytes)]

    def _serve(
        self, stream: Stream, messages: Iterable[torch.Tensor], keepers: np.ndarray | None
    ) -> None:
        """The stream's sender (the master, or a worker under ``peer-multicast``), to its
        receivers: round 0 sends every datagram as soon as its bytes are framed (and a parity
        datagram after every block, while the network loses datagrams; by group where workers
        are slow, :meth:`_serve_lanes`); later rounds what some receiver missed, until none
        misses anything. The pace adapts after every round."""
        total, dsts = stream.total, stream.dsts
        n, d = self._count(total), self.datagram_bytes
        data = self.buffers.empty(n, d).numpy().reshape(-1)  # kept for repairs
        data[total:] = 0  # the last datagram's padding: parity covers whole datagrams
        if self.lanes:
            resend = self._serve_lanes(data, total, messages, self._groups(stream, keepers))
        else:
            resend = self._serve_one(data, total, messages)
        self.rounds, sent_now, loss = 0, n, 0.0
        while True:
            self._end_round(self.rounds)
            self._control_round_done(dsts)
            todo, lost = self._union_of_missing(n, dsts)
            self.pace.adapt(lost, sent_now, first=self.rounds == 0)
            if self.rounds == 0:  # the share its worst receiver lost
                loss = min(1.0, lost / n)
            if todo.size == 0:
                self.loss = loss if self.parity_window else 0.0
                return
            self.rounds += 1
            sent = resend(todo, self.rounds)
            self.counts.egress += sent
            self.counts.repairs += sent
            sent_now = todo.size

    def _framed(
        self, data: np.ndarray, total: int, messages: Iterable[torch.Tensor]
    ) -> Iterator[tuple[int, int]]:
        """Each message's bytes put in ``data``, then the datagrams ``[ready, done)`` that
        are whole since the message before (the last one with the stream's last message)."""
        n, d = data.size // self.datagram_bytes, self.datagram_bytes
        filled = ready = 0
        for m in messages:
            data[filled : filled + m.numel()] = m.numpy()
            filled += m.numel()
            done = n if filled == total else filled // d
            yield ready, done
            ready = done

    def _groups(self, stream: Stream, keepers: np.ndarray | None) -> np.ndarray:
        """Each datagram's group (:func:`~.lanes.datagram_groups`); where who keeps what is
        not known, the group every worker joined."""
        if keepers is None:
            return np.full(self._count(stream.total), len(self.addresses) - 1, dtype=np.int64)
        return datagram_groups(keepers, stream.sizes, self.datagram_bytes, self.lanes)

    def _serve_one(
        self, data: np.ndarray, total: int, messages: Iterable[torch.Tensor]
    ) -> Callable[[np.ndarray, int], int]:
        """Round 0 to the one group, parity beside it; returns how a repair round is sent."""
        pacer = Pacer(self.paced, self.frame_bytes)
        edges = window_edges(data.size // self.datagram_bytes, self.parity_window)
        for ready, done in self._framed(data, total, messages):
            self.counts.egress += self._send(data, np.arange(ready, done), 0, pacer, total)
            if self.loss:
                sent = self._send_repairs(data, edges, ready, done, pacer)
                self.counts.egress += sent
                self.counts.parity += sent
        return lambda todo, rnd: self._send(
            data, todo, rnd, Pacer(self.paced, self.frame_bytes), total
        )

    def _serve_lanes(
        self, data: np.ndarray, total: int, messages: Iterable[torch.Tensor], groups: np.ndarray
    ) -> Callable[[np.ndarray, int], int]:
        """Round 0 by group (:class:`~.lanes.Lanes`; no parity: a slow worker lacks the other
        groups' datagrams of a block): the datagrams framed so far go as their paces allow,
        and while none may go yet the next message is framed; returns how a repair round is
        sent."""
        lanes = self._lanes(groups)
        for ready, done in self._framed(data, total, messages):
            lanes.add(np.arange(ready, done))
            self.counts.egress += self._send_lanes(data, lanes, 0, total, wait=False)
        self.counts.egress += self._send_lanes(data, lanes, 0, total, wait=True)

        def resend(todo: np.ndarray, rnd: int) -> int:
            again = self._lanes(groups)
            again.add(todo)
            return self._send_lanes(data, again, rnd, total, wait=True)

        return resend

    def _lanes(self, groups: np.ndarray) -> Lanes:
        """The groups' queues, paced at the master's pace and each slow worker's, scaled as
        the pace is (adapted, or in the background)."""
        assert self.batch is not None
        scale, full = self.paced / self.rate, self.frame_bytes
        slow = [Pacer(r * scale, full) for r in self.slow_rates]
        return Lanes(groups, Pacer(self.paced, full), slow, self.batch.capacity)

    def _send_lanes(self, data: np.ndarray, lanes: Lanes, rnd: int, size: int, wait: bool) -> int:
        """Batches of ``lanes`` as their paces allow, each to its group; all of them
        (``wait``), or until the next may go only later (more may be framed meanwhile).
        Returns the bytes handed to the socket."""
        assert self.batch is not None
        d, head, sent = self.datagram_bytes, (self.job, self.stream_id, rnd), 0
        while (ahead := lanes.next()) is not None:
            g, at = ahead
            if not wait and at > time.perf_counter() + SLEEP_AHEAD_SECONDS:
                break
            sleep_until(at)
            batch = lanes.take(g)
            sent += self.batch.send(data, batch, head, size, self.addresses[g])
            last = min(d, size - int(batch[-1]) * d)  # the stream's last datagram may be short
            lanes.sent(g, batch.size - 1 + last / d)
        return sent

    def _send_repairs(
        self, data: np.ndarray, edges: np.ndarray, lo: int, hi: int, pacer: Pacer
    ) -> int:
        """The repair datagrams of every window (``edges``: :func:`~.parity.window_edges`)
        that ends in ``[lo, hi)``, as many as :attr:`loss` calls for
        (:func:`~.parity.repairs`), a batch per pause as the data's."""
        assert self.batch is not None
        d, step = self.datagram_bytes, self.batch.capacity
        rows, sent = data.reshape(-1, d), 0
        head = (self.job, self.stream_id, 0)
        for w in ending_in(lo, hi, edges):
            window = rows[edges[w] : edges[w + 1]]
            count = repairs(window.shape[0], self.loss)
            out = np.empty((count, d), dtype=np.uint8)
            encode(window, out)
            for at in range(0, count, step):
                some = out[at : at + step]
                pacer.wait()
                sent += self.batch.send_repairs(some, w * STRIDE + at, count, head)
                pacer.sent(some.shape[0])
        return sent

    def _send(self, data: np.ndarray, todo: np.ndarray, rnd: int, pacer: Pacer, size: int) -> int:
        """Paced datagrams ``todo`` (ascending) of the first ``size`` bytes of ``data``, a batch
        per pause (:class:`~.batches.SendBatch`); returns the bytes handed to the socket."""
        assert self.batch is not None
        d, step, head = self.datagram_bytes, self.batch.capacity, (self.job, self.stream_id, rnd)
        sent = 0
        for lo in range(0, todo.size, step):
            batch = todo[lo : lo + step]
            pacer.wait()
            sent += self.batch.send(data, batch, head, size)
            last = min(d, size - int(batch[-1]) * d)  # the stream's last datagram may be short
            pacer.sent(batch.size - 1 + last / d)
        return sent

    def _end_round(self, rnd: int) -> None:
        """Sender -> every group: the round's end, after its last datagram (a receiver that
        reads it reports at once, without waiting for a quiet socket; one that lost it waits
        as before). Counted as feedback."""
        assert self.batch is not None
        head = (self.job, self.stream_id, rnd)
        groups = self.addresses if self.lanes else [None]
        self._control(egress=sum(self.batch.send_end(head, to) for to in groups))

    def _control_round_done(self, dsts: Sequence[int]) -> None:
        """Sender -> every receiver: the round's datagrams are all sent (4 bytes each)."""
        flag = torch.ones(1, dtype=torch.int32)
        group = self.peer.group
        works = [dist.isend(flag, self.peer.at(w), group=group, tag=CONTROL_TAG) for w in dsts]
        for w in works:
            w.wait()
        self._control(egress=4 * len(works))

    def _control(self, egress: int = 0, ingress: int = 0) -> None:
        self.counts.egress += egress
        self.counts.ingress += ingress
        self.counts.control += egress

    def _union_of_missing(self, n: int, dsts: Sequence[int]) -> tuple[np.ndarray, int]:
        """Sender: every receiver's :meth:`_report_missing`, and the union of their bitmaps
        sent to each itself (no receiver relays it: a busy one would hold the others up; no
        rank outside the stream takes part: a master behind a link that a worker's stream
        floods held up every round it took part in). Returns the union's datagrams and the
        largest count of lost or late ones."""
        size, group = feedback_bytes(n), self.peer.group
        got = [torch.zeros(size, dtype=torch.uint8) for _ in dsts]
        works = [
            dist.irecv(g, self.peer.at(w), group=group, tag=REPORT_TAG)
            for g, w in zip(got, dsts, strict=True)
        ]
        for w in works:
            w.wait()
        each = torch.stack(got).numpy()
        worst = int(each[:, -4:].copy().view("<u4").max())
        union = torch.from_numpy(np.bitwise_or.reduce(each, axis=0))
        sends = [dist.isend(union, self.peer.at(w), group=group, tag=UNION_TAG) for w in dsts]
        for w in sends:
            w.wait()
        self._control(egress=size * len(dsts), ingress=size * len(dsts))
        return self._datagrams(union, n), worst

    def _report_missing(self, missing: np.ndarray, lost: int, src: int) -> None:
        """Receiver -> the stream's sender: its bitmap of missing datagrams and its count of
        datagrams lost or late in the round (4 bytes after the bitmap)."""
        count = np.array([min(lost, 2**32 - 1)], dtype="<u4").view(np.uint8)
        bits = torch.from_numpy(np.concatenate([np.packbits(missing), count]))
        dist.send(bits, self.peer.at(src), group=self.peer.group, tag=REPORT_TAG)
        self._control(egress=bits.numel())

    def _receive_union(self, n: int, src: int) -> np.ndarray:
        """Receiver: the union of every receiver's missing datagrams, from the sender."""
        union = torch.empty(feedback_bytes(n), dtype=torch.uint8)
        dist.recv(union, self.peer.at(src), group=self.peer.group, tag=UNION_TAG)
        self._control(ingress=union.numel())
        return self._datagrams(union, n)

    @staticmethod
    def _datagrams(union: torch.Tensor, n: int) -> np.ndarray:
        return np.flatnonzero(np.unpackbits(union.numpy()[:-4])[:n])

    def _receive(
        self,
        sizes: Sequence[int],
        deliver: Callable[[int, torch.Tensor], None],
        src: int = 0,
        keeps: np.ndarray | None = None,
    ) -> None:
        """Receiver: every byte of the stream from ``src``, round after round; each message
        goes to ``deliver`` as soon as all of its datagrams are in, past a lost one too
        (:class:`~.receive.Handover`: checks and decoding overlap the transfer and the repair). A
        slow worker (:mod:`~.lanes`) waits for, and is given, only the messages it keeps
        (``keeps``); what its lane brings for the others is read and counted, and dropped."""
        d = self.datagram_bytes
        edges = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        total = int(edges[-1])
        n = self._count(total)
        out = self.buffers.empty(n, d).numpy().reshape(-1)
        flat = torch.from_numpy(out)
        have = np.zeros(n, dtype=bool)
        given = np.ones(len(sizes), dtype=bool)  # the messages it is given
        if keeps is not None and self.peer.rank in self.slow_workers:
            given = np.asarray(keeps, dtype=bool)
            have = ~datagram_keeps(given, sizes, d)[0]  # the others' datagrams never come
        parity = Parity(total, d, self.parity_window)
        handover = Handover(edges, d, given, lambda j: deliver(j, flat[edges[j] : edges[j + 1]]))
        rnd, foreign = 0, self.counts.foreign
        while True:
            lost, done = self._receive_round(out, have, rnd, handover, parity, src)
            self._report_missing(~have, lost, src)  # (nothing missing: sent before "round sent")
            handover.upto(first_missing(have, 0))  # while the others report
            handover.past(have)
            todo = self._receive_union(n, src)
            done.wait()  # the master's "round sent", in by now
            self._control(ingress=4)
            if todo.size == 0:
                break
            rnd += 1
        if self.counts.foreign > foreign:
            log.warning(
                f"{self.peer.label()}: dropped {self.counts.foreign - foreign} datagrams not "
                f"from this job's sender {self.sources[src]} (the last from {self.stranger})"
            )

    def drain_seconds(self) -> float:
        """How long a receiver that lacks datagrams drains its socket after the master's
        "round sent" and a quiet socket: ``grace_seconds`` until it has drained once; then
        twice the latest a datagram came in any drain (at least ``GRACE_MIN_SECONDS``, at most
        ``grace_seconds``): where nothing comes late (datagrams lost, not delayed) a repair
        round does not wait for stragglers that never come."""
        if self.tail is None:
            return self.grace
        return min(self.grace, max(GRACE_MIN_SECONDS, 2 * self.tail))

    def _receive_round(
        self,
        out: np.ndarray,
        have: np.ndarray,
        rnd: int,
        handover: Handover,
        parity: Parity,
        src: int = 0,
    ) -> tuple[int, Arrival]:
        """Reads datagrams until it has them all, reads the round's end (the sender's last
        datagram of the round, :meth:`_end_round`), or the master says the round is sent and
        the socket stays quiet for :meth:`drain_seconds`; returns how many of the round's
        datagrams it lost or got late (those of an earlier round), and the master's "round
        sent" (awaited by the caller: a receiver that has everything reports without it).

        A read holds one datagram or a run the kernel coalesced; :class:`~.receive.Round`
        copies each into its slot. A parity datagram rebuilds the one datagram its block
        lacks, if it lacks exactly one.
        """
        n = have.size
        lacked = n - int(have.sum())
        done = Arrival(self.peer, src)
        debug = Debug(self.drop, self.slow, self.rng)
        now = Round(self.job, self.stream_id, rnd, out, have, parity, self.counts, debug)
        master = self.sources[src]
        job_senders = {a for a in self.sources if a is not None}
        reader = _Reader(self, now, master)
        expect, scan = 0, now.count + handover.step
        draining = False
        while now.count < n and not now.ended:
            if expect < n and have[expect]:
                expect = first_missing(have, expect)
                handover.upto(expect)
            if now.count >= scan and now.count > expect:  # held past a missing datagram
                handover.past(have)
                scan = now.count + handover.step
            read = reader.next()
            if read is None:  # nothing came for a while
                if draining:
                    break
                if done.arrived():
                    draining, quiet = True, time.perf_counter()
                    reader.wait(self.drain_seconds())
                    self.tail = self.tail or 0.0
                continue
            if draining:  # a datagram after the quiet and "round sent": how late they come
                self.tail = max(self.tail or 0.0, time.perf_counter() - quiet)
            nbytes, segment, source = read
            if nbytes == 0:
                continue  # the compiled loop took what came: the messages it completed first
            if source != master and source in job_senders:
                continue  # this job's, from another stream's sender (its own, looped back)
            if source != master:
                self.counts.foreign += -(-nbytes // segment)  # a stranger's
                self.stranger = source
                continue
            now.take(self.reads, nbytes, segment)
        self.rebuilt += now.rebuilt
        rebuilt = parity.rebuild_all(out, have)  # parity that arrived before a late datagram
        self.rebuilt += rebuilt
        return lacked - now.received + now.late, done  # lost on the way (parity or not), late


class _Reader:
    """A receiver's reads in one round: the common ones taken by the compiled loop
    (:class:`~.drain.Drain`) where the transport has one, the rest handed back to be taken
    apart by :class:`~.receive.Round` (every read, where it has none)."""

    def __init__(self, transport: Multicast, now: Round, master: tuple[str, int]) -> None:
        self.sock, self.poller, self.drain = transport.sock, transport.poller, transport.drain
        self.now = now
        self.into = [memoryview(transport.reads)[:RECEIVE_BYTES]]
        self.emptied = False  # the compiled loop found the socket empty: wait before reading
        self.gathering = False  # ... while the stream flows: pause, then read what gathered
        self.wait(POLL_SECONDS, transport.gather_seconds)
        if self.drain is not None:
            self.drain.expect(master)

    def wait(self, seconds: float, gather: float = 0.0) -> None:
        """How long :meth:`next` waits for a datagram before it says none came, and how
        long it pauses before reading again when the compiled loop emptied the socket while
        datagrams flowed (0: it waits for the next one)."""
        self.seconds, self.gather = seconds, gather
        self.sock.settimeout(seconds)

    def next(self) -> tuple[int, int, Any] | None:
        """The next read to take apart: ``(bytes, segment, source)``; ``(0, 0, None)`` after
        the compiled loop took reads (or the socket became readable); None when nothing came
        within the wait."""
        if self.drain is None:
            try:
                nbytes, ancdata, _, source = self.sock.recvmsg_into(self.into, GRO_CMSG_BYTES)
            except TimeoutError:
                return None
            return nbytes, segment_size(ancdata, nbytes), source
        if not self.emptied:
            status = self.drain.run(self.now)
            if status not in (EMPTY, DONE):
                return self.drain.nbytes, self.drain.segment, self.drain.sender()
            self.emptied = status == EMPTY
            if self.drain.taken or status == DONE:
                self.gathering = self.emptied and self.gather > 0
                return 0, 0, None
        if self.gathering:  # one wake-up for the datagrams of the pause, not one per read
            self.gathering = self.emptied = False
            time.sleep(self.gather)
            return 0, 0, None
        if not self.poller.poll(self.seconds * 1000):
            return None
        self.emptied = False
        return 0, 0, None
