"""``p2p``: after the placement, every worker sends what leaves it straight to its new owner.

Uncoded peer-to-peer exchange: each row of an uncoded delivery comes from a worker that
caches it and goes to the worker that needs it; the master sends nothing (it still places the
first epoch, one stream per worker, as :mod:`unicast` does). On a switched network every NIC
works in parallel, so the time is about ``R_u / (K * B)``: the honest competitor wherever the
workers can reach each other. Coded schemes are a configuration error here.
"""

from __future__ import annotations

from coded_shuffle.distributed.transports.base import NoOptions
from coded_shuffle.distributed.transports.unicast import Unicast


class P2P(Unicast):
    """Point-to-point streams between any two ranks (the mechanism of :class:`Unicast`)."""

    name = "p2p"
    summary = "uncoded only: workers send the points that leave them straight to the new owner"
    routing = "peers"
    Options = NoOptions  # gloo's point-to-point calls (the socket plane: unicast and chain)
