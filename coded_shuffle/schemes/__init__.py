"""The scheme registry: one module per scheme, one entry here."""

from __future__ import annotations

from ..errors import UsageError
from ..state import CacheState
from .attia_tandon import AttiaTandon
from .attia_tandon_excess import AttiaTandonExcess
from .base import Scheme
from .best import Best
from .cycles import Cycles
from .elmahdy_mohajer import ElmahdyMohajer
from .uncoded import Uncoded

REGISTRY: dict[str, type[Scheme]] = {
    cls.name: cls for cls in (Uncoded, AttiaTandon, Cycles, AttiaTandonExcess, ElmahdyMohajer, Best)
}
Best.registry = REGISTRY  # best chooses among the registered schemes


def register(cls: type[Scheme]) -> type[Scheme]:
    """Adds a scheme class to the registry (usable as a decorator)."""
    REGISTRY[cls.name] = cls
    return cls


def get_scheme(name: str, point_bytes: int | None = None) -> Scheme:
    """The scheme called ``name`` for ``point_bytes``-byte points (if known);
    :class:`UsageError` lists the valid names otherwise."""
    if name not in REGISTRY:
        raise UsageError(f"unknown scheme {name!r}; valid: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name](point_bytes)


__all__ = ["REGISTRY", "CacheState", "Scheme", "get_scheme", "register"]
