"""What a delivery costs under a topology (docs/transports.md, "Predictions").

A delivery is a stream of framed messages (:mod:`.wire`): ``R_c`` bytes for a coded epoch (the
scheme's broadcast), ``R_u`` for an uncoded one. A transport moves it over host NICs of
``rate`` bits/s each way (the master's: ``master_rate``); the seconds are the bytes on the
busiest link over its rate, with each link's TCP/IP or UDP/IP headers and Ethernet framing
(:meth:`Network.tcp`, :meth:`Network.datagrams`). The topologies:

* ``switch``: full bisection, every NIC sends and receives at once.
* ``shared``: one medium that every transmission occupies (the papers' shared link): the sum
  of every host's egress over the rate; a multicast datagram still crosses it once.
* ``uplink``: a switch whose master sits behind a slower link (``master_rate < rate``).

Each transport prices itself: its module defines a :class:`Cost` (the formula for its
streams on each topology) and its class carries it (``Transport.cost``); nothing here names a
transport.

``overhead_seconds`` is a fixed cost per delivery (reports, digests, round trips) and
``peer_seconds`` one per peer of a worker exchanging with every other (a stream set up and
drained per peer, and the spread of the workers' starts: such a delivery is timed from the
first worker's start to the last one's end), both calibrated on the emulated cluster
(``scripts/bench_transport.py --predict``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from coded_shuffle.costs.rates import format_rate
from coded_shuffle.costs.wire import (
    DGRAM_HEADER_BYTES,
    ETHERNET_WIRE_BYTES,
    chain_bytes,
    chain_reach,
    default_datagram_bytes,
    message_keepers,
    message_sizes,
    tcp_wire_bytes,
    wire_bytes,
)
from coded_shuffle.errors import UsageError
from coded_shuffle.math.index_decoder import decode_plan
from coded_shuffle.math.plan import Plan, byte_parts, subpoint_bytes

TOPOLOGIES = ("switch", "shared", "uplink")
PACE_SHARE = 0.99  # multicast paced at this share of the slowest NIC (the cluster's default)
# a prefetched multicast stream at this share of its pace: the rest of the link is the training
# loop's (dist.multicast.background_share's default)
BACKGROUND_SHARE = 0.9
OVERHEAD_SECONDS = 0.02  # per delivery: calibrated on the emulated cluster (transports.md)
PEER_SECONDS = 0.021  # p2p: per peer a worker exchanges with (calibrated the same way)
# peer-multicast: per worker's stream (its feedback round, and the decoding and reports the
# workers' clocks add: scripts/bench_transport.py, K = 4, shared 200 Mbit/s, docs/decentralized.md)
PEER_STREAM_SECONDS = 0.035


def fastest_first(rates: Mapping[int, float]) -> tuple[int, ...]:
    """The workers (``rates``: each one's NIC) in the order a chain relays through them on an
    uneven network: fastest first, ties by number, so that a slow host, last, slows only
    what reaches it (inside the chain it would slow every hop after it)."""
    return tuple(sorted(rates, key=lambda w: (-rates[w], w)))


@dataclass(frozen=True)
class Network:
    """Hosts' NICs and how they connect."""

    topology: str
    rate: float  # bits/s of every worker's NIC, each way (shared: the medium's)
    master_rate: float  # bits/s of the master's NIC
    mtu: int = 1500
    frame: int = ETHERNET_WIRE_BYTES  # bytes of framing per Ethernet frame on the wire
    pace_share: float = PACE_SHARE
    overhead_seconds: float = OVERHEAD_SECONDS
    peer_seconds: float = PEER_SECONDS
    peer_stream_seconds: float = PEER_STREAM_SECONDS
    # bits/s of each worker's NIC where they differ (``--host-rate``; empty: every one
    # ``rate``); on a shared medium a worker's own NIC beside the medium's ``rate``
    worker_rates: tuple[float, ...] = ()

    def behind_training(self, share: float = BACKGROUND_SHARE) -> Network:
        """The network as a delivery behind the training loop sees it (prefetched): a paced
        stream at ``share`` of its pace (``dist.multicast.background_share``), the rest of the
        link the loop's own."""
        return replace(self, pace_share=self.pace_share * share)

    def relay_order(self, workers: int) -> tuple[int, ...]:
        """The workers ``1..K`` in the order a chain relays through them (:func:`fastest_first`,
        as the cluster command orders it)."""
        rates = self.worker_rates or (self.rate,) * workers
        return fastest_first(dict(enumerate(rates, start=1)))

    def nics(self, workers: int) -> tuple[float, ...]:
        """Every worker's NIC in bytes/s, worker 1 first."""
        return tuple(r / 8 for r in self.worker_rates or (self.rate,) * workers)

    def receivers(self, workers: int) -> tuple[float, ...]:
        """Every worker's NIC in bytes/s, in :meth:`relay_order`."""
        nics = self.nics(workers)
        return tuple(nics[w - 1] for w in self.relay_order(workers))

    def others(self) -> str:
        """The NICs whose rate is not ``rate`` (the master's, a worker's), as outputs name
        them: ``", master 50mbit, worker 4 200mbit"``."""
        out = "" if self.master_rate == self.rate else f", master {format_rate(self.master_rate)}"
        return out + "".join(
            f", worker {i} {format_rate(r)}"
            for i, r in enumerate(self.worker_rates, start=1)
            if r != self.rate
        )

    def slowest(self, workers: int) -> float:
        """The slowest worker's NIC in bytes/s."""
        return self.receivers(workers)[-1]

    def check(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise UsageError(f"topology {self.topology!r} unknown; valid: {', '.join(TOPOLOGIES)}")
        if self.topology == "uplink" and not self.master_rate < self.rate:
            raise UsageError(
                f"topology uplink needs --master-rate below --rate ({self.master_rate:g} >= "
                f"{self.rate:g} bit/s): a master behind a slower link"
            )
        if not 576 <= self.mtu <= 65535:
            raise UsageError(f"mtu {self.mtu} out of range 576..65535")
        if not 0 <= self.peer_seconds < 60:
            raise UsageError(f"peer seconds {self.peer_seconds:g} out of range [0, 60)")
        if any(r <= 0 for r in self.worker_rates):
            raise UsageError(f"worker rates {list(self.worker_rates)} must all be > 0")

    def tcp(self, payload: float) -> float:
        return tcp_wire_bytes(payload, self.mtu, self.frame)

    def datagrams(self, payload: float) -> float:
        """Wire bytes of a multicast stream of ``payload`` message bytes (full datagrams)."""
        d = default_datagram_bytes(self.mtu)
        return math.ceil(payload / d) * wire_bytes(DGRAM_HEADER_BYTES + d, self.mtu, self.frame)


@dataclass(frozen=True)
class Reach:
    """How far a stream travels down a chain in its relay order: message ``i`` (in the
    stream's order) of ``sizes[i]`` bytes crosses the links into positions ``1 ..
    ends[i]``; ``links``, the links a byte crosses on average with the reach tables (network
    bytes / stream bytes: ``K`` when every relay forwards everything; less where later
    workers keep nothing); ``keepers``, per worker in the same order, which messages it keeps a
    row of (what a receiver-aware multicast sends a slow worker)."""

    links: float
    sizes: tuple[int, ...]
    ends: tuple[int, ...]
    keepers: tuple[tuple[bool, ...], ...] = ()  # per position, per message: a row of it kept

    def heard(self, positions: Sequence[int]) -> int:
        """The bytes of the messages any worker at ``positions`` (``1..K``) keeps a row of."""
        keeps = np.asarray(self.keepers, dtype=bool)[[p - 1 for p in positions]].any(axis=0)
        return int(np.asarray(self.sizes, dtype=np.int64) @ keeps)


@dataclass(frozen=True)
class Traffic:
    """One epoch's delivery as message bytes (framed, padding included)."""

    workers: int
    coded_bytes: float  # R_c: the coded broadcast
    uncoded_bytes: float  # R_u: every worker's missing rows, uncoded
    coded_reach: Reach | None = None  # on a chain (None: every relay forwards everything)
    uncoded_reach: Reach | None = None


class Cost:
    """What one delivery over a transport costs: its seconds and the master's bytes. Each
    transport's module defines its own and hangs it on its class (``Transport.cost``), so no
    cost code names a transport; ``predict`` asks the registry for it."""

    paced: bool = False
    """A paced sender (multicast): its NIC idles less while its process is descheduled, so more
    of the delivery's CPU work overlaps its network seconds (:mod:`.run`)."""

    def busy(self, stream: float, traffic: Traffic, net: Network, reach: Reach | None) -> float:
        """Seconds the busiest link carries ``stream`` message bytes (``R_c`` or ``R_u``);
        ``reach``: how far the stream travels down a chain (None: every relay forwards
        everything)."""
        raise NotImplementedError(f"{type(self).__name__} has no byte model")

    def seconds(
        self, stream: float, traffic: Traffic, net: Network, reach: Reach | None = None
    ) -> float:
        """The delivery's seconds: :meth:`busy` and the fixed cost of a delivery."""
        return self.busy(stream, traffic, net, reach) + net.overhead_seconds

    def master_bytes(self, stream: float, workers: int) -> float:
        """Message bytes the master sends (the transports' counted ``master_egress_bytes``,
        multicast without its 16-byte datagram headers): the stream once."""
        del workers
        return stream

    def peer_stream(self, traffic: Traffic) -> float:
        """The stream of a decentralized delivery (``traffic``: its plan's): every coded
        symbol once."""
        return traffic.coded_bytes

    def placement(self) -> Cost | None:
        """What carries the master's placement where the workers store more than their batch
        (``T > 1``): None, the master's own streams to each worker (``unicast``'s), of
        :meth:`placement_rows` rows."""
        return None

    def placement_rows(self, points: int, storage: float, workers: int) -> float:
        """Rows the placement sends: every worker its ``T`` batches (a broadcast: the set
        once)."""
        del workers
        return points * storage if self.placement() is None else points


class BroadcastCost(Cost):
    """A transport that broadcasts the master's stream places the data with it too: the set
    once."""

    def placement(self) -> Cost | None:
        return self


def chain_reach_of(
    plan: Plan, point_bytes: int, chunk_bytes: int, order: Sequence[int] | None = None
) -> Reach:
    """How far ``plan``'s streams travel down a chain in relay ``order`` (worker ranks;
    None: ``1..K``): every message as far as the last worker that keeps one of its rows,
    every reach table on every link (the chain's byte model,
    :func:`~coded_shuffle.costs.wire.chain_bytes`; each worker's kept rows from its decoding
    program), the parts' streams one after the other."""
    workers = plan.plans[0].num_workers
    order = range(1, workers + 1) if order is None else order
    network, sizes, ends, keeps = 0, [], [], []
    parts = byte_parts(point_bytes, plan.fractions)
    for part, b in zip(plan.plans, parts, strict=True):
        sub = subpoint_bytes(b, part.splits)
        mine = message_sizes(part.num_symbols, sub, chunk_bytes)
        keep = [program.symbol_ids for program in decode_plan(part)]
        keepers = message_keepers(keep, part.num_symbols, sub, chunk_bytes)
        reach = chain_reach(keepers, order)
        keeps.append(np.asarray(keepers, dtype=bool))
        network += chain_bytes(mine, reach, part.num_workers)
        sizes += [int(x) for x in mine]
        ends += [int(x) for x in reach]
    stream = sum(sizes)
    every = np.concatenate(keeps, axis=1)  # (K, messages)
    in_order = tuple(tuple(bool(x) for x in every[w - 1]) for w in order)
    return Reach(network / stream if stream else 0.0, tuple(sizes), tuple(ends), in_order)
