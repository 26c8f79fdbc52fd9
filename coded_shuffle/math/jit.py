"""Numba compilation on first call, so that importing the math does not load numba.

The math's few loops that cannot be vectorised (a breadth-first search per cycle, an insertion
sweep per ordering) are compiled with numba on their first call and cached on disk beside the
module, like the byte codec's kernel; a process that never calls them never imports numba.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


class LazyJit:
    """``fn`` compiled by ``numba.njit(cache=True)`` when first called.

    The compiled function must not call another compiled one (each is compiled on its own).
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._compiled: Callable[..., Any] | None = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any) -> Any:
        if self._compiled is None:
            import numba  # here, not at the top: see the module's docstring

            self._compiled = numba.njit(cache=True, nogil=True)(self.fn)
        return self._compiled(*args)
