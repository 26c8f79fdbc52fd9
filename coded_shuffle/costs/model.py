"""Every transport's delivery seconds under a topology (docs/transports.md, "Predictions").

A delivery is a stream of framed messages (:mod:`.wire`): ``R_c`` bytes for a coded epoch (the
scheme's broadcast), ``R_u`` for an uncoded one. Each transport moves it over host NICs of
``rate`` bits/s each way (the master's: ``master_rate``); the seconds are the bytes on the
busiest link over its rate, with each link's TCP/IP or UDP/IP headers and Ethernet framing:

* ``switch``: full bisection, every NIC sends and receives at once.
  ``unicast``: the master sends ``R_u``; ``p2p``: every worker sends and receives about
  ``R_u / K``; ``chain``: ``R_c`` from the master, relayed cut-through (plus ``K - 1``
  frames: what a relay receives before it forwards); ``tree``: ``ceil(log2 P)`` rounds of
  ``R_c`` at the master (gloo's binomial tree); ``multicast``: ``R_c`` in datagrams once,
  paced at ``pace_share`` of the slowest NIC.
* ``shared``: one medium that every transmission occupies (the papers' shared link): the sum
  of every host's egress over the rate; multicast still sends once. ``chain`` pays for every
  relay's copy: every message on as many links as it reaches down the chain (a relay forwards
  only what a worker after it keeps; :attr:`Traffic.coded_links`, from the plan).
* ``uplink``: a switch whose master sits behind a slower link (``master_rate < rate``).

``peer-multicast`` and ``peer-unicast`` carry a decentralized delivery, sent by the workers at
their own ``rate`` (the master's link is out of it): ``peer-multicast`` every worker's
stream in turn, each datagram once on any topology, plus ``peer_stream_seconds`` per worker's
stream; ``peer-unicast`` every symbol once per worker that keeps it (the uncoded exchange's
bytes), as ``p2p``.

``overhead_seconds`` is a fixed cost per delivery (reports, digests, round trips) and
``peer_seconds`` one per peer of a ``p2p`` worker (a stream set up and drained per peer, and
the spread of the workers' starts: a ``p2p`` delivery is timed from the first worker's start
to the last one's end), both calibrated on the emulated cluster
(``scripts/bench_transport.py --predict``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
TRANSPORTS = ("unicast", "p2p", "tree", "chain", "multicast")
BROADCASTS = ("tree", "chain", "multicast")  # what carries a coded delivery
PEERS = ("peer-multicast", "peer-unicast")  # what carries a decentralized delivery
PACE_SHARE = 0.99  # multicast paced at this share of the slowest NIC (the cluster's default)
# a prefetched multicast stream at this share of its pace: the rest of the link is the training
# loop's (dist.multicast.background_share's default)
BACKGROUND_SHARE = 0.9
OVERHEAD_SECONDS = 0.02  # per delivery: calibrated on the emulated cluster (transports.md)
PEER_SECONDS = 0.021  # p2p: per peer a worker exchanges with (calibrated the same way)
# peer-multicast: per worker's stream (its feedback round, and the decoding and reports the
# workers' clocks add: scripts/bench_transport.py, K = 4, shared 200 Mbit/s, docs/decentralized.md)
PEER_STREAM_SECONDS = 0.035


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

    def tcp(self, payload: float) -> float:
        return tcp_wire_bytes(payload, self.mtu, self.frame)

    def datagrams(self, payload: float) -> float:
        """Wire bytes of a multicast stream of ``payload`` message bytes (full datagrams)."""
        d = default_datagram_bytes(self.mtu)
        return math.ceil(payload / d) * wire_bytes(DGRAM_HEADER_BYTES + d, self.mtu, self.frame)


@dataclass(frozen=True)
class Traffic:
    """One epoch's delivery as message bytes (framed, padding included)."""

    workers: int
    coded_bytes: float  # R_c: the coded broadcast
    uncoded_bytes: float  # R_u: every worker's missing rows, uncoded
    # links a byte of the stream crosses on a chain, on average (network bytes / stream
    # bytes): K when every relay forwards everything; less where later workers keep nothing
    coded_links: float | None = None
    uncoded_links: float | None = None


def seconds(
    transport: str, stream: float, traffic: Traffic, net: Network, links: float | None = None
) -> float:
    """Delivery seconds of ``stream`` message bytes (``R_c`` or ``R_u``) over ``transport``.

    ``links``: the chain links a byte of the stream crosses on average (``Traffic.coded_links``
    or ``uncoded_links``; None: ``K``, every relay forwards everything)."""
    k, r, rm = traffic.workers, net.rate / 8, net.master_rate / 8
    first = min(r, rm)  # the master's stream is as fast as its NIC and the receivers'
    shared = net.topology == "shared"
    if transport == "multicast":
        busy = net.datagrams(stream) / (net.pace_share * first)
    elif transport == "unicast":
        busy = (
            net.tcp(stream) / first
            if shared
            else max(net.tcp(stream) / rm, net.tcp(stream / k) / r)
        )
    elif transport == "p2p":  # every worker opens a stream to each of its K - 1 peers
        busy = net.tcp(stream) / r if shared else net.tcp(stream / k) / r
        busy += (k - 1) * net.peer_seconds
    elif transport == "chain":
        if shared:  # every relay's copy crosses the medium
            busy = net.tcp(stream * (k if links is None else links)) / r
        else:
            hop = net.tcp(min(stream, net.mtu)) / r  # a relay forwards what has arrived
            busy = net.tcp(stream) / first + (k - 1) * hop
    elif transport == "peer-multicast":  # every worker's stream in turn, each once
        busy = net.datagrams(stream) / (net.pace_share * r) + k * net.peer_stream_seconds
    elif transport == "peer-unicast":  # ``stream``: every symbol once per worker keeping it
        busy = net.tcp(stream) / r if shared else net.tcp(stream / k) / r
        busy += (k - 1) * net.peer_seconds
    elif transport == "tree":
        rounds = math.ceil(math.log2(k + 1))
        if shared:  # every one of the K copies crosses the medium; the master sends `rounds`
            busy = rounds * net.tcp(stream) / first + (k - rounds) * net.tcp(stream) / r
        else:  # every round: the master (and others) send the whole stream once
            busy = rounds * net.tcp(stream) / first
    else:
        known = ", ".join((*TRANSPORTS, *PEERS))
        raise UsageError(f"transport {transport!r} unknown; valid: {known}")
    return busy + net.overhead_seconds


def master_bytes(transport: str, stream: float, workers: int) -> float:
    """Message bytes the master sends (the transports' counted ``master_egress_bytes``,
    multicast without its 16-byte datagram headers)."""
    if transport == "p2p" or transport in PEERS:
        return 0.0
    if transport == "tree":
        return math.ceil(math.log2(workers + 1)) * stream
    return stream


def chain_links(plan: Plan, point_bytes: int, chunk_bytes: int) -> float:
    """The links a byte of ``plan``'s streams crosses on a chain ``1..K``, on average: every
    message as far as the last worker that keeps one of its rows, every reach table on every
    link (the chain's byte model, :func:`~coded_shuffle.costs.wire.chain_bytes`; each
    worker's kept rows from its decoding program)."""
    network = stream = 0
    parts = byte_parts(point_bytes, plan.fractions)
    for part, b in zip(plan.plans, parts, strict=True):
        sub = subpoint_bytes(b, part.splits)
        sizes = message_sizes(part.num_symbols, sub, chunk_bytes)
        keep = [program.symbol_ids for program in decode_plan(part)]
        keepers = message_keepers(keep, part.num_symbols, sub, chunk_bytes)
        order = range(1, part.num_workers + 1)
        network += chain_bytes(sizes, chain_reach(keepers, order), part.num_workers)
        stream += sum(sizes)
    return network / stream if stream else 0.0
