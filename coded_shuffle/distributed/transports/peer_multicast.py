"""``peer-multicast``: after the placement, every worker multicasts its own coded symbols once;
every other worker hears them and keeps what its decoder needs (docs/decentralized.md,
section 5).

Decentralized shuffling on the papers' shared medium: the workers take turns (worker 1's
stream, then worker 2's, ...), each stream sent as :mod:`multicast` sends the master's (one
datagram per frame, paced, repaired round by round from its receivers' reports, which now go
to the stream's sender), so each coded symbol is on the medium once, however many workers
decode with it. The master multicasts the placement (one stream, every worker keeping its
points) and then only takes part in the feedback and checks the batch digests.
"""

from __future__ import annotations

from coded_shuffle.costs.model import Cost, Network, Reach, Traffic
from coded_shuffle.distributed.transports.multicast import Multicast, MulticastCost


class PeerMulticastCost(Cost):
    """Every worker's stream in turn, each datagram once on any topology, paced at the
    workers' own NICs (the master's is out of it), plus ``peer_stream_seconds`` per worker's
    stream (its feedback round, the decoding and the reports): every stream paced for the
    slowest worker; the master multicasts the placement."""

    paced = True

    def busy(self, stream: float, traffic: Traffic, net: Network, reach: Reach | None) -> float:
        del reach
        sending = net.datagrams(stream) / (net.pace_share * net.slowest(traffic.workers))
        return sending + traffic.workers * net.peer_stream_seconds

    def master_bytes(self, stream: float, workers: int) -> float:
        del stream, workers
        return 0.0

    def placement(self) -> Cost | None:
        return MulticastCost()


class PeerMulticast(Multicast):
    """Multicast streams from every worker in turn (the mechanism of :class:`Multicast`)."""

    name = "peer-multicast"
    summary = "decentralized only: each worker multicasts its own coded symbols once, in turn"
    routing = "peers"
    own_symbols = True
    shares_medium = True
    peer_sends = True
    options_key = "multicast"  # the job's dist.multicast
    cost = PeerMulticastCost()
