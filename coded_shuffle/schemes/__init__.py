"""The scheme registry: one module per scheme, one entry here."""

from __future__ import annotations

from ..errors import UsageError
from .attia_tandon import AttiaTandon
from .attia_tandon_excess import AttiaTandonExcess
from .base import CacheState, Scheme
from .best import Best
from .cycles import Cycles
from .elmahdy_mohajer import ElmahdyMohajer
from .uncoded import Uncoded

REGISTRY: dict[str, type[Scheme]] = {
    cls.name: cls for cls in (Uncoded, AttiaTandon, Cycles, AttiaTandonExcess, ElmahdyMohajer, Best)
}


def register(cls: type[Scheme]) -> type[Scheme]:
    """Adds a scheme class to the registry (usable as a decorator)."""
    REGISTRY[cls.name] = cls
    return cls


def get_scheme(name: str) -> Scheme:
    """The scheme called ``name``; :class:`UsageError` lists the valid names otherwise."""
    try:
        return REGISTRY[name]()
    except KeyError:
        raise UsageError(f"unknown scheme {name!r}; valid: {', '.join(sorted(REGISTRY))}") from None


__all__ = ["REGISTRY", "CacheState", "Scheme", "get_scheme", "register"]
