"""Data sources of the training jobs (docs/model.md, docs/training.md "Your own data set").

The job hands the training split to :class:`~coded_shuffle.CodedShuffle` as an input tensor and
an integer label per point (:mod:`coded_shuffle.codec.records`). ``N`` is trimmed to a multiple
of the number of workers (the run logs the drop).

Sources: ``digits`` (scikit-learn's bundled 8x8 digits, no download), ``synthetic`` (Gaussian
classes with size knobs, for scale runs) and ``file`` (``.npz`` or ``.pt`` with ``X`` and
``y``, optionally ``X_test`` and ``y_test``) move float32 features and an int32 label: a
record of ``4 * features + 4`` bytes. ``dataset`` takes any map-style ``Dataset`` that Hydra can
instantiate and keeps its items' dtypes (``uint8`` images move as ``uint8``): a record is
exactly the item's bytes, and ``data.transform`` turns the decoded inputs into the model's
floats on the worker (and on the master for its test split).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coded_shuffle.codec.records import ColumnDataset, as_tensor
from coded_shuffle.errors import UsageError

from .config import DataConf
from .packed import Packed

log = logging.getLogger("train")

SOURCES = ("digits", "synthetic", "file", "dataset")
LABEL_BYTES = 4  # the int32 label of the array sources

Transform = Callable[[torch.Tensor], torch.Tensor]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass(frozen=True)
class DataInfo:
    """What the launcher checks before any process starts."""

    train_points: int  # before trimming to a multiple of the workers
    features: int  # the model's inputs per point (after ``data.transform``)
    classes: int
    record_bytes: int = 0  # bytes one point moves as (0: the array sources' 4 d + 4)
    shape: tuple[int, ...] = ()  # one model input's shape (empty: ``(features,)``)

    @property
    def point_bytes(self) -> int:
        return self.record_bytes or record_bytes(self.features)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.shape or (self.features,)


EVAL_ROWS = 1 << 16  # test items the master evaluates at a time


@dataclass(frozen=True)
class DataSet:
    """The master's data: the (trimmed) training split and the held-out test split, as the
    records will carry them (inputs in the items' dtype and shape, integer labels), as
    ``(input, label)`` columns read where they are: in memory, or memory-mapped files."""

    train: ColumnDataset
    test: ColumnDataset
    classes: int
    dropped: int  # training points trimmed so that the workers divide N
    transform: Transform = field(default=_identity)  # decoded inputs -> the model's floats

    @property
    def num_points(self) -> int:
        return len(self.train)

    @property
    def features(self) -> int:
        return int(np.prod(self.input_shape))

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One model input's shape: the transform's output for one item."""
        return tuple(self.transform(self.train[0][0][None]).shape[1:])

    def test_batches(self, rows: int = EVAL_ROWS) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The test split's ``(inputs, labels)``, ``rows`` items at a time (labels int64)."""
        for a in range(0, len(self.test), rows):
            inputs, labels = self.test.take(a, a + rows)
            yield inputs, labels.long()


def record_bytes(features: int) -> int:
    """Bytes of one record of the array sources: float32 features and an int32 label."""
    return 4 * features + LABEL_BYTES


def source_of(cfg: DataConf) -> Source:
    """The configured data source, built by Hydra's ``instantiate`` from ``data._target_``
    (not recursively: the ``dataset`` source instantiates its own parts, each error in one
    line)."""
    from hydra.utils import instantiate

    if not getattr(cfg, "_target_", None):
        raise UsageError(f"data: no _target_; valid sources: {', '.join(SOURCES)}")
    return instantiate(cfg, _recursive_=False)


def transform_of(cfg: DataConf) -> Transform:
    """``data.transform`` of the configured source, as the workers apply it after decoding."""
    return source_of(cfg).input_transform()


def describe(cfg: DataConf) -> DataInfo:
    """Sizes of the configured source (synthetic: from the config, without generating)."""
    return source_of(cfg).describe()


def load(cfg: DataConf, workers: int, seed: int) -> DataSet:
    """The configured data set, split, normalised and trimmed to a multiple of ``workers``."""
    return source_of(cfg).load(workers, seed)


def arrays_data_set(source: Source, workers: int, seed: int) -> DataSet:
    """An array source's data set (in memory): float32 features and int32 labels."""
    x, y, x_test, y_test = source.raw(seed)
    classes = int(max(y.max(), -1 if y_test is None else y_test.max())) + 1
    if x_test is None:
        test, train = source.held_out(x.shape[0], seed)
        x, y, x_test, y_test = x[train], y[train], x[test], y[test]
    if source.standardise:
        x, x_test = _standardise(x, x_test)
    keep = kept(x.shape[0], workers)
    return DataSet(
        train=ColumnDataset(
            torch.from_numpy(np.ascontiguousarray(x[:keep], dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(y[:keep], dtype=np.int32)),
        ),
        test=ColumnDataset(
            torch.from_numpy(np.ascontiguousarray(x_test, dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(y_test, dtype=np.int64)),
        ),
        classes=classes,
        dropped=int(x.shape[0] - keep),
        transform=source.input_transform(),
    )


def kept(points: int, workers: int) -> int:
    """Training points kept: ``points`` trimmed to a multiple of ``workers``."""
    return points - points % workers if workers >= 1 else points


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

    def load(self, workers: int, seed: int) -> DataSet:
        """The data set, split, normalised and trimmed to a multiple of ``workers``."""
        return arrays_data_set(self, workers, seed)

    @property
    def standardise(self) -> bool:
        """Whether the features are standardised with the training split's statistics."""
        return bool(self.normalise)

    def input_transform(self) -> Transform:
        """What turns decoded inputs into the model's floats (the array sources: nothing)."""
        return _identity

    def test_count(self, n: int) -> int:
        if not 0.0 < self.test_fraction < 1.0:
            raise UsageError(f"data.test_fraction={self.test_fraction} out of range (0, 1)")
        return max(1, round(n * self.test_fraction))

    def held_out(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``(test, train)`` indices when the source brings no test split: ``test_count(n)``
        of the ``n`` points, drawn from the seed."""
        order = np.random.default_rng([seed, 7]).permutation(n)
        n_test = self.test_count(n)
        return order[:n_test], order[n_test:]

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
    (:mod:`train.packed`: memory-mapped, records of any dtype as stored, ``data.transform``
    on the decoded inputs), or an ``.npz`` / ``.pt`` file (read whole: float32 features,
    standardised unless ``data.normalise=false``)."""

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
        return _transform(self.transform)

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


def _standardise(x: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature zero mean and unit variance with the training split's statistics."""
    mean, std = column_stats(x)
    return _scaled(x, mean, std), _scaled(x_test, mean, std)


STATS_ROWS = 1 << 16  # rows read at a time for the statistics


def column_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every column's mean and standard deviation (a zero deviation as 1), in float64, read
    :data:`STATS_ROWS` rows at a time (a memory-mapped file is never loaded whole)."""
    return block_stats(lambda: (x[a : a + STATS_ROWS] for a in range(0, x.shape[0], STATS_ROWS)))


def block_stats(blocks: Callable[[], Iterator[np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`column_stats` of the rows that ``blocks()`` yields in order (called twice).

    Bit for bit ``x.mean(axis=0, dtype=float64)`` and ``x.std(...)`` of the rows stacked:
    NumPy sums along the first axis row after row, so each block's sum goes on from the
    previous one's."""
    total = _row_sum(blocks(), lambda rows: rows)
    mean = total[0] / total[1]
    std = np.sqrt(_row_sum(blocks(), lambda rows: np.square(rows - mean))[0] / total[1])
    std[std == 0] = 1.0
    return mean, std


def _row_sum(
    blocks: Iterator[np.ndarray], term: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, int]:
    """``sum_i term(row_i)`` in float64, row by row in order, and the number of rows."""
    total: np.ndarray | None = None
    count = 0
    for block in blocks:
        rows = term(np.asarray(block, dtype=np.float64))
        total = np.add.reduce(rows if total is None else np.concatenate([total[None], rows]))
        count += block.shape[0]
    assert total is not None
    return total, count


def _scaled(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """``((x - mean) / std)`` in float64, stored as float32, a block of rows at a time (the
    same values as on the whole array, without a float64 copy of it)."""
    out = np.empty(x.shape, dtype=np.float32)
    scale_in_place(out, mean, std, source=x)
    return out


def scale_in_place(
    out: np.ndarray, mean: np.ndarray, std: np.ndarray, source: np.ndarray | None = None
) -> None:
    """``out = (source - mean) / std`` (``source`` None: ``out`` itself), computed in float64
    a block of :data:`STATS_ROWS` rows at a time, stored in ``out``'s dtype."""
    x = out if source is None else source
    for a in range(0, x.shape[0], STATS_ROWS):
        out[a : a + STATS_ROWS] = (x[a : a + STATS_ROWS] - mean) / std


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

PROGRESS_SECONDS = 10.0


@dataclass(frozen=True)
class ToFloat:
    """The default ``data.transform``: ``(x * scale - mean) / std`` in float32, on a batch.

    ``scale`` null: ``1/255`` for ``uint8`` inputs (images to [0, 1]), 1 otherwise."""

    scale: float | None = None
    mean: float = 0.0
    std: float = 1.0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale if self.scale is not None else (1 / 255 if x.dtype == torch.uint8 else 1)
        return (x.to(torch.float32) * float(scale) - float(self.mean)) / float(self.std)


class DigitsImages(torch.utils.data.Dataset):
    """scikit-learn's 8x8 digits as a map-style ``Dataset`` of ``(uint8 image (1, 8, 8), int
    label)`` items, grey levels 0..16 stretched to 0..255: what a user's image set looks like
    (``data=dataset``'s default; a record is 64 + 8 bytes). ``train`` null: all 1797 images;
    true / false: a ``test_fraction`` split by ``seed`` (the training or the test part)."""

    def __init__(
        self, train: bool | None = None, test_fraction: float = 0.2, seed: int = 0
    ) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = np.rint(digits.images * (255 / 16)).astype(np.uint8)[:, None]
        order = np.random.default_rng(seed).permutation(len(images))
        n_test = round(len(images) * test_fraction)
        keep = order if train is None else order[n_test:] if train else order[:n_test]
        self.images, self.labels = torch.from_numpy(images[keep]), digits.target[keep].tolist()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], self.labels[i]


@dataclass(frozen=True, kw_only=True)
class DatasetSource(Source):
    """Any map-style ``Dataset`` that Hydra instantiates from ``data.dataset._target_`` (and
    ``data.test_dataset``, else ``test_fraction`` of the items are held out). Items are
    ``(input, label)`` or dicts of tensors (``input_key``, ``label_key``); every input has item
    0's shape and dtype, every label is a non-negative integer. Records keep the dtypes."""

    dataset: Any
    test_dataset: Any = None
    input_key: str | None = None
    label_key: str = "label"
    transform: Any = None
    normalise: bool = False  # inputs move as they are: data.transform scales them

    def input_transform(self) -> Transform:
        return _transform(self.transform)

    def items(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Every item's input and label, checked (one line naming the first bad item)."""
        x, y = self._read(instantiate_node(self.dataset, "data.dataset"), "data.dataset")
        if not self.test_dataset:
            return x, y, None, None
        x_test, y_test = self._read(
            instantiate_node(self.test_dataset, "data.test_dataset"), "data.test_dataset"
        )
        if (x_test.shape[1:], x_test.dtype) != (x.shape[1:], x.dtype):
            raise UsageError(
                f"data.test_dataset: inputs {tuple(x_test.shape[1:])} {x_test.dtype}, "
                f"data.dataset's are {tuple(x.shape[1:])} {x.dtype}: they must match"
            )
        return x, y, x_test, y_test

    def describe(self) -> DataInfo:
        x, y, x_test, y_test = self.items()
        shape = model_shape(x, self.input_transform())
        labels = y if y_test is None else torch.cat([y.long(), y_test.long()])
        train = x.shape[0] if x_test is not None else x.shape[0] - self.test_count(x.shape[0])
        return DataInfo(
            train_points=int(train),
            features=int(np.prod(shape)),
            classes=int(labels.max()) + 1,
            record_bytes=_row_bytes(x) + y.element_size(),
            shape=shape,
        )

    def load(self, workers: int, seed: int) -> DataSet:
        x, y, x_test, y_test = self.items()
        transform = self.input_transform()
        model_shape(x, transform)
        if x_test is None:
            test, train = (torch.from_numpy(i) for i in self.held_out(x.shape[0], seed))
            x, y, x_test, y_test = x[train], y[train], x[test], y[test]
        assert y_test is not None
        keep = kept(x.shape[0], workers)
        return DataSet(
            train=ColumnDataset(x[:keep].contiguous(), y[:keep].contiguous()),
            test=ColumnDataset(x_test, y_test.long()),
            classes=int(max(int(y.max()), int(y_test.max()))) + 1,
            dropped=int(x.shape[0] - keep),
            transform=transform,
        )

    def _read(self, dataset: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        """All items as two columns: inputs ``(n, *shape)`` in their dtype, labels ``(n,)``."""
        n, x0, y0 = self.first_item(dataset, what)
        columns = getattr(dataset, "tensors", None)
        if isinstance(columns, tuple | list) and len(columns) == 2:  # a TensorDataset
            xs, ys = columns[0], columns[1]
            if xs.shape[1:] != x0.shape or ys.ndim != 1:
                raise UsageError(f"{what}: columns of shapes {xs.shape}, {ys.shape}")
            _check_labels(ys, what)
            return xs.contiguous(), ys.contiguous()
        xs = torch.empty((n, *x0.shape), dtype=x0.dtype)
        ys = torch.empty(n, dtype=y0.dtype)
        self.read_items(dataset, what, np.arange(n), xs, ys)
        return xs, ys

    def first_item(self, dataset: Any, what: str) -> tuple[int, torch.Tensor, torch.Tensor]:
        """The data set's length and its item 0's input and label (one line if it has none)."""
        try:
            n = len(dataset)
        except TypeError:
            raise UsageError(
                f"{what}: a {type(dataset).__name__} has no len(): a map-style Dataset is needed"
            ) from None
        if n < 1:
            raise UsageError(f"{what} is empty: it needs at least one item per worker")
        x0, y0 = self._item(dataset[0], 0, what)
        return n, x0, y0

    def read_items(
        self,
        dataset: Any,
        what: str,
        items: np.ndarray,
        xs: torch.Tensor,
        ys: torch.Tensor,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """``xs[j], ys[j]`` = the input and label of item ``items[j]``, every one checked
        against ``xs``'s and ``ys``'s shape and dtype (one line naming the first that
        differs); ``progress(done, total)`` now and then (default: a log line every
        :data:`PROGRESS_SECONDS`)."""
        last = time.perf_counter()
        for j, i in enumerate(items.tolist()):
            x, y = self._item(dataset[i], i, what)
            if x.shape != xs.shape[1:] or x.dtype != xs.dtype:
                raise UsageError(
                    f"{what}: item {i} has input {tuple(x.shape)} {x.dtype}, item 0 "
                    f"{tuple(xs.shape[1:])} {xs.dtype}: every input needs the same shape and dtype"
                )
            if y.dtype != ys.dtype:
                raise UsageError(f"{what}: item {i} has a {y.dtype} label, item 0 a {ys.dtype} one")
            xs[j], ys[j] = x, y
            if time.perf_counter() - last > (1.0 if progress else PROGRESS_SECONDS):
                last = time.perf_counter()
                if progress is not None:
                    progress(j + 1, items.size)
                else:
                    log.info(f"  ... {what}: read {j + 1:,} of {items.size:,} items")
        if progress is not None:
            progress(items.size, items.size)

    def _item(self, item: Any, i: int, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        """An item's input tensor and its label as a 0-d integer tensor."""
        if isinstance(item, dict):
            if self.label_key not in item:
                raise UsageError(
                    f"{what}: item {i} has keys {sorted(item)}, no label key "
                    f"{self.label_key!r} (set data.label_key)"
                )
            inputs = [k for k in item if k != self.label_key]
            key = self.input_key
            if key is None:
                if len(inputs) != 1:
                    raise UsageError(
                        f"{what}: item {i} has input keys {sorted(inputs)}: "
                        "set data.input_key to one of them"
                    )
                key = inputs[0]
            if key not in item:
                raise UsageError(f"{what}: item {i} has keys {sorted(item)}, no {key!r}")
            x, label = item[key], item[self.label_key]
        elif isinstance(item, tuple | list) and len(item) == 2:
            x, label = item
        else:
            kind = f"a {len(item)}-tuple" if isinstance(item, tuple | list) else type(item).__name__
            raise UsageError(
                f"{what}: item {i} is {kind}: items must be (input, label) or dicts of tensors"
            )
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(x)
        if not isinstance(x, torch.Tensor):
            raise UsageError(
                f"{what}: item {i}'s input is a {type(x).__name__}, not a tensor (a "
                "torchvision set needs transform=torchvision.transforms.PILToTensor)"
            )
        return x, _label(label, i, what)


def model_shape(x: torch.Tensor, transform: Transform) -> tuple[int, ...]:
    """``transform``'s output shape for one item; :class:`UsageError` unless it gives
    floating-point tensors."""
    try:
        out = transform(x[:1].clone())
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"data.transform failed on item 0: {_first_line(exc)}") from None
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        got = out.dtype if isinstance(out, torch.Tensor) else type(out).__name__
        raise UsageError(
            f"data.transform must return a floating-point tensor for the model, got {got} "
            "(the default train.data.ToFloat converts)"
        )
    if out.ndim < 2 or out.shape[0] != 1:
        raise UsageError(
            f"data.transform maps a batch (n, ...) to (n, ...); for 1 item it gave "
            f"shape {tuple(out.shape)}"
        )
    return tuple(int(s) for s in out.shape[1:])


def _transform(node: Any) -> Transform:
    """``data.transform`` instantiated (null: the inputs as they are)."""
    if not node:
        return _identity
    fn = instantiate_node(node, "data.transform")
    if not callable(fn):
        raise UsageError(f"data.transform: {type(fn).__name__} is not callable")
    return fn


def _label(value: Any, i: int, what: str) -> torch.Tensor:
    """A label as a 0-d tensor of its own integer dtype (Python ints: int64)."""
    if isinstance(value, np.generic | np.ndarray):
        value = torch.from_numpy(np.asarray(value))
    if isinstance(value, torch.Tensor):
        if (
            value.numel() != 1
            or value.is_floating_point()
            or value.is_complex()
            or (value.dtype == torch.bool)
        ):
            raise UsageError(
                f"{what}: item {i}'s label is a {value.dtype} tensor of shape "
                f"{tuple(value.shape)}: labels must be single integers"
            )
        value = value.reshape(())
    elif isinstance(value, int) and not isinstance(value, bool):
        value = torch.tensor(value, dtype=torch.int64)
    else:
        raise UsageError(
            f"{what}: item {i}'s label {value!r} ({type(value).__name__}) is not an integer "
            "class label"
        )
    if int(value) < 0:
        raise UsageError(f"{what}: item {i}'s label {int(value)} is negative (labels are >= 0)")
    return value


def _check_labels(labels: torch.Tensor, what: str) -> None:
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise UsageError(f"{what}: labels are {labels.dtype}: they must be integers")
    if labels.numel() and int(labels.min()) < 0:
        i = int(labels.argmin())
        raise UsageError(f"{what}: item {i}'s label {int(labels[i])} is negative (labels >= 0)")


def _row_bytes(x: torch.Tensor) -> int:
    return int(np.prod(x.shape[1:], dtype=np.int64)) * x.element_size()


def instantiate_node(node: Any, key: str) -> Any:
    """``node`` (a config with ``_target_``) instantiated; one line for a missing or
    unimportable target and for a constructor that fails."""
    from hydra.utils import get_object, instantiate
    from omegaconf import DictConfig

    if not isinstance(node, DictConfig | dict) or "_target_" not in node:
        raise UsageError(f"{key} needs a _target_ (e.g. {key}._target_=pkg.module.Class)")
    target = str(node["_target_"])
    hydra_log = logging.getLogger("hydra.utils")  # it logs the failure in lines of its own
    level, hydra_log.level = hydra_log.level, logging.CRITICAL
    try:
        get_object(target)
    except Exception:
        raise UsageError(
            f"{key}._target_={target!r} cannot be imported (no such module or attribute)"
        ) from None
    finally:
        hydra_log.setLevel(level)
    try:
        return instantiate(node)
    except Exception as exc:
        cause = exc.__cause__ or exc
        if isinstance(cause, UsageError):
            raise cause from None
        raise UsageError(f"{key}: {target}(...) failed: {_first_line(cause)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
