"""The transport registry: one module per transport, one entry here (``dist.transport=NAME``).

Transports move framed messages between the ranks and count every host's bytes
(:mod:`~coded_shuffle.distributed.transports.base`);
:class:`~coded_shuffle.distributed.transports.link.Link` frames, routes and checks on top of
any of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from coded_shuffle.codec.buffers import IN_MEMORY, Buffers
from coded_shuffle.costs.model import Cost
from coded_shuffle.distributed.transports.base import (
    JOB_NAMES,
    LIBRARY_NAMES,
    HostBytes,
    Peer,
    Routing,
    SettingNames,
    Stream,
    Transport,
    job_identifier,
)
from coded_shuffle.distributed.transports.chain import Chain, ChainOptions
from coded_shuffle.distributed.transports.link import Link, Routes
from coded_shuffle.distributed.transports.multicast import (
    Multicast,
    MulticastOptions,
    MulticastUnavailable,
)
from coded_shuffle.distributed.transports.p2p import P2P
from coded_shuffle.distributed.transports.peer_multicast import PeerMulticast
from coded_shuffle.distributed.transports.peer_unicast import PeerUnicast
from coded_shuffle.distributed.transports.tree import Tree
from coded_shuffle.distributed.transports.unicast import Unicast
from coded_shuffle.errors import UsageError

REGISTRY: dict[str, type[Transport]] = {}


def register(cls: type[Transport]) -> type[Transport]:
    """Adds a transport class to the registry; a name can be registered once."""
    if cls.name in REGISTRY:
        raise ValueError(f"transport {cls.name!r} is registered already")
    REGISTRY[cls.name] = cls
    return cls


for _cls in (Unicast, P2P, Tree, Chain, Multicast, PeerMulticast, PeerUnicast):
    register(_cls)


def transport_class(name: str, names: SettingNames = LIBRARY_NAMES) -> type[Transport]:
    """The transport called ``name``; :class:`UsageError` lists the valid names otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UsageError(
            f"{names.transport}={name!r} unknown; valid: {', '.join(sorted(REGISTRY))}"
        ) from None


def transport_cost(name: str, names: SettingNames = LIBRARY_NAMES) -> Cost:
    """What a delivery over the transport called ``name`` costs (its class's
    :attr:`~.base.Transport.cost`); :class:`UsageError` lists the valid names otherwise."""
    return transport_class(name, names).cost


def build_transport(
    name: str,
    peer: Peer,
    options: Mapping[str, Any] | None = None,
    buffers: Buffers = IN_MEMORY,
) -> Transport:
    """Creates this rank's end of the transport (collective: every rank calls it); its large
    buffers (a multicast stream) come from ``buffers``. A peer without a job identifier gets
    one drawn by rank 0 (:func:`~.base.job_identifier`)."""
    cls = transport_class(name)
    if not peer.job:
        peer = dataclasses.replace(peer, job=job_identifier(peer))
    transport = cls(peer, cls.parse_options(peer.world_size, options))
    transport.buffers = buffers
    return transport


__all__ = [
    "JOB_NAMES",
    "LIBRARY_NAMES",
    "REGISTRY",
    "ChainOptions",
    "HostBytes",
    "Link",
    "MulticastOptions",
    "MulticastUnavailable",
    "Peer",
    "Routes",
    "Routing",
    "SettingNames",
    "Stream",
    "Transport",
    "build_transport",
    "register",
    "transport_class",
    "transport_cost",
]
