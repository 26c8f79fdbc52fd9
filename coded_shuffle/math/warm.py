"""Compiling ahead of the timed work: a scheme's planner and the transition bound run once on a
tiny instance with the real number of workers (the paths they take depend on it: the searches
that numba compiles run above a few dozen workers), so that numba compiles their loops (on the
first run after an install) or loads them from its disk cache now, and no ``plan_seconds``
includes a compile."""

from __future__ import annotations

import time

import numpy as np

from coded_shuffle.errors import UsageError
from coded_shuffle.math.schemes.base import Scheme
from coded_shuffle.math.transition_bounds import lower_bound

WARM_BATCH = 2  # points per worker of the tiny transition
COMPILE_NOTE_SECONDS = 0.5  # longer than this: a compile happened, worth a line
_warmed: set[tuple[str, float, int]] = set()


def warm_planner(scheme: Scheme, storage: float, workers: int) -> float:
    """Plans one tiny random transition (:data:`WARM_BATCH` points per worker) with
    ``scheme`` for ``workers`` at ``storage`` and bounds it; returns the seconds it took (0.0
    when done before in this process, or when the scheme does not plan it)."""
    key = (scheme.name, float(storage), int(workers))
    if key in _warmed:
        return 0.0
    _warmed.add(key)
    rng = np.random.default_rng(0)
    deal = np.repeat(np.arange(workers), WARM_BATCH)
    t0 = time.perf_counter()
    try:
        scheme.check(deal.size, workers, float(storage))
    except UsageError:
        return 0.0
    state = scheme.initial_state(rng.permutation(deal), workers, float(storage))
    new = rng.permutation(deal)
    scheme.plan(state, new)
    lower_bound(state, new)
    return time.perf_counter() - t0
