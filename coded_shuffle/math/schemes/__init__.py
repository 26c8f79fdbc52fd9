"""The scheme registry: one module per scheme, one entry here."""

from __future__ import annotations

from coded_shuffle.errors import UsageError
from coded_shuffle.math.schemes.attia_tandon import AttiaTandon
from coded_shuffle.math.schemes.attia_tandon_excess import AttiaTandonExcess
from coded_shuffle.math.schemes.base import Scheme
from coded_shuffle.math.schemes.best import Best
from coded_shuffle.math.schemes.cycles import Cycles
from coded_shuffle.math.schemes.decentralized import Decentralized
from coded_shuffle.math.schemes.elmahdy_mohajer import ElmahdyMohajer
from coded_shuffle.math.schemes.uncoded import Uncoded
from coded_shuffle.math.state import CacheState

REGISTRY: dict[str, type[Scheme]] = {}


def register(cls: type[Scheme]) -> type[Scheme]:
    """Adds a scheme class to the registry (usable as a decorator); a name can be registered
    once, as with transports."""
    if cls.name in REGISTRY:
        raise ValueError(f"scheme {cls.name!r} is registered already")
    REGISTRY[cls.name] = cls
    return cls


for _cls in (Uncoded, AttiaTandon, Cycles, AttiaTandonExcess, ElmahdyMohajer, Decentralized, Best):
    register(_cls)
Best.registry = REGISTRY  # best chooses among the registered schemes


def get_scheme(name: str, point_bytes: int | None = None) -> Scheme:
    """The scheme called ``name`` for ``point_bytes``-byte points (if known);
    :class:`UsageError` lists the valid names otherwise."""
    if name not in REGISTRY:
        raise UsageError(f"unknown scheme {name!r}; valid: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name](point_bytes)


__all__ = ["REGISTRY", "CacheState", "Scheme", "get_scheme", "register"]
