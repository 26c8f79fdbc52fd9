"""Shuffle policies: how each epoch's assignment follows the previous one.

* ``full``: a uniformly random balanced assignment every epoch (random reshuffling; the
  papers' model, docs/model.md).
* ``partial`` with ``fraction`` ``Q`` in ``(0, 1]``: every worker gives up ``m = round(Q q)``
  of its ``q`` points (at least one), chosen uniformly at random; the ``K m`` freed points are
  dealt to the workers uniformly at random, ``m`` to each, so every batch keeps ``q`` points.
  At ``Q = 1`` every point is freed and dealt at random: the distribution of ``full``.
* ``none``: the placement stays (each worker only reshuffles its own points, locally).

Every assignment is drawn from ``(seed, epoch)`` and the previous one, so every rank derives
the same chain of assignments.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import random_assignment

POLICIES = ("full", "partial", "none")
PLACEMENTS = ("random", "by_label")


def full_assignment(seed: int, epoch: int, num_points: int, num_workers: int) -> np.ndarray:
    """Epoch ``epoch``'s uniformly random balanced assignment (random reshuffling)."""
    rng = np.random.default_rng([seed, 0, epoch])
    return random_assignment(num_points, num_workers, rng)


def by_label_assignment(labels: np.ndarray, num_workers: int) -> np.ndarray:
    """The first assignment dealt in label order: the points sorted by label (stably), the
    first ``q`` to worker 0, the next ``q`` to worker 1, ...: every worker starts with a few
    classes only (skewed shards)."""
    n = labels.size
    first = np.empty(n, dtype=np.int64)
    first[np.argsort(labels, kind="stable")] = np.arange(n, dtype=np.int64) // (n // num_workers)
    return first


def check_placement(name: str, key: str = "placement") -> None:
    if name not in PLACEMENTS:
        raise UsageError(f"{key}={name!r} unknown; valid: {', '.join(PLACEMENTS)}")


@dataclass(frozen=True)
class ShufflePolicy:
    """A policy and its fraction (used by ``partial`` only)."""

    name: str = "full"
    fraction: float = 1.0

    def check(self, policy_key: str = "shuffle", fraction_key: str = "fraction") -> None:
        """:class:`UsageError` naming the key (as the caller names it) and the valid values."""
        if self.name not in POLICIES:
            raise UsageError(f"{policy_key}={self.name!r} unknown; valid: {', '.join(POLICIES)}")
        if not 0.0 < float(self.fraction) <= 1.0:
            raise UsageError(f"{fraction_key}={self.fraction} out of range (0, 1]")

    def moved_per_worker(self, batch: int) -> int:
        """How many of its ``batch`` points every worker gives up each epoch."""
        if self.name == "none":
            return 0
        if self.name == "full":
            return batch
        return min(batch, max(1, int(np.floor(self.fraction * batch + 0.5))))

    def next_assignment(
        self, previous: np.ndarray, seed: int, epoch: int, num_workers: int
    ) -> np.ndarray:
        """Epoch ``epoch``'s assignment after ``previous`` (a balanced assignment)."""
        n = previous.size
        if self.name == "full":
            return full_assignment(seed, epoch, n, num_workers)
        if self.name == "none":
            return previous.copy()
        freed = self.freed_points(previous, seed, epoch, num_workers)
        m = freed.size // num_workers
        new = previous.copy()
        rng = np.random.default_rng([seed, 3, epoch])
        new[rng.permutation(freed)] = np.repeat(np.arange(num_workers), m)
        return new

    def freed_points(
        self, previous: np.ndarray, seed: int, epoch: int, num_workers: int
    ) -> np.ndarray:
        """The points every worker gives up in ``epoch`` (``partial``): ``m`` of each
        worker's, uniformly at random, worker by worker."""
        n = previous.size
        batch = n // num_workers
        m = self.moved_per_worker(batch)
        rng = np.random.default_rng([seed, 2, epoch])
        # every worker's points in a random order, worker by worker: a (K, q) grid
        grid = np.lexsort((rng.random(n), previous)).reshape(num_workers, batch)
        return grid[:, :m].reshape(-1)
