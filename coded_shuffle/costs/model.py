"""Every transport's delivery seconds under a topology (docs/transports.md, "Predictions").

A delivery is a stream of framed messages (:mod:`.wire`): ``R_c`` bytes for a coded epoch (the
scheme's broadcast), ``R_u`` for an uncoded one. Each transport moves it over host NICs of
``rate`` bits/s each way (the master's: ``master_rate``); the seconds are the bytes on the
busiest link over its rate, with each link's TCP/IP or UDP/IP headers and Ethernet framing:

* ``switch``: full bisection, every NIC sends and receives at once.
  ``unicast``: the master sends ``R_u``; ``p2p``: every worker sends and receives about
  ``R_u / K``; ``chain``: ``R_c`` from the master, relayed pipelined (plus ``K - 1``
  segments to fill the chain); ``tree``: ``ceil(log2 P)`` rounds of ``R_c`` at the master
  (gloo's binomial tree); ``multicast``: ``R_c`` in datagrams once, paced at ``pace_share``
  of the slowest NIC.
* ``shared``: one medium that every transmission occupies (the papers' shared link): the sum
  of every host's egress over the rate; multicast still sends once. ``chain`` counts every
  relay's copy of the whole stream, an upper bound: a relay forwards only what a worker after
  it keeps.
* ``uplink``: a switch whose master sits behind a slower link (``master_rate < rate``).

``overhead_seconds`` is a fixed cost per delivery (reports, digests, round trips) and
``peer_seconds`` one per peer of a ``p2p`` worker (a stream set up and drained per peer), both
calibrated on the emulated cluster (``scripts/bench_transport.py --predict``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coded_shuffle.costs.wire import (
    DGRAM_HEADER_BYTES,
    ETHERNET_WIRE_BYTES,
    default_datagram_bytes,
    tcp_wire_bytes,
    wire_bytes,
)
from coded_shuffle.errors import UsageError

TOPOLOGIES = ("switch", "shared", "uplink")
TRANSPORTS = ("unicast", "p2p", "tree", "chain", "multicast")
BROADCASTS = ("tree", "chain", "multicast")  # what carries a coded delivery
CHAIN_SEGMENT_BYTES = 64 << 10  # ChainOptions.segment_bytes: what a relay forwards at once
PACE_SHARE = 0.99  # multicast paced at this share of the slowest NIC (the cluster's default)
OVERHEAD_SECONDS = 0.02  # per delivery: calibrated on the emulated cluster (transports.md)
PEER_SECONDS = 0.007  # p2p: per peer a worker exchanges with (calibrated the same way)


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


def seconds(transport: str, stream: float, traffic: Traffic, net: Network) -> float:
    """Delivery seconds of ``stream`` message bytes (``R_c`` or ``R_u``) over ``transport``."""
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
        rest = (k - 1) * net.tcp(stream if shared else min(stream, CHAIN_SEGMENT_BYTES)) / r
        busy = net.tcp(stream) / first + rest
    elif transport == "tree":
        rounds = math.ceil(math.log2(k + 1))
        if shared:  # every one of the K copies crosses the medium; the master sends `rounds`
            busy = rounds * net.tcp(stream) / first + (k - rounds) * net.tcp(stream) / r
        else:  # every round: the master (and others) send the whole stream once
            busy = rounds * net.tcp(stream) / first
    else:
        raise UsageError(f"transport {transport!r} unknown; valid: {', '.join(TRANSPORTS)}")
    return busy + net.overhead_seconds


def master_bytes(transport: str, stream: float, workers: int) -> float:
    """Message bytes the master sends (the transports' counted ``master_egress_bytes``,
    multicast without its 16-byte datagram headers)."""
    if transport == "p2p":
        return 0.0
    if transport == "tree":
        return math.ceil(math.log2(workers + 1)) * stream
    return stream
