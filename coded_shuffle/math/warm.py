"""Compiling ahead of the timed work: a scheme's planner and the transition bound run once on a
tiny instance, so that numba compiles their loops (on the first run after an install) or loads
them from its disk cache now, and no ``plan_seconds`` includes a compile.

The paths they take depend on the number of workers (the searches that numba compiles run
above a few dozen workers: :data:`~coded_shuffle.math.bounds.EXACT_MAX_WORKERS`,
:data:`~coded_shuffle.math.schemes.cycle_plan.SMALL_MAX_WORKERS`), so the tiny instance has
the real number up to :data:`WARM_WORKERS_MAX`, above both, and that many beyond it: every
loop is reached, and a second run at ``K = 1,024`` does not plan ``K = 1,024`` to warm up.
:func:`counting_compiles` tells a real compile from a load from the cache.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

import numpy as np

from coded_shuffle.errors import UsageError
from coded_shuffle.math.bounds import EXACT_MAX_WORKERS
from coded_shuffle.math.schemes.base import Scheme
from coded_shuffle.math.schemes.cycle_plan import SMALL_MAX_WORKERS
from coded_shuffle.math.transition_bounds import lower_bound

WARM_BATCH = 2  # points per worker of the tiny transition
WARM_WORKERS_MAX = 2 * max(EXACT_MAX_WORKERS, SMALL_MAX_WORKERS)  # every K-dependent path
_warmed: set[tuple[str, float, int]] = set()


def warm_workers(storage: float, workers: int) -> int:
    """The number of workers of the tiny transition that warms a run of ``workers``."""
    return min(workers, max(WARM_WORKERS_MAX, math.ceil(storage)))


@contextlib.contextmanager
def counting_compiles() -> Iterator[list[object]]:
    """The numba compiles inside the block (events; loads from numba's disk cache are none):
    whether a "compiled" line is true."""
    from numba.core import event  # here, not at the top: the math imports without numba

    with event.install_recorder("numba:compile") as recorder:
        yield recorder.buffer


def warm_planner(scheme: Scheme, storage: float, workers: int) -> float:
    """Plans one tiny random transition (:data:`WARM_BATCH` points per worker) with
    ``scheme`` for ``workers`` (at most :func:`warm_workers`) at ``storage`` and bounds it;
    returns the seconds it took (0.0 when done before in this process, or when the scheme does
    not plan it)."""
    workers = warm_workers(storage, workers)
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
