"""Data set items as fixed-size byte records, and back (README: "Your own training loop").

A coded delivery moves rows of bytes. An item of a map-style data set (a tensor, or a tuple of
tensors, of fixed shapes and dtypes) becomes one record: its fields' bytes, in field order, in
the host's byte order (every rank of a job runs on the same architecture). Decoding the records
gives the fields back with the same shapes and dtypes, byte-identical.

The master's :class:`Records` read the fields where they are: a data set that exposes its
columns (a ``TensorDataset``, a :class:`ColumnDataset` of memory-mapped ``.npy`` files) is
never copied whole; its rows are gathered message by message as they are sent.
"""

from __future__ import annotations

import hashlib
import json
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from coded_shuffle.codec.buffers import empty_rows
from coded_shuffle.errors import UsageError


@dataclass(frozen=True)
class Field:
    """One tensor of an item: its shape and dtype (``"float32"``)."""

    shape: tuple[int, ...]
    dtype: str

    @cached_property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @cached_property
    def num_bytes(self) -> int:
        itemsize = torch.empty((), dtype=self.torch_dtype).element_size()
        return int(np.prod(self.shape, dtype=np.int64)) * itemsize

    @classmethod
    def of(cls, t: torch.Tensor) -> Field:
        return cls(tuple(int(s) for s in t.shape), str(t.dtype).removeprefix("torch."))


@dataclass(frozen=True)
class RecordLayout:
    """The fields of every item; ``single`` when items are bare tensors, not tuples."""

    fields: tuple[Field, ...]
    single: bool

    @cached_property
    def record_bytes(self) -> int:
        return sum(f.num_bytes for f in self.fields)

    @classmethod
    def of(cls, dataset: Any) -> RecordLayout:
        """The layout of ``dataset``'s first item (every item must share it)."""
        if len(dataset) < 1:
            raise UsageError("the dataset is empty: it needs at least one item per worker")
        first = dataset[0]
        single = isinstance(first, torch.Tensor)
        return cls(tuple(Field.of(t) for t in _fields(first, 0)), single)

    def to_json(self) -> str:
        return json.dumps(
            {"single": self.single, "fields": [[list(f.shape), f.dtype] for f in self.fields]}
        )

    @classmethod
    def from_json(cls, text: str) -> RecordLayout:
        raw = json.loads(text)
        return cls(tuple(Field(tuple(s), d) for s, d in raw["fields"]), bool(raw["single"]))

    def pack(self, dataset: Any, num_items: int) -> Records:
        """The first ``num_items`` items as :class:`Records` of ``record_bytes`` each.

        A data set that exposes its columns (``TensorDataset.tensors``, a
        :class:`ColumnDataset`) is read column by column where it is: small columns are
        joined into one array, large ones (or a column set through an ``index``) are kept
        apart and gathered when read. Any other data set is read item by item, each checked
        against the layout, into one array.
        """
        columns = getattr(dataset, "tensors", None)
        if isinstance(columns, Sequence) and len(columns) == len(self.fields):
            index = getattr(dataset, "index", None)
            tensors = [c if index is not None else c[:num_items] for c in columns]
            for i, (t, f) in enumerate(zip(tensors, self.fields, strict=True)):
                if Field.of(t[0]) != f:
                    raise UsageError(f"field {i} of the dataset's items changes its shape or dtype")
            parts = [_as_bytes(t, t.shape[0]) for t in tensors]
            picked = None if index is None else np.asarray(index[:num_items], dtype=np.int64)
            mapped = getattr(dataset, "mapped", False)
            if picked is None and not mapped and num_items * self.record_bytes <= JOIN_MAX_BYTES:
                return Records([_joined(parts)])
            return Records([p.numpy() for p in parts], picked)
        parts = [_as_bytes(t, num_items) for t in self._stack(dataset, num_items)]
        return Records([_joined(parts)])

    def _stack(self, dataset: Any, num_items: int) -> list[torch.Tensor]:
        out = [torch.empty((num_items, *f.shape), dtype=f.torch_dtype) for f in self.fields]
        for i in range(num_items):
            fields = _fields(dataset[i], i)
            if len(fields) != len(self.fields):
                raise UsageError(
                    f"item {i} has {len(fields)} fields, item 0 has {len(self.fields)}: every "
                    "item needs the same structure"
                )
            for j, (t, f) in enumerate(zip(fields, self.fields, strict=True)):
                got = Field.of(t)
                if got != f:
                    raise UsageError(
                        f"item {i}, field {j}: shape {got.shape} {got.dtype}, item 0 has "
                        f"{f.shape} {f.dtype}: records need fixed shapes and dtypes"
                    )
                out[j][i] = t
        return out

    def unpack(
        self, rows: torch.Tensor, items: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        """The fields of ``(n, record_bytes)`` records (of the rows ``items`` only, in that
        order, when given), each ``(n, *shape)``, byte-identical: one copy per field."""
        n = rows.shape[0] if items is None else int(items.numel())
        offset, out = 0, []
        for f in self.fields:
            # a fresh copy: aligned for the wider dtype (a slice of one row is "contiguous"
            # at any offset, and a view of it could not be reinterpreted)
            column = rows[:, offset : offset + f.num_bytes]
            offset += f.num_bytes
            if f.num_bytes == 0:
                out.append(torch.empty((n, *f.shape), dtype=f.torch_dtype))
                continue
            if items is None:
                raw = column.clone(memory_format=torch.contiguous_format)
            else:
                raw = column.index_select(0, items)
            out.append(raw.view(f.torch_dtype).reshape(n, *f.shape))
        return tuple(out)


JOIN_MAX_BYTES = 256 << 20  # columns up to this are joined into one array (the fastest codec)
DIGEST_ROWS_BYTES = 4 << 20  # rows hashed (and gathered) at a time


def _joined(parts: list[torch.Tensor]) -> np.ndarray:
    """A copy of the columns' bytes side by side, as one ``(n, B)`` array, on huge pages when
    large (:func:`empty_rows`): the encoder reads its rows in random order, and with 4 KiB
    pages every such read also walks the page table (docs/codec.md: the random pattern at
    N = 10^6 reads 1.2-1.5x faster from huge pages)."""
    out = empty_rows(parts[0].shape[0], sum(int(p.shape[1]) for p in parts))
    if len(parts) > 1:
        torch.cat(parts, dim=1, out=out)
    else:
        out.copy_(parts[0])
    return out.numpy()


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """``array`` as a tensor on the same memory (a read-only mapping too: nothing writes it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


class Records:
    """The master's ``N`` records of ``B`` bytes, read where they are.

    ``columns``: ``(M, b_i)`` uint8 arrays side by side (a record is row ``r`` of each, in
    order), e.g. memory-mapped ``.npy`` files viewed as bytes; ``index``: the rows ``r`` of the
    ``N`` records (None: rows ``0 .. N - 1``). Rows are read on demand (:meth:`rows`,
    :meth:`gather`, :meth:`pick`), a message at a time, so that the master never holds the
    data set (or an epoch of it) in its own memory.
    """

    def __init__(self, columns: Sequence[np.ndarray], index: np.ndarray | None = None) -> None:
        self.columns = [np.asarray(c) for c in columns]
        self.index = index
        self.widths = [int(c.shape[1]) for c in self.columns]
        n = int(self.columns[0].shape[0]) if index is None else int(index.size)
        self.shape = (n, sum(self.widths))
        self._local = threading.local()  # per thread: the columns' gather buffers

    @property
    def array(self) -> torch.Tensor | None:
        """The ``(N, B)`` rows as one tensor on their memory, when they are one array (the
        codec's kernel reads them where they are); None otherwise."""
        if len(self.columns) != 1 or self.index is not None:
            return None
        return as_tensor(self.columns[0])

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1]

    def gather(self, points: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``(n, B)`` rows of ``points`` (any order): fresh, or in ``out[:n]`` (a buffer the
        caller reuses, so that no read takes fresh pages: the job maps every array of 256 KiB
        and more on its own, ``coded_shuffle_train/dist.py``)."""
        rows = np.asarray(points, dtype=np.int64)
        if self.index is not None:
            rows = self.index[rows]
        if out is None:
            if len(self.columns) == 1:
                return self.columns[0][rows]
            out = np.empty((rows.size, self.shape[1]), dtype=np.uint8)
        return self._gather_into(rows, out[: rows.size])

    def _gather_into(self, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The records of column rows ``rows`` into ``out``, column by column through one
        reused contiguous scratch per column (``np.take`` into a strided array would buffer)."""
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= self.columns[0].shape[0]):
            raise IndexError(f"rows out of range 0..{self.columns[0].shape[0] - 1}")
        if len(self.columns) == 1:
            return np.take(self.columns[0], rows, axis=0, out=out, mode="clip")
        at = 0
        for column, width in zip(self.columns, self.widths, strict=True):
            scratch = self._scratch(width, rows.size)
            np.take(column, rows, axis=0, out=scratch, mode="clip")
            out[:, at : at + width] = scratch
            at += width
        return out

    def _scratch(self, width: int, rows: int) -> np.ndarray:
        """A reused ``(rows, width)`` buffer for one column's gather (grown, never shrunk), one
        per thread (the master hashes in one thread while it sends from another)."""
        pool = self._local.__dict__.setdefault("buffers", {})
        have = pool.get(width)
        if have is None or have.shape[0] < rows:
            have = pool[width] = np.empty((rows, width), dtype=np.uint8)
        return have[:rows]

    def rows(self, first: int, count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Records ``first .. first + count`` (a :class:`RowSource` of the framing)."""
        points = np.arange(first, first + count, dtype=np.int64)
        if out is None:
            return torch.from_numpy(self.gather(points))
        self.gather(points, out.numpy())
        return out

    def pick(self, points: np.ndarray) -> PickedRecords:
        """The records ``points``, in that order, read as they are sent."""
        return PickedRecords(self, np.asarray(points, dtype=np.int64))

    def digest(self, points: np.ndarray) -> bytes:
        """SHA-256 of the records ``points`` in that order (a worker's batch), read a bounded
        run at a time into one reused buffer."""
        h = hashlib.sha256()
        step = max(1, DIGEST_ROWS_BYTES // max(self.shape[1], 1))
        array = self.array
        buffer = np.empty((min(step, points.size), self.shape[1]), dtype=np.uint8)
        for a in range(0, points.size, step):
            run = points[a : a + step]
            if array is not None:
                got = torch.from_numpy(buffer[: run.size])
                h.update(torch.index_select(array, 0, torch.from_numpy(run), out=got).numpy())
            else:
                h.update(self.gather(run, buffer))
        return h.digest()


class PickedRecords:
    """Records ``points`` of :class:`Records`, in that order, as a row source."""

    def __init__(self, records: Records, points: np.ndarray) -> None:
        self.records, self.points = records, points
        self.shape = (int(points.size), records.shape[1])

    def rows(self, first: int, count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        points = self.points[first : first + count]
        if out is None:
            return torch.from_numpy(self.records.gather(points))
        self.records.gather(points, out.numpy())
        return out

    def pick(self, ids: np.ndarray) -> PickedRecords:
        return PickedRecords(self.records, self.points[ids])


class ColumnDataset(torch.utils.data.Dataset):
    """Items ``(column[index[i]] for column in columns)``: fields stored as whole columns,
    through ``index`` (None: every row in order). ``mapped``: the columns are memory-mapped
    files, which :class:`Records` read where they are, never copied into memory (nor joined,
    however small)."""

    def __init__(
        self, *columns: torch.Tensor, index: np.ndarray | None = None, mapped: bool = False
    ) -> None:
        self.tensors, self.index, self.mapped = columns, index, mapped

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0] if self.index is None else self.index.size)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        row = int(i if self.index is None else self.index[i])
        return tuple(c[row] for c in self.tensors)

    def take(self, first: int, stop: int) -> tuple[torch.Tensor, ...]:
        """Items ``first .. stop - 1`` as columns (views where the rows are one run)."""
        if self.index is None:
            return tuple(c[first:stop] for c in self.tensors)
        rows = torch.from_numpy(np.asarray(self.index[first:stop], dtype=np.int64))
        return tuple(c.index_select(0, rows) for c in self.tensors)


def check_labels(layout: RecordLayout) -> None:
    """:class:`UsageError` unless the items' last field is an integer scalar (a class label:
    what ``placement="by_label"`` sorts by)."""
    last = layout.fields[-1]
    integer = not last.torch_dtype.is_floating_point and not last.torch_dtype.is_complex
    if layout.single or last.shape != () or not integer or last.dtype == "bool":
        raise UsageError(
            f"placement='by_label' needs items whose last field is an integer label; this data "
            f"set's last field is {last.dtype} of shape {last.shape}"
            + (" (items are bare tensors)" if layout.single else "")
        )


def item_labels(dataset: Any, num_items: int) -> np.ndarray:
    """The first ``num_items`` items' labels (their last field) as int64."""
    columns = getattr(dataset, "tensors", None)
    if isinstance(columns, Sequence) and columns:
        index = getattr(dataset, "index", None)
        rows = slice(num_items) if index is None else np.asarray(index[:num_items])
        return np.asarray(columns[-1].numpy()[rows], dtype=np.int64)
    return np.array([int(dataset[i][-1]) for i in range(num_items)], dtype=np.int64)


def _fields(item: Any, index: int) -> tuple[torch.Tensor, ...]:
    """An item's tensors; :class:`UsageError` naming the item and field otherwise."""
    fields = (item,) if isinstance(item, torch.Tensor) else item
    if not isinstance(fields, tuple | list):
        raise UsageError(
            f"item {index} is a {type(item).__name__}: items must be tensors or tuples of tensors"
        )
    for j, t in enumerate(fields):
        if not isinstance(t, torch.Tensor):
            raise UsageError(
                f"item {index}, field {j} is a {type(t).__name__}: fields must be tensors "
                "(wrap numbers with torch.tensor)"
            )
    return tuple(fields)


def _as_bytes(t: torch.Tensor, n: int) -> torch.Tensor:
    """``(n, ...)`` tensor -> ``(n, bytes per row)`` uint8 (CPU, contiguous, same bytes)."""
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return torch.empty((n, 0), dtype=torch.uint8)
    return t.reshape(n, -1).view(torch.uint8).reshape(n, -1)


class LocalBatch(torch.utils.data.Dataset):
    """A worker's batch of one epoch: items with the data set's structure, shapes and dtypes.

    ``rows`` holds the records (``(n, record_bytes)`` uint8, where the worker decoded them: in
    memory, or its store's memory-mapped file); items and minibatches (:meth:`fields`) are
    unpacked from them on demand. ``tensors`` holds the fields as whole columns
    (``(n, *shape)``, unpacked once on first use) for vectorised use; ``indices`` the data set
    indices of the items, in order.
    """

    def __init__(self, rows: torch.Tensor, layout: RecordLayout, indices: np.ndarray) -> None:
        self.rows, self.layout, self.indices = rows, layout, indices
        self.single = layout.single
        self._tensors: tuple[torch.Tensor, ...] | None = None

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        if self._tensors is None:
            self._tensors = self.layout.unpack(self.rows)
        return self._tensors

    def fields(self, items: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, ...]:
        """The fields of the items ``items`` (positions in this batch), each ``(n, *shape)``:
        a minibatch read from the records without unpacking the rest."""
        picked = torch.as_tensor(np.asarray(items), dtype=torch.int64)
        return self.layout.unpack(self.rows, picked)

    def __len__(self) -> int:
        return int(self.indices.size)

    def __getitem__(self, i: int) -> Any:
        fields = tuple(f[0] for f in self.fields(np.array([i])))
        return fields[0] if self.single else fields
