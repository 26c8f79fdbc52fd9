"""Data sources of the training jobs (docs/model.md).

The job hands the training split to :class:`~coded_shuffle.CodedShuffle` as float32 features
and an int32 label per point: a record of ``4 * features + 4`` bytes
(:mod:`coded_shuffle.codec.records`). ``N`` is trimmed to a multiple of the number of workers (the
run logs the drop).

Sources: ``digits`` (scikit-learn's bundled 8x8 digits, no download), ``synthetic`` (Gaussian
classes with size knobs, for scale runs) and ``file`` (``.npz`` or ``.pt`` with ``X`` and
``y``, optionally ``X_test`` and ``y_test``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coded_shuffle.errors import UsageError

SOURCES = ("digits", "synthetic", "file")
LABEL_BYTES = 4


@dataclass(frozen=True)
class DataInfo:
    """What the launcher checks before any process starts."""

    train_points: int  # before trimming to a multiple of the workers
    features: int
    classes: int


@dataclass(frozen=True)
class DataSet:
    """The master's data: the (trimmed) training split and the held-out test split."""

    x_train: np.ndarray  # (N, d) float32
    y_train: np.ndarray  # (N,) int64
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    dropped: int  # training points trimmed so that the workers divide N

    @property
    def num_points(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def features(self) -> int:
        return int(self.x_train.shape[1])


def record_bytes(features: int) -> int:
    """Bytes of one record: float32 features and an int32 label."""
    return 4 * features + LABEL_BYTES


def source_of(cfg: Any) -> Source:
    """The configured data source, built by Hydra's ``instantiate`` from ``data._target_``."""
    from hydra.utils import instantiate

    if "_target_" not in cfg:
        raise UsageError(f"data: no _target_; valid sources: {', '.join(SOURCES)}")
    return instantiate(cfg)


def describe(cfg: Any) -> DataInfo:
    """Sizes of the configured source (synthetic: from the config, without generating)."""
    return source_of(cfg).describe()


def load(cfg: Any, workers: int, seed: int) -> DataSet:
    """The configured data set, split, normalised and trimmed to a multiple of ``workers``."""
    source = source_of(cfg)
    x, y, x_test, y_test = source.raw(seed)
    classes = int(max(y.max(), -1 if y_test is None else y_test.max())) + 1
    if x_test is None:
        order = np.random.default_rng([seed, 7]).permutation(x.shape[0])
        n_test = source.test_count(x.shape[0])
        test, train = order[:n_test], order[n_test:]
        x, y, x_test, y_test = x[train], y[train], x[test], y[test]
    if source.normalise:
        x, x_test = _standardise(x, x_test)
    keep = x.shape[0] - x.shape[0] % workers if workers >= 1 else x.shape[0]
    return DataSet(
        x_train=np.ascontiguousarray(x[:keep], dtype=np.float32),
        y_train=np.ascontiguousarray(y[:keep], dtype=np.int64),
        x_test=np.ascontiguousarray(x_test, dtype=np.float32),
        y_test=np.ascontiguousarray(y_test, dtype=np.int64),
        classes=classes,
        dropped=int(x.shape[0] - keep),
    )


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


@dataclass(frozen=True, kw_only=True)
class Source:
    """A data source: features and labels (test arrays only if it brings its own).

    Built by ``instantiate`` from the config, which gives every field: the defaults live in
    the schema (:mod:`train.config`) and ``conf/data``, not here.
    """

    source: str
    test_fraction: float
    normalise: bool
    placement: str = "random"  # the first assignment (read by the job, not by the source)

    def raw(self, seed: int) -> Arrays:
        raise NotImplementedError

    def test_count(self, n: int) -> int:
        if not 0.0 < self.test_fraction < 1.0:
            raise UsageError(f"data.test_fraction={self.test_fraction} out of range (0, 1)")
        return max(1, round(n * self.test_fraction))

    def describe(self) -> DataInfo:
        x, y, x_test, _ = self.raw(seed=0)
        train = x.shape[0] if x_test is not None else x.shape[0] - self.test_count(x.shape[0])
        return DataInfo(int(train), int(x.shape[1]), int(y.max()) + 1)


@dataclass(frozen=True, kw_only=True)
class Digits(Source):
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes, no download)."""

    def raw(self, seed: int) -> Arrays:
        from sklearn.datasets import load_digits  # about 1 s: only for this source

        digits = load_digits()
        return digits.data.astype(np.float32), digits.target.astype(np.int64), None, None


@dataclass(frozen=True, kw_only=True)
class Synthetic(Source):
    """Gaussian classes: class means ``separation * N(0, I)``, unit noise (vectorised)."""

    test_fraction: float = 0.0  # unused: the source brings its own test points
    points: int
    test_points: int
    features: int
    classes: int
    separation: float

    def check(self) -> None:
        for key, low in (("points", 1), ("test_points", 1), ("features", 1), ("classes", 2)):
            if getattr(self, key) < low:
                raise UsageError(f"data.{key}={getattr(self, key)} out of range (must be >= {low})")

    def describe(self) -> DataInfo:
        self.check()
        return DataInfo(self.points, self.features, self.classes)

    def raw(self, seed: int) -> Arrays:
        self.check()
        n, n_test, d, c = self.points, self.test_points, self.features, self.classes
        rng = np.random.default_rng([seed, 11])
        means = rng.standard_normal((c, d), dtype=np.float32) * float(self.separation) / np.sqrt(d)
        y = rng.integers(0, c, size=n + n_test)
        x = means[y] + rng.standard_normal((n + n_test, d), dtype=np.float32)
        return x[:n], y[:n], x[n:], y[n:]


@dataclass(frozen=True, kw_only=True)
class File(Source):
    """``X``/``y`` (and optional ``X_test``/``y_test``) from an ``.npz`` or ``.pt`` file."""

    path: str

    def raw(self, seed: int) -> Arrays:
        path = Path(self.path)
        if not self.path:
            raise UsageError("data.path is empty; give data.path=FILE.npz or FILE.pt")
        if not path.is_file():
            raise UsageError(f"data.path {str(path)!r} is not a file")
        if path.suffix == ".npz":
            with np.load(path) as f:
                arrays = {k: f[k] for k in f.files}
        elif path.suffix == ".pt":
            obj = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(obj, dict):
                raise UsageError(f"data.path {str(path)!r}: expected a dict with X and y")
            arrays = {k: np.asarray(v) for k, v in obj.items()}
        else:
            raise UsageError(
                f"data.path {str(path)!r}: suffix {path.suffix!r} unknown; valid: .npz, .pt"
            )
        x, y = _xy(arrays, "X", "y", path)
        if "X_test" in arrays:
            x_test, y_test = _xy(arrays, "X_test", "y_test", path)
            if x_test.shape[1] != x.shape[1]:
                raise UsageError(f"{path}: X_test has {x_test.shape[1]} features, X {x.shape[1]}")
            return x, y, x_test, y_test
        return x, y, None, None


def _standardise(x: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature zero mean and unit variance with the training split's statistics."""
    mean = x.mean(axis=0, dtype=np.float64)
    std = x.std(axis=0, dtype=np.float64)
    std[std == 0] = 1.0
    return _scaled(x, mean, std), _scaled(x_test, mean, std)


def _scaled(x: np.ndarray, mean: np.ndarray, std: np.ndarray, rows: int = 1 << 16) -> np.ndarray:
    """``((x - mean) / std)`` in float64, stored as float32, a block of rows at a time (the
    same values as on the whole array, without a float64 copy of it)."""
    out = np.empty(x.shape, dtype=np.float32)
    for a in range(0, x.shape[0], rows):
        out[a : a + rows] = (x[a : a + rows] - mean) / std
    return out


def _xy(arrays: dict, xk: str, yk: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    if xk not in arrays or yk not in arrays:
        raise UsageError(f"{path}: needs arrays {xk!r} and {yk!r}, found {sorted(arrays)}")
    x = np.asarray(arrays[xk], dtype=np.float32)
    x = x.reshape(x.shape[0], -1) if x.ndim >= 2 else x.reshape(-1, 1)
    y = np.asarray(arrays[yk])
    if y.ndim != 1 or y.shape[0] != x.shape[0] or not np.issubdtype(y.dtype, np.integer):
        raise UsageError(f"{path}: {yk} must be {x.shape[0]} integer labels, got {y.shape}")
    if y.size and y.min() < 0:
        raise UsageError(f"{path}: label {int(y.min())} out of range (labels must be >= 0)")
    return x, y.astype(np.int64)
