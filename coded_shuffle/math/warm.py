"""Compiling ahead of the timed work: a scheme's planner and the transition bound run once on a
tiny instance, so that numba compiles their loops (on the first run after an install) or loads
them from its disk cache now, and no ``plan_seconds`` includes a compile."""

from __future__ import annotations

import time

import numpy as np

from coded_shuffle.errors import UsageError
from coded_shuffle.math.bounds import EXACT_MAX_WORKERS
from coded_shuffle.math.schemes.base import Scheme
from coded_shuffle.math.schemes.cycle_plan import SMALL_MAX_WORKERS
from coded_shuffle.math.transition_bounds import lower_bound

# a tiny transition past every small-K path (the searches that numba compiles run above
# them), and a small one for the schemes that plan no such K
WARM_SIZES = ((max(SMALL_MAX_WORKERS, EXACT_MAX_WORKERS) + 1, 2), (4, 12))
COMPILE_NOTE_SECONDS = 0.5  # longer than this: a compile happened, worth a line
_warmed: set[tuple[str, float]] = set()


def warm_planner(scheme: Scheme, storage: float = 1.0) -> float:
    """Plans one tiny random transition with ``scheme`` at ``storage`` and bounds it (the
    first of :data:`WARM_SIZES` that the scheme plans); returns the seconds it took (0.0 when
    done before in this process)."""
    key = (scheme.name, float(storage))
    if key in _warmed:
        return 0.0
    _warmed.add(key)
    t0 = time.perf_counter()
    for k, batch in WARM_SIZES:
        rng = np.random.default_rng(0)
        deal = np.repeat(np.arange(k), batch)
        t = min(float(storage), float(k))
        try:
            scheme.check(deal.size, k, t)
        except UsageError:
            continue
        state = scheme.initial_state(rng.permutation(deal), k, t)
        new = rng.permutation(deal)
        scheme.plan(state, new)
        lower_bound(state, new)
        break
    return time.perf_counter() - t0
