"""The array sources of ``data=``: scikit-learn's bundled ``digits``, ``synthetic`` Gaussian
classes with size knobs, and ``file`` (a packed directory of ``.npy`` files, memory-mapped, or
an ``.npz`` / ``.pt`` file). The in-memory ones move float32 features and an int32 label: a
record of ``4 * features + 4`` bytes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coded_shuffle.codec.packed import Packed
from coded_shuffle.codec.records import ColumnDataset, as_tensor
from coded_shuffle.errors import UsageError

from .data import Arrays, DataInfo, DataSet, Source, Transform, kept
from .datasets import load_digits, model_shape, transform_from


@dataclass(frozen=True, kw_only=True)
class Digits(Source):
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes, no download)."""

    def raw(self, seed: int) -> Arrays:
        x, y = load_digits()
        return x.astype(np.float32), y, None, None


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
        n = self.points
        blocks = list(self.blocks(seed, self.points + self.test_points))
        x = np.concatenate([b for b, _ in blocks])
        y = np.concatenate([b for _, b in blocks])
        return x[:n], y[:n], x[n:], y[n:]

    def blocks(self, seed: int, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The points (training then test) and their labels, ``rows`` at a time: the same
        values whatever ``rows`` (NumPy draws a stream of normals in order)."""
        self.check()
        n, d, c = self.points + self.test_points, self.features, self.classes
        rng = np.random.default_rng([seed, 11])
        means = rng.standard_normal((c, d), dtype=np.float32) * float(self.separation) / np.sqrt(d)
        y = rng.integers(0, c, size=n)
        for a in range(0, n, rows):
            labels = y[a : a + rows]
            yield means[labels] + rng.standard_normal((labels.size, d), dtype=np.float32), labels


@dataclass(frozen=True, kw_only=True)
class File(Source):
    """``X``/``y`` (and optional ``X_test``/``y_test``): a directory of ``.npy`` files
    (:mod:`coded_shuffle.codec.packed`: memory-mapped, records of any dtype as stored,
    ``data.transform`` on the decoded inputs), or an ``.npz`` / ``.pt`` file (read whole: float32
    features, standardised unless ``data.normalise=false``)."""

    path: str
    normalise: bool | None = None  # null: true for .npz/.pt, false for a directory
    transform: Any = None

    @property
    def directory(self) -> bool:
        return bool(self.path) and Path(self.path).is_dir()

    @property
    def standardise(self) -> bool:
        if self.directory and self.normalise:
            raise UsageError(
                f"data.normalise=true: a directory's records move as stored (no copy of "
                f"{self.path!r} is made); leave data.normalise null or false (coded-shuffle "
                "pack writes standardised features where the source standardises)"
            )
        return self.normalise is not False and not self.directory

    def input_transform(self) -> Transform:
        return transform_from(self.transform)

    def describe(self) -> DataInfo:
        if not self.directory:
            return super().describe()
        self.standardise  # noqa: B018 (checks data.normalise)
        packed = Packed.open(Path(self.path))
        x = as_tensor(np.ascontiguousarray(packed.x[:1]))
        shape = model_shape(x, self.input_transform())
        train = packed.x.shape[0]
        if packed.x_test is None:
            train -= self.test_count(train)
        record = int(np.prod(packed.x.shape[1:], dtype=np.int64)) * packed.x.itemsize
        return DataInfo(
            train_points=int(train),
            features=int(np.prod(shape)),
            classes=packed.classes,
            record_bytes=record + packed.y.itemsize,
            shape=shape,
        )

    def load(self, workers: int, seed: int) -> DataSet:
        if not self.directory:
            return super().load(workers, seed)
        self.standardise  # noqa: B018 (checks data.normalise)
        packed = Packed.open(Path(self.path))
        x, y = as_tensor(packed.x), as_tensor(packed.y)
        transform = self.input_transform()
        model_shape(x[:1].clone(), transform)
        if packed.x_test is None or packed.y_test is None:
            test, train = self.held_out(x.shape[0], seed)
            keep = kept(train.size, workers)
            train_set = ColumnDataset(x, y, index=train[:keep], mapped=True)
            test_set = ColumnDataset(x, y, index=test, mapped=True)
        else:
            train = np.arange(x.shape[0])
            keep = kept(train.size, workers)
            train_set = ColumnDataset(x[:keep], y[:keep], mapped=True)
            test = (as_tensor(packed.x_test), as_tensor(packed.y_test))
            test_set = ColumnDataset(*test, mapped=True)
        return DataSet(
            train=train_set,
            test=test_set,
            classes=packed.classes,
            dropped=int(train.size - keep),
            transform=transform,
        )

    def raw(self, seed: int) -> Arrays:
        path = Path(self.path)
        if not self.path:
            raise UsageError("data.path is empty; give data.path=DIR, FILE.npz or FILE.pt")
        if not path.is_file():
            raise UsageError(
                f"data.path {str(path)!r} is neither a directory of .npy files nor a file"
            )
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


# --- any map-style Dataset (data=dataset) ----------------------------------------------------
