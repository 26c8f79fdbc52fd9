"""Data set items as fixed-size byte records, and back (README: "Your own training loop").

A coded delivery moves rows of bytes. An item of a map-style data set (a tensor, or a tuple of
tensors, of fixed shapes and dtypes) becomes one record: its fields' bytes, in field order, in
the host's byte order (every rank of a job runs on the same architecture). Decoding the records
gives the fields back with the same shapes and dtypes, byte-identical.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from coded_shuffle.errors import UsageError


@dataclass(frozen=True)
class Field:
    """One tensor of an item: its shape and dtype (``"float32"``)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
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

    @property
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

    def pack(self, dataset: Any, num_items: int) -> torch.Tensor:
        """The first ``num_items`` items as an ``(num_items, record_bytes)`` uint8 tensor.

        A data set that exposes its columns (``TensorDataset.tensors``) is packed column by
        column; any other is read item by item, each checked against the layout.
        """
        columns = getattr(dataset, "tensors", None)
        if isinstance(columns, Sequence) and len(columns) == len(self.fields):
            tensors = [c[:num_items] for c in columns]
            for i, (t, f) in enumerate(zip(tensors, self.fields, strict=True)):
                if Field.of(t[0]) != f:
                    raise UsageError(f"field {i} of the dataset's items changes its shape or dtype")
        else:
            tensors = self._stack(dataset, num_items)
        parts = [_as_bytes(t, num_items) for t in tensors]
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0].clone()

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

    def unpack(self, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The fields of ``(n, record_bytes)`` records, each ``(n, *shape)``, byte-identical."""
        n, offset, out = rows.shape[0], 0, []
        for f in self.fields:
            # a fresh copy: aligned for the wider dtype (a slice of one row is "contiguous"
            # at any offset, and a view of it could not be reinterpreted)
            raw = rows[:, offset : offset + f.num_bytes].clone(
                memory_format=torch.contiguous_format
            )
            offset += f.num_bytes
            if f.num_bytes == 0:
                out.append(torch.empty((n, *f.shape), dtype=f.torch_dtype))
                continue
            out.append(raw.view(f.torch_dtype).reshape(n, *f.shape))
        return tuple(out)


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
        return columns[-1][:num_items].numpy().astype(np.int64)
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

    ``tensors`` holds the fields as whole columns (``(n, *shape)``) for vectorised use;
    ``indices`` the data set indices of the items, in order.
    """

    def __init__(self, tensors: tuple[torch.Tensor, ...], single: bool, indices: np.ndarray):
        self.tensors, self.single, self.indices = tensors, single, indices

    def __len__(self) -> int:
        return int(self.indices.size)

    def __getitem__(self, i: int) -> Any:
        if self.single:
            return self.tensors[0][i]
        return tuple(t[i] for t in self.tensors)
