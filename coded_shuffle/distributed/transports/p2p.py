"""``p2p``: after the placement, every worker sends what leaves it straight to its new owner.

Uncoded peer-to-peer exchange: each row of an uncoded delivery comes from a worker that
caches it and goes to the worker that needs it; the master sends nothing (it still places the
first epoch, one stream per worker, as :mod:`unicast` does). On a switched network every NIC
works in parallel, so the time is about ``R_u / (K * B)``: the honest competitor wherever the
workers can reach each other. Coded schemes are a configuration error here.
"""

from __future__ import annotations

from coded_shuffle.costs.model import Cost, Network, Reach, Traffic
from coded_shuffle.distributed.transports.base import NoOptions
from coded_shuffle.distributed.transports.unicast import Unicast


class ExchangeCost(Cost):
    """Every worker streams to each of its ``K - 1`` peers at once: each NIC carries about
    ``1 / K`` of the stream (the slowest worker's bounds it; a shared medium carries all of
    it), plus ``peer_seconds`` per peer (a stream set up and drained, the spread of the
    workers' starts); the master sends nothing."""

    def busy(self, stream: float, traffic: Traffic, net: Network, reach: Reach | None) -> float:
        del reach
        k = traffic.workers
        busy = net.tcp(stream / k) / net.slowest(k)
        if net.topology == "shared":
            busy = max(busy, net.tcp(stream) / (net.rate / 8))
        return busy + (k - 1) * net.peer_seconds

    def master_bytes(self, stream: float, workers: int) -> float:
        del stream, workers
        return 0.0


class P2P(Unicast):
    """Point-to-point streams between any two ranks (the mechanism of :class:`Unicast`)."""

    name = "p2p"
    summary = "uncoded only: workers send the points that leave them straight to the new owner"
    routing = "peers"
    Options = NoOptions  # gloo's point-to-point calls (the socket plane: unicast and chain)
    cost = ExchangeCost()
