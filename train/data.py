"""Data sources and the master's fixed-size records (design section 1).

A *record* is one training point serialised as bytes: ``features`` float32 values followed by
the int32 label, little-endian, ``4 * features + 4`` bytes. The master holds the training set
as a ``torch.uint8`` tensor ``(N, B)`` of records; workers turn decoded records back into
tensors. ``N`` is trimmed to a multiple of the number of workers (the run logs the drop).

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


def to_records(x: np.ndarray, y: np.ndarray) -> torch.Tensor:
    """``(N, d)`` features and ``(N,)`` labels as an ``(N, 4d + 4)`` uint8 tensor."""
    n = x.shape[0]
    feats = np.ascontiguousarray(x, dtype="<f4").view(np.uint8).reshape(n, -1)
    labels = np.ascontiguousarray(y, dtype="<i4").view(np.uint8).reshape(n, LABEL_BYTES)
    return torch.from_numpy(np.concatenate([feats, labels], axis=1))


def from_records(rows: torch.Tensor, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`to_records`: float32 features ``(n, d)`` and int64 labels ``(n,)``."""
    n = rows.shape[0]
    if rows.shape[1] != record_bytes(features):
        raise ValueError(f"records of {rows.shape[1]} bytes, expected {record_bytes(features)}")
    x = rows[:, : 4 * features].contiguous().view(torch.float32).reshape(n, features)
    y = rows[:, 4 * features :].contiguous().view(torch.int32).reshape(n).long()
    return x, y


def describe(cfg: Any) -> DataInfo:
    """Sizes of the configured source (synthetic: from the config, without generating)."""
    source = _source(cfg)
    if source == "synthetic":
        _check_synthetic(cfg)
        return DataInfo(int(cfg.points), int(cfg.features), int(cfg.classes))
    x, y, x_test, _ = _raw(cfg, seed=0)
    train = x.shape[0] if x_test is not None else x.shape[0] - _test_count(x.shape[0], cfg)
    return DataInfo(int(train), int(x.shape[1]), int(y.max()) + 1)


def load(cfg: Any, workers: int, seed: int) -> DataSet:
    """The configured data set, split, normalised and trimmed to a multiple of ``workers``."""
    x, y, x_test, y_test = _raw(cfg, seed)
    classes = int(max(y.max(), -1 if y_test is None else y_test.max())) + 1
    if x_test is None:
        order = np.random.default_rng([seed, 7]).permutation(x.shape[0])
        n_test = _test_count(x.shape[0], cfg)
        test, train = order[:n_test], order[n_test:]
        x, y, x_test, y_test = x[train], y[train], x[test], y[test]
    if bool(cfg.get("normalise", True)):
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


def _source(cfg: Any) -> str:
    source = str(cfg.source)
    if source not in SOURCES:
        raise UsageError(f"data.source {source!r} unknown; valid: {', '.join(SOURCES)}")
    return source


def _test_count(n: int, cfg: Any) -> int:
    frac = float(cfg.get("test_fraction", 0.2))
    if not 0.0 < frac < 1.0:
        raise UsageError(f"data.test_fraction={frac} out of range (0, 1)")
    return max(1, round(n * frac))


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


def _raw(
    cfg: Any, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Features and labels of the source (test arrays only if the source brings its own)."""
    source = _source(cfg)
    if source == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.data.astype(np.float32), digits.target.astype(np.int64), None, None
    if source == "synthetic":
        return _synthetic(cfg, seed)
    return _file(cfg)


def _check_synthetic(cfg: Any) -> None:
    for key, low in (("points", 1), ("test_points", 1), ("features", 1), ("classes", 2)):
        if int(cfg[key]) < low:
            raise UsageError(f"data.{key}={cfg[key]} out of range (must be >= {low})")


def _synthetic(cfg: Any, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gaussian classes: class means ``separation * N(0, I)``, unit noise (vectorised)."""
    _check_synthetic(cfg)
    n, n_test = int(cfg.points), int(cfg.test_points)
    d, c = int(cfg.features), int(cfg.classes)
    rng = np.random.default_rng([seed, 11])
    means = rng.standard_normal((c, d), dtype=np.float32) * float(cfg.separation) / np.sqrt(d)
    y = rng.integers(0, c, size=n + n_test)
    x = means[y] + rng.standard_normal((n + n_test, d), dtype=np.float32)
    return x[:n], y[:n], x[n:], y[n:]


def _file(cfg: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``X``/``y`` (and optional ``X_test``/``y_test``) from an ``.npz`` or ``.pt`` file."""
    path = Path(str(cfg.get("path") or ""))
    if not str(cfg.get("path") or ""):
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
