"""A worker's store on its disk (``CodedShuffle(store_dir=...)``): the memory-mapped files the
worker decodes into and trains from, persisted after every epoch so that a restarted job
resumes without moving them again (:meth:`~coded_shuffle.CodedShuffle.restore`). The store a
worker works with and the one it restarts from are the same file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coded_shuffle.codec.blockstore import DIGEST_KEYS, BlockStore
from coded_shuffle.codec.buffers import FileBuffers
from coded_shuffle.codec.records import as_tensor
from coded_shuffle.distributed.context import EpochContext
from coded_shuffle.distributed.delivery import WorkerStore

# what a store's identity holds that a change in the number of workers changes
CHANGES_WITH_K = ("workers", "points", "first_epoch")


def rank_folder(root: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` keeps its files under a job's store directory."""
    return Path(root) / ("master" if rank == 0 else f"worker-{rank - 1}")


def slot(epoch: int, part: int) -> str:
    """The name of a store's part after ``epoch``."""
    return f"e{epoch}-part{part}"


def points_slot(epoch: int) -> str:
    """The name of the point ids of a store of whole points after ``epoch``."""
    return f"e{epoch}-points"


def batch_slot(epoch: int) -> str:
    """The name of a worker's kept batch of ``epoch``."""
    return f"batch-e{epoch}"


class StorePersistence:
    """A worker's store, one slot per epoch and part (the one before it dropped), in the
    folder of ``buffers`` (:func:`rank_folder`), where its rows live from the start."""

    def __init__(self, buffers: FileBuffers, ctx: EpochContext) -> None:
        self.disk = BlockStore(buffers.root, dtype=None)
        self.buffers = buffers
        self.ctx = ctx

    def slots(self, epoch: int, parts: int) -> list[str | None]:
        """Where the store after ``epoch`` goes, part by part."""
        return [slot(epoch, p) for p in range(parts)]

    def save(self, epoch: int, store: WorkerStore, known: bytes | None = None) -> None:
        """Persists the store after ``epoch``: a part already in its slot's file is that file
        (flushed and named), another is written; the store before the last is dropped.
        ``known``: the SHA-256 of the store's bytes where the worker has it (its one part is
        its batch, hashed as it was decoded)."""
        for part, cache in enumerate(store.caches):
            name = slot(epoch, part)
            if store.slots[part] == name:
                path, rows, meta = self.buffers.path(name), cache.numpy(), self.identity(epoch)
                self.disk.adopt(name, path, rows, meta, known if part == 0 else None)
            else:
                self.disk.save(name, cache.numpy(), self.identity(epoch))
            self._retire(slot(epoch - 2, part))

    def _retire(self, name: str) -> None:
        """Slot ``name`` dropped, its file kept for the next slots to be written over
        (:meth:`~coded_shuffle.codec.buffers.FileBuffers.recycle`)."""
        path = self.disk.retire(name)
        if path is not None:
            self.buffers.recycle(path)

    def save_points(self, epoch: int, points: np.ndarray) -> None:
        """The point ids of the store after ``epoch`` where it is whole points (a job that
        goes on with another number of workers reuses them)."""
        self.disk.save(points_slot(epoch), points, self.identity(epoch))
        self.disk.remove(points_slot(epoch - 2))

    def load_whole(self, epoch: int) -> tuple[np.ndarray, torch.Tensor] | None:
        """The whole points of the store after ``epoch`` and their rows, kept by this job
        with any number of workers (the identity but for :data:`CHANGES_WITH_K`), if present
        and intact."""
        points = self._load(points_slot(epoch), epoch, CHANGES_WITH_K)
        rows = self._load(slot(epoch, 0), epoch, CHANGES_WITH_K)
        if points is None or rows is None:
            return None
        if rows.ndim != 2 or tuple(rows.shape) != (
            points.numel(),
            self.ctx.shape.layout.record_bytes,
        ):
            return None
        return points.numpy().astype(np.int64, copy=False), rows

    def save_batch(self, epoch: int, batch: torch.Tensor) -> None:
        """Keeps the batch of ``epoch``; the one of two epochs before is dropped (the loop
        may still train on the epoch before while this one was delivered ahead: a restart
        inside it finds its batch)."""
        self.disk.save(batch_slot(epoch), batch.numpy(), self.identity(epoch))
        self.disk.remove(batch_slot(epoch - 2))

    def load_batch(self, epoch: int) -> torch.Tensor | None:
        """The kept batch of ``epoch``, if present and intact (memory-mapped)."""
        return self._load(batch_slot(epoch), epoch)

    def _load(self, name: str, epoch: int, regardless: tuple[str, ...] = ()) -> torch.Tensor | None:
        """Slot ``name`` (memory-mapped) if present, intact and of this job after ``epoch``
        (its identity but for the keys ``regardless``)."""
        skip = {*DIGEST_KEYS, *regardless}
        meta = {k: v for k, v in self.disk.meta(name).items() if k not in skip}
        want = {k: v for k, v in self.identity(epoch).items() if k not in skip}
        array = self.disk.load(name, mapped=True) if meta == want else None
        return None if array is None else as_tensor(array)

    def identity(self, epoch: int) -> dict[str, Any]:
        """What a stored store must match to be reused: the same run (every key that decides
        its batches: :meth:`~coded_shuffle.distributed.context.EpochContext.identity`), the
        same record size, the same epoch."""
        return {
            **self.ctx.identity(),
            "record_bytes": self.ctx.shape.layout.record_bytes,
            "epoch": epoch,
        }

    def load(self, epoch: int, parts: int) -> WorkerStore | None:
        """The store after ``epoch``, if every part is present and intact (memory-mapped)."""
        caches = [self._load(slot(epoch, part), epoch) for part in range(parts)]
        if any(c is None for c in caches):
            return None
        return WorkerStore([c for c in caches if c is not None])
