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

    ``helpers``: plain functions of ``fn``'s module that ``fn`` calls; they are compiled
    first, and ``fn`` calls their compiled forms (:meth:`using`).
    """

    def __init__(self, fn: Callable[..., Any], helpers: tuple[Callable[..., Any], ...] = ()):
        self.fn, self.helpers = fn, helpers
        self._compiled: Callable[..., Any] | None = None
        functools.update_wrapper(self, fn)

    @classmethod
    def using(cls, *helpers: Callable[..., Any]) -> Callable[[Callable[..., Any]], LazyJit]:
        """``@LazyJit.using(a, b)``: a function that calls the plain functions ``a``, ``b``."""
        return lambda fn: cls(fn, helpers)

    def __call__(self, *args: Any) -> Any:
        if self._compiled is None:
            import numba  # here, not at the top: see the module's docstring

            for helper in self.helpers:  # what fn's name resolves to when it is compiled
                self.fn.__globals__[helper.__name__] = numba.njit(cache=True, nogil=True)(helper)
            self._compiled = numba.njit(cache=True, nogil=True)(self.fn)
        return self._compiled(*args)
