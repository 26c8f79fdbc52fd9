"""The lower bound reported beside every delivery: the best one the project computes.

Whole-batch placements (no excess storage) use the ordering bound of Attia & Tandon 2016, Theorem 2
on the shuffle matrix; placements with excess storage use the ordering cut-set bound on the
placement's sub-points (:mod:`coded_shuffle.math.rate_memory`).
"""

from __future__ import annotations

import numpy as np

from coded_shuffle.math.assignment import shuffle_matrix
from coded_shuffle.math.bounds import ordering_bound
from coded_shuffle.math.rate_memory import placement_lower_bound
from coded_shuffle.math.state import CacheState


def is_batch_placement(state: CacheState) -> bool:
    """True when every worker stores exactly its own batch, whole."""
    if state.splits != 1:
        return False
    return all(
        np.array_equal(state.assignment[c], np.full(c.size, k)) for k, c in enumerate(state.caches)
    ) and (sum(c.size for c in state.caches) == state.num_points)


def lower_bound(state: CacheState, new_assignment: np.ndarray) -> tuple[float, bool]:
    """``(bound in points, exact ordering search)`` for the transition ``state -> new``."""
    if is_batch_placement(state):
        shuffle = shuffle_matrix(state.assignment, new_assignment, state.num_workers)
        value, exact, _ = ordering_bound(shuffle)
        return float(value), bool(exact)
    value, exact = placement_lower_bound(state, new_assignment)
    return float(value), bool(exact)
