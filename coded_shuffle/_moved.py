"""The module paths the library had before its layers (``coded_shuffle.schemes``,
``coded_shuffle.transports.chain`` ...) still import: each name is the module at its new path,
the same object (README: Layout). Internal code uses the new paths only."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

MOVED = {
    "assignment": "math.assignment",
    "plan": "math.plan",
    "state": "math.state",
    "bounds": "math.bounds",
    "bounds_api": "math.transition_bounds",
    "rate_memory": "math.rate_memory",
    "decoder": "math.index_decoder",
    "schemes": "math.schemes",
    "kernel": "codec.kernel",
    "_jit": "codec.compiled",
    "records": "codec.records",
    "blockstore": "codec.blockstore",
    "shuffle": "distributed.shuffle",
    "epochs": "distributed.epochs",
    "delivery": "distributed.delivery",
    "transports": "distributed.transports",
    "rates": "costs.rates",
    "cli": "tools.cli",
    "evaluate": "tools.evaluate",
    "cluster": "tools.cluster",
}
PACKAGE = "coded_shuffle"


def new_name(old: str) -> str | None:
    """``coded_shuffle.transports.chain`` -> ``coded_shuffle.distributed.transports.chain``."""
    if not old.startswith(PACKAGE + "."):
        return None
    head, _, tail = old[len(PACKAGE) + 1 :].partition(".")
    if head not in MOVED:
        return None
    return f"{PACKAGE}.{MOVED[head]}" + (f".{tail}" if tail else "")


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        sys.modules[module.__name__] = importlib.import_module(self.target)


class MovedModules(importlib.abc.MetaPathFinder):
    """Finds an old path first (before the file system could load a second copy)."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
