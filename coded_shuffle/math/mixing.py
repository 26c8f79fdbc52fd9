"""What a run's shuffles have mixed so far: what a cheaper shuffle gives up for its bytes.

``partial`` and ``none`` move fewer points than full reshuffling; what they cost is mixing.
Two figures per epoch, from the assignments alone (no torch):

* ``coverage_min``: the smallest share of the data set that any worker has trained on so far
  (the union of its batches over ``N``). Full reshuffles reach ``1 - (1 - 1/K)^e`` after ``e``
  epochs in expectation; ``none`` stays at ``1/K``.
* ``label_tv_max``: the largest total-variation distance between a worker's batch's label
  distribution and the data set's, ``max_k 1/2 sum_c |p_k(c) - p(c)|`` (0: every batch is a
  fair sample of the classes; a ``by_label`` placement starts near ``1 - 1/K``).

Mosaic Streaming reports a shuffle-quality figure for the same reason.
"""

from __future__ import annotations

import numpy as np

from coded_shuffle.math.policies import ShufflePolicy, by_label_assignment, full_assignment

POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


class Mixing:
    """Every worker's points trained on so far (one bit per point and worker) and the data
    set's labels; :meth:`add` takes an epoch's assignment and returns the epoch's figures."""

    def __init__(
        self, labels: np.ndarray, num_workers: int, seen: np.ndarray | None = None
    ) -> None:
        self.labels = np.asarray(labels, dtype=np.int64)
        self.num_points, self.num_workers = self.labels.size, num_workers
        self.classes = int(self.labels.max()) + 1 if self.labels.size else 0
        self.overall = np.bincount(self.labels, minlength=self.classes) / max(1, self.num_points)
        shape = (num_workers, -(-self.num_points // 8))
        self.seen = np.zeros(shape, dtype=np.uint8) if seen is None else seen
        if self.seen.shape != shape:
            raise ValueError(f"seen bits of shape {self.seen.shape}, expected {shape}")

    def add(self, assignment: np.ndarray) -> dict[str, float]:
        """An epoch's assignment (worker of every point): ``coverage_min`` and
        ``label_tv_max`` after it."""
        a = np.asarray(assignment, dtype=np.int64)
        if a.size != self.num_points:
            raise ValueError(f"assignment of {a.size} points, expected {self.num_points}")
        points = np.arange(self.num_points)
        np.bitwise_or.at(self.seen, (a, points >> 3), (1 << (points & 7)).astype(np.uint8))
        covered = POPCOUNT[self.seen].sum(axis=1)
        counts = np.bincount(
            a * self.classes + self.labels, minlength=self.num_workers * self.classes
        )
        per_worker = counts.reshape(self.num_workers, self.classes)
        batch = np.maximum(per_worker.sum(axis=1, keepdims=True), 1)
        tv = 0.5 * np.abs(per_worker / batch - self.overall).sum(axis=1)
        return {
            "coverage_min": float(covered.min() / self.num_points),
            "label_tv_max": float(tv.max()),
        }


SIMULATED_POINTS = 1 << 17  # the most points :func:`expected_mixing` simulates


def labels_of(shares: list[float] | np.ndarray, num_points: int, seed: int) -> np.ndarray:
    """``num_points`` labels in the classes' ``shares`` (rounded; in a random order)."""
    shares = np.asarray(shares, dtype=np.float64)
    counts = np.floor(shares / max(shares.sum(), 1e-12) * num_points).astype(np.int64)
    counts[np.argmax(shares)] += num_points - int(counts.sum())
    labels = np.repeat(np.arange(shares.size), counts)
    return np.random.default_rng([seed, 9]).permutation(labels)


def expected_mixing(
    shares: list[float] | np.ndarray,
    num_points: int,
    num_workers: int,
    policy: ShufflePolicy,
    placement: str,
    epochs: int,
    seed: int = 0,
) -> dict[str, float]:
    """``coverage_min`` and ``label_tv_max`` after ``epochs``, from a run of the policy's
    assignments (the job's own: the placement, then every epoch's from the seed) on labels in
    the classes' ``shares``; on at most :data:`SIMULATED_POINTS` points (a set of more points
    is simulated with fewer per worker: its sampling noise in ``label_tv_max`` is then an
    overestimate)."""
    n = min(num_points, SIMULATED_POINTS)
    n -= n % num_workers
    labels = labels_of(shares, n, seed)
    if placement == "by_label":
        current = by_label_assignment(labels, num_workers)
    else:
        current = full_assignment(seed, 1, n, num_workers)
    mixing = Mixing(labels, num_workers)
    figures = mixing.add(current)
    for epoch in range(2, epochs + 1):
        current = policy.next_assignment(current, seed, epoch, num_workers)
        figures = mixing.add(current)
    return figures
