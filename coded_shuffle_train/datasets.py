"""``data=dataset``: any map-style ``Dataset`` that Hydra can instantiate, its items' dtypes
kept (``uint8`` images move as ``uint8``: a record is exactly the item's bytes), and the
default ``data.transform`` (:class:`ToFloat`) that turns decoded inputs into the model's
floats on the worker (and on the master for its test split)."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coded_shuffle.codec.records import ColumnDataset
from coded_shuffle.errors import UsageError

from .data import DataInfo, DataSet, Source, Transform, identity, kept

log = logging.getLogger("train")

PROGRESS_SECONDS = 10.0


@dataclass(frozen=True)
class ToFloat:
    """The default ``data.transform``: ``(x * scale - mean) / std`` in float32, on a batch.

    ``scale`` null: ``1/255`` for ``uint8`` inputs (images to [0, 1]), 1 otherwise."""

    scale: float | None = None
    mean: float = 0.0
    std: float = 1.0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """One float32 copy at most, changed in place (the same bits as ``(x * scale - mean)
        / std``); float32 inputs with nothing to change come back as they are."""
        scale = self.scale if self.scale is not None else (1 / 255 if x.dtype == torch.uint8 else 1)
        scale, mean, std = float(scale), float(self.mean), float(self.std)
        if (scale, mean, std) == (1.0, 0.0, 1.0):
            return x.to(torch.float32)
        out = x.to(torch.float32, copy=True)
        if scale != 1.0:
            out.mul_(scale)
        if mean != 0.0:
            out.sub_(mean)
        if std != 1.0:
            out.div_(std)
        return out


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits: ``(1797, 64)`` float64 grey levels 0..16 and int64
    labels, read from its ``digits.csv.gz`` as ``sklearn.datasets.load_digits`` reads it, the
    same values, without importing scikit-learn (about a second of every job's start-up);
    through ``load_digits`` if the file is not where that version keeps it."""
    spec = importlib.util.find_spec("sklearn")  # finds the package, does not run it
    roots = spec.submodule_search_locations if spec is not None else None
    path = Path(roots[0]) / "datasets" / "data" / "digits.csv.gz" if roots else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits as load

        digits = load()
        return digits.data, digits.target
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)


class DigitsImages(torch.utils.data.Dataset):
    """scikit-learn's 8x8 digits as a map-style ``Dataset`` of ``(uint8 image (1, 8, 8), int
    label)`` items, grey levels 0..16 stretched to 0..255: what a user's image set looks like
    (``data=dataset``'s default; a record is 64 + 8 bytes). ``train`` null: all 1797 images;
    true / false: a ``test_fraction`` split by ``seed`` (the training or the test part)."""

    def __init__(
        self, train: bool | None = None, test_fraction: float = 0.2, seed: int = 0
    ) -> None:
        pixels, target = load_digits()
        images = np.rint(pixels.reshape(-1, 8, 8) * (255 / 16)).astype(np.uint8)[:, None]
        order = np.random.default_rng(seed).permutation(len(images))
        n_test = round(len(images) * test_fraction)
        keep = order if train is None else order[n_test:] if train else order[:n_test]
        self.images, self.labels = torch.from_numpy(images[keep]), target[keep].tolist()

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
    item_transform: Any = None
    transform: Any = None
    normalise: bool = False  # inputs move as they are: data.transform scales them

    @functools.cached_property
    def converter(self) -> Callable[[Any], Any] | None:
        """``data.item_transform`` instantiated (None: none)."""
        if not self.item_transform:
            return None
        return transform_from(self.item_transform, "data.item_transform")

    def input_transform(self) -> Transform:
        return transform_from(self.transform)

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
                    f"{tuple(xs.shape[1:])} {xs.dtype}: every input needs the same shape and "
                    "dtype (images of any size: data.item_transform="
                    "{_target_:coded_shuffle_train.datasets.ResizeCrop,size:S})"
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
        return self._input(x, i, what), _label(label, i, what)

    def _input(self, x: Any, i: int, what: str) -> torch.Tensor:
        """An item's input as a tensor: ``data.item_transform`` first, where set; a PIL
        image as its ``uint8 (C, H, W)`` pixels, a NumPy array or a number as a tensor."""
        if self.converter is not None:
            try:
                x = self.converter(x)
            except Exception as exc:
                raise UsageError(
                    f"{what}: item {i}: data.item_transform failed: {_first_line(exc)}"
                ) from None
        x = as_array(x)
        if isinstance(x, np.ndarray):
            if x.dtype.hasobject:
                raise UsageError(f"{what}: item {i}'s input is an array of Python objects")
            x = torch.from_numpy(np.ascontiguousarray(x))
        if not isinstance(x, torch.Tensor):
            raise UsageError(
                f"{what}: item {i}'s input is a {type(x).__name__}: inputs must be tensors, "
                "NumPy arrays, numbers or PIL images (or set data.item_transform to make one)"
            )
        return x


def as_array(x: Any) -> Any:
    """A PIL image as its ``uint8 (C, H, W)`` pixels (``(1, H, W)`` for grey levels), a Python
    number as a 0-d array; anything else as it is."""
    if type(x).__module__.startswith("PIL."):
        pixels = np.asarray(x)
        return pixels[None] if pixels.ndim == 2 else np.moveaxis(pixels, -1, 0)
    if isinstance(x, int | float):
        return np.asarray(x)
    return x


@dataclass(frozen=True)
class ResizeCrop:
    """``data.item_transform`` for images of any size (a PIL image): the shorter side resized
    to ``size`` (bilinear), then the centre ``size x size`` cropped, as ``uint8 (C, H, W)``
    pixels in ``mode`` (``RGB``, ``L``: grey)."""

    size: int
    mode: str = "RGB"

    def __post_init__(self) -> None:
        if int(self.size) < 1:
            raise UsageError(f"ResizeCrop size={self.size} out of range (pixels >= 1)")

    def __call__(self, image: Any) -> np.ndarray:
        from PIL import Image

        if not isinstance(image, Image.Image):
            raise UsageError(f"ResizeCrop takes PIL images, not a {type(image).__name__}")
        image = image.convert(self.mode)
        w, h = image.size
        scale = self.size / min(w, h)
        w, h = max(self.size, round(w * scale)), max(self.size, round(h * scale))
        image = image.resize((w, h), Image.Resampling.BILINEAR)
        left, top = (w - self.size) // 2, (h - self.size) // 2
        return as_array(image.crop((left, top, left + self.size, top + self.size)))


class ImageFolder(torch.utils.data.Dataset):
    """A folder of images as torchvision's ``ImageFolder`` reads one (without torchvision):
    one subfolder per class (in sorted order: class ``c`` is the ``c``-th), items
    ``(PIL image, class index)``; ``transform`` on the image where given. Images of any size:
    pack them with ``data.item_transform`` (:class:`ResizeCrop`)."""

    SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")

    def __init__(self, root: str, transform: Callable[[Any], Any] | None = None) -> None:
        base = Path(root)
        if not base.is_dir():
            raise UsageError(f"ImageFolder root={root!r} is no directory")
        self.classes = sorted(d.name for d in base.iterdir() if d.is_dir())
        self.samples = [
            (path, c)
            for c, name in enumerate(self.classes)
            for path in sorted((base / name).rglob("*"))
            if path.suffix.lower() in self.SUFFIXES
        ]
        if not self.samples:
            raise UsageError(f"ImageFolder root={root!r}: no images in class subfolders")
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as f:
            image = f.convert("RGB")
        return (self.transform(image) if self.transform else image), label


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
            "(the default coded_shuffle_train.datasets.ToFloat converts)"
        )
    if out.ndim < 2 or out.shape[0] != 1:
        raise UsageError(
            f"data.transform maps a batch (n, ...) to (n, ...); for 1 item it gave "
            f"shape {tuple(out.shape)}"
        )
    return tuple(int(s) for s in out.shape[1:])


def transform_from(node: Any, key: str = "data.transform") -> Transform:
    """``data.transform`` (or the callable at ``key``) instantiated (null: the inputs as they
    are)."""
    if not node:
        return identity
    fn = instantiate_node(node, key)
    if not callable(fn):
        raise UsageError(f"{key}: {type(fn).__name__} is not callable")
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
