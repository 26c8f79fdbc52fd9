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

from coded_shuffle.distributed.transports.base import NoOptions
from coded_shuffle.distributed.transports.unicast import Unicast


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
