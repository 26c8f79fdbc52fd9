"""Data sets on disk: a directory of NumPy ``.npy`` files, memory-mapped (``coded-shuffle
pack`` writes one from any source the training job takes; the job reads one with ``data=file
data.path=DIR``, an own loop with :class:`PackedDataset`).

``DIR/X.npy`` holds ``N`` records of any fixed shape and dtype, ``DIR/y.npy`` their ``N``
integer labels; ``X_test.npy`` and ``y_test.npy`` are optional. The master maps them
(``mmap_mode="r"``) and reads rows as it sends them: the page cache keeps what fits, the
process's own memory does not grow with ``N`` (docs/training.md, "Data sets on disk").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coded_shuffle.codec.records import ColumnDataset, as_tensor
from coded_shuffle.errors import UsageError

NAMES = ("X", "y", "X_test", "y_test")
LABEL_ROWS = 1 << 20  # labels checked a block at a time


@dataclass(frozen=True)
class Packed:
    """The arrays of a packed directory, memory-mapped (``x_test``/``y_test`` None when the
    directory holds none)."""

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray | None

    @classmethod
    def open(cls, path: Path) -> Packed:
        """Maps ``path``'s arrays, checked: one line naming the file and what is wrong."""
        found = {name: path / f"{name}.npy" for name in NAMES if (path / f"{name}.npy").is_file()}
        for name in ("X", "y"):
            if name not in found:
                raise UsageError(
                    f"{str(path)!r}: no {name}.npy (a packed data set holds X.npy and "
                    "y.npy, optionally X_test.npy and y_test.npy: coded-shuffle pack writes one)"
                )
        if ("X_test" in found) != ("y_test" in found):
            raise UsageError(f"{str(path)!r}: X_test.npy and y_test.npy go together")
        arrays = {name: _map(file) for name, file in found.items()}
        x, y = arrays["X"], arrays["y"]
        _check_pair(x, y, found["X"], found["y"])
        x_test, y_test = arrays.get("X_test"), arrays.get("y_test")
        if x_test is not None and y_test is not None:
            _check_pair(x_test, y_test, found["X_test"], found["y_test"])
            if (x_test.shape[1:], x_test.dtype) != (x.shape[1:], x.dtype):
                raise UsageError(
                    f"{found['X_test']}: records {x_test.shape[1:]} {x_test.dtype}, X.npy has "
                    f"{x.shape[1:]} {x.dtype}: they must match"
                )
        return cls(x, y, x_test, y_test)

    @property
    def classes(self) -> int:
        top = _label_max(self.y)
        return max(top, -1 if self.y_test is None else _label_max(self.y_test)) + 1


def _map(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable .npy array ({exc})") from None


def _check_pair(x: np.ndarray, y: np.ndarray, x_path: Path, y_path: Path) -> None:
    if x.ndim < 1 or x.shape[0] < 1:
        raise UsageError(f"{x_path}: no records (shape {x.shape})")
    if x.dtype.hasobject or not x.dtype.isnative:
        raise UsageError(f"{x_path}: dtype {x.dtype} cannot be moved as bytes (a native one)")
    if y.ndim != 1 or y.shape[0] != x.shape[0] or not np.issubdtype(y.dtype, np.integer):
        raise UsageError(
            f"{y_path}: needs {x.shape[0]} integer labels (one per record of {x_path.name}), "
            f"got {y.dtype} of shape {y.shape}"
        )
    for a in range(0, y.shape[0], LABEL_ROWS):
        low = int(y[a : a + LABEL_ROWS].min())
        if low < 0:
            raise UsageError(f"{y_path}: label {low} out of range (labels must be >= 0)")


def _label_max(y: np.ndarray) -> int:
    return max(int(y[a : a + LABEL_ROWS].max()) for a in range(0, y.shape[0], LABEL_ROWS))


class PackedDataset(ColumnDataset):
    """A packed directory as a map-style data set: item ``i`` is ``(X[i], y[i])``, tensors of
    the records' own shape and dtype and the label's, read from the memory-mapped ``.npy``
    files (never loaded whole: the master of an own loop passes it to ``CodedShuffle``, which
    reads its records where they lie). ``split="test"``: ``X_test`` and ``y_test``.

    Attributes: ``path``, ``split``, ``classes`` (the largest label of both splits, plus 1).
    """

    def __init__(self, path: str | os.PathLike[str], split: str = "train") -> None:
        if split not in ("train", "test"):
            raise UsageError(f"split={split!r} unknown; valid: train, test")
        self.path, self.split = Path(path), split
        if not self.path.is_dir():
            raise UsageError(f"{str(self.path)!r} is no directory (coded-shuffle pack writes one)")
        packed = Packed.open(self.path)
        x, y = (packed.x, packed.y) if split == "train" else (packed.x_test, packed.y_test)
        if x is None or y is None:
            raise UsageError(f"{str(self.path)!r}: no X_test.npy and y_test.npy (split='test')")
        self.classes = packed.classes
        super().__init__(as_tensor(x), as_tensor(y), mapped=True)
