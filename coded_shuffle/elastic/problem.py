"""The least-squares problem of Yang et al. 2018 sec. 3.2: ``f(w) = |Xw -
y|^2 / (2N) + ridge |w|^2 / 2``.

The synthetic data set comes from ``sources`` contiguous sources (one per initial worker of the
uncoded baselines, as when data stays where it was collected). Sources differ in feature scales
and in their true weights (``heterogeneity``), so losing a source's rows, as the *ignore*
baseline does, moves the optimum away from the full-data one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from coded_shuffle.errors import UsageError


@dataclass(frozen=True)
class Problem:
    """Data ``X`` (``N x d``), targets ``y`` and the ridge weight; the master holds all of it."""

    X: np.ndarray
    y: np.ndarray
    ridge: float = 0.0
    X_test: np.ndarray | None = None  # held-out points of the same sources (test_loss)
    y_test: np.ndarray | None = None

    @property
    def num_points(self) -> int:
        return int(self.X.shape[0])

    @property
    def features(self) -> int:
        return int(self.X.shape[1])

    def loss(self, w: np.ndarray) -> float:
        r = self.X @ w - self.y
        return float(r @ r / (2 * self.num_points) + self.ridge * (w @ w) / 2)

    def test_loss(self, w: np.ndarray) -> float | None:
        """``|X_test w - y_test|^2 / (2 N_test)``: the generalisation error (None: no test
        split)."""
        if self.X_test is None or self.y_test is None or not self.y_test.size:
            return None
        r = self.X_test @ w - self.y_test
        return float(r @ r / (2 * self.y_test.size))

    def gradient(self, w: np.ndarray) -> np.ndarray:
        """The exact full gradient ``X^T (X w - y) / N + ridge w`` (the master's check)."""
        return self.X.T @ (self.X @ w - self.y) / self.num_points + self.ridge * w

    @cached_property
    def smoothness(self) -> float:
        """Largest eigenvalue of the Hessian ``X^T X / N + ridge I``."""
        gram = self.X.T @ self.X / self.num_points
        return float(np.linalg.eigvalsh(gram)[-1] + self.ridge)

    def step_size(self, lr: float | None) -> float:
        """``lr``, or ``1 / smoothness`` when ``lr`` is None (gradient descent converges)."""
        if lr is None:
            return 1.0 / self.smoothness
        if not lr > 0:
            raise UsageError(f"job.lr={lr} must be > 0 (or null for 1/smoothness)")
        return float(lr)


def make_problem(
    points: int,
    features: int,
    sources: int,
    noise: float = 0.1,
    heterogeneity: float = 1.0,
    ridge: float = 0.0,
    seed: int = 0,
    test_points: int = 0,
) -> Problem:
    """Synthetic heterogeneous linear regression, ``sources`` contiguous row segments, and
    ``test_points`` held-out points drawn the same way (after the training data, which they
    do not change)."""
    if points < 1 or features < 1:
        raise UsageError(f"data needs points >= 1 and features >= 1, got {points} and {features}")
    if test_points < 0:
        raise UsageError(f"job.problem.test_points={test_points} must be >= 0")
    if not 1 <= sources <= points:
        raise UsageError(f"sources={sources} out of range 1..{points} (points)")
    if ridge < 0 or noise < 0 or heterogeneity < 0:
        raise UsageError(
            f"ridge={ridge}, noise={noise}, heterogeneity={heterogeneity} must all be >= 0"
        )
    rng = np.random.default_rng(seed)
    sizes = points // sources + (np.arange(sources) < points % sources)  # as np.array_split
    source = np.repeat(np.arange(sources), sizes)
    scales = np.exp(rng.uniform(-1.0, 1.0, (sources, features)))
    X = rng.standard_normal((points, features)) * scales[source]
    w_true = rng.standard_normal(features)
    shift = heterogeneity * rng.standard_normal((sources, features))
    y = np.einsum("nd,nd->n", X, w_true + shift[source]) + noise * rng.standard_normal(points)
    test_source = rng.integers(0, sources, test_points)
    X_test = rng.standard_normal((test_points, features)) * scales[test_source]
    y_test = np.einsum("nd,nd->n", X_test, w_true + shift[test_source])
    y_test += noise * rng.standard_normal(test_points)
    return Problem(X, y, float(ridge), X_test, y_test)
