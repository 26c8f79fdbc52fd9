"""``peer-unicast``: after the placement, the workers send their own coded symbols, each to the
peers that need it (docs/decentralized.md, section 5).

The transport of a scheme the workers send (``decentralized``): every symbol is XORed by the
worker the plan names as its sender from its own store, and goes over TCP to every worker whose
decoder keeps it; the master places the first epoch (one stream per worker, as
:mod:`unicast` does) and then only checks the workers' batch digests. On a switch every NIC
sends and receives at once; a symbol that serves ``m`` workers crosses ``m`` links (a multicast
form would put it on a shared medium once).
"""

from __future__ import annotations

from coded_shuffle.costs.model import Traffic
from coded_shuffle.distributed.transports.base import NoOptions
from coded_shuffle.distributed.transports.p2p import ExchangeCost
from coded_shuffle.distributed.transports.unicast import Unicast


class PeerUnicastCost(ExchangeCost):
    """As ``p2p``'s exchange, of every symbol once per worker that keeps it (the uncoded
    exchange's bytes); its placement sends every worker every point (each stores a piece)."""

    def peer_stream(self, traffic: Traffic) -> float:
        return traffic.uncoded_bytes

    def placement_rows(self, points: int, storage: float, workers: int) -> float:
        del storage
        return points * workers


class PeerUnicast(Unicast):
    """Point-to-point streams between the workers (the mechanism of :class:`Unicast`), each
    carrying the symbols its sender forms."""

    name = "peer-unicast"
    summary = (
        "decentralized only: every worker sends its own coded symbols to the peers needing them"
    )
    routing = "peers"
    own_symbols = True
    Options = NoOptions  # gloo's point-to-point calls, as p2p
    cost = PeerUnicastCost()
