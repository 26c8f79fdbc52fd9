"""The training jobs' data (docs/model.md, docs/training.md "Your own data set"): what the master
holds (:class:`DataSet`), what the launcher checks (:class:`DataInfo`), and the sources behind
``data=`` (:class:`Source`; :mod:`coded_shuffle_train.sources` and
:mod:`coded_shuffle_train.datasets`), built by Hydra's ``instantiate`` from ``data._target_``.

The job hands the training split to :class:`~coded_shuffle.CodedShuffle` as input and integer-label
columns, read where they are (memory, or memory-mapped ``.npy`` files of a packed directory:
:mod:`coded_shuffle.codec.packed`). ``N`` is trimmed to a multiple of the number of workers (the run
logs the drop)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from coded_shuffle.codec.records import ColumnDataset
from coded_shuffle.errors import UsageError

from .config import DataConf
from .standardise import standardise

log = logging.getLogger("train")

SOURCES = ("digits", "synthetic", "file", "dataset")

LABEL_BYTES = 4  # the int32 label of the array sources

Transform = Callable[[torch.Tensor], torch.Tensor]


def identity(x: torch.Tensor) -> torch.Tensor:
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


EVAL_BYTES = 4 << 20  # the model's float inputs the master evaluates at a time (so what the
# evaluation holds does not grow with the test split, a tenth of N where the source has none)


@dataclass(frozen=True)
class DataSet:
    """The master's data: the (trimmed) training split and the held-out test split, as the
    records will carry them (inputs in the items' dtype and shape, integer labels), as
    ``(input, label)`` columns read where they are: in memory, or memory-mapped files."""

    train: ColumnDataset
    test: ColumnDataset
    classes: int
    dropped: int  # training points trimmed so that the workers divide N
    transform: Transform = field(default=identity)  # decoded inputs -> the model's floats

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

    def test_batches(self, rows: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The test split's ``(inputs, labels)``, ``rows`` items at a time (labels int64; by
        default :data:`EVAL_BYTES` of the model's float32 inputs)."""
        rows = rows or max(1, EVAL_BYTES // (4 * self.features))
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
        x, x_test = standardise(x, x_test)
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
    the schema (:mod:`coded_shuffle_train.config`) and ``coded_shuffle_train/conf/data``, not here.
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
        return identity

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
