"""The cache state: what every worker holds before a delivery (docs/model.md).

Beside the assignments, not inside the schemes: the bounds, the schemes and the byte layer
all read it. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from coded_shuffle.math.assignment import batches
from coded_shuffle.math.plan import byte_parts, subpoint_bytes


@dataclass(frozen=True)
class CacheState:
    """The placement: what every worker holds before a delivery.

    ``assignment`` is the epoch's assignment (who processes which point); ``caches[k]`` the
    sorted sub-point ids worker ``k`` stores (its batch included); ``labels`` any structure a
    scheme keeps beside it (e.g. the sub-point labels of an excess-storage placement).
    """

    assignment: np.ndarray
    num_workers: int
    splits: int
    caches: tuple[np.ndarray, ...]
    labels: Any = None
    members: tuple[str, ...] = ()  # ``best``: the schemes it chose among at the placement

    @property
    def num_points(self) -> int:
        return int(self.assignment.size)

    def stored_points(self) -> np.ndarray:
        """Points' worth stored by every worker (sub-points / splits)."""
        return np.array([c.size for c in self.caches], dtype=np.float64) / self.splits


def batch_state(assignment: np.ndarray, num_workers: int) -> CacheState:
    """No excess storage: every worker holds exactly its batch, whole."""
    caches = tuple(b.astype(np.int64) for b in batches(assignment, num_workers))
    return CacheState(assignment, num_workers, 1, caches)


@dataclass(frozen=True)
class SharedLabels:
    """A memory-shared placement: one corner state per byte part."""

    params: tuple[int, ...]  # corner of every part (t or p)
    parts: tuple[CacheState, ...]
    fractions: tuple[float, ...]  # fraction of every point's bytes on each part


def part_states(state: CacheState) -> tuple[tuple[CacheState, ...], tuple[float, ...]]:
    """The per-part corner states of a (possibly single-part) placement, with their fractions."""
    if isinstance(state.labels, SharedLabels):
        return state.labels.parts, state.labels.fractions
    return (state,), (1.0,)


def shared_state(
    params: Sequence[int], parts: Sequence[CacheState], fractions: Sequence[float]
) -> CacheState:
    """One part: that corner's state. Several: the top part's fields, all parts in ``labels``."""
    if len(parts) == 1:
        return parts[0]
    top = parts[-1]
    return CacheState(
        assignment=top.assignment,
        num_workers=top.num_workers,
        splits=top.splits,
        caches=top.caches,
        labels=SharedLabels(tuple(params), tuple(parts), tuple(fractions)),
    )


def stored_bytes(state: CacheState, point_bytes: int) -> np.ndarray:
    """Bytes every worker stores, as a WorkerStore holds them (sub-point padding included)."""
    parts, fractions = part_states(state)
    sizes = byte_parts(point_bytes, fractions)
    out = np.zeros(state.num_workers, dtype=np.int64)
    for p, b in zip(parts, sizes, strict=True):
        out += np.array([c.size for c in p.caches], dtype=np.int64) * subpoint_bytes(b, p.splits)
    return out
