"""A worker's store on its disk after every epoch, so that a restarted job resumes without
moving it again (``CodedShuffle(store_dir=...)``, :meth:`~coded_shuffle.CodedShuffle.restore`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from coded_shuffle.codec.blockstore import BlockStore
from coded_shuffle.distributed.context import ShuffleSettings
from coded_shuffle.distributed.delivery import WorkerStore


class StorePersistence:
    """Worker ``worker``'s store, one slot per epoch and part (the one before it dropped)."""

    def __init__(
        self, root: str | os.PathLike[str], worker: int, settings: ShuffleSettings, scheme: str
    ) -> None:
        self.disk = BlockStore(Path(root) / f"worker-{worker}", dtype=None)
        self.settings, self.scheme = settings, scheme

    def save(self, epoch: int, store: WorkerStore) -> None:
        for part, cache in enumerate(store.caches):
            self.disk.save(f"e{epoch}-part{part}", cache.numpy(), self.identity(epoch))
            self.disk.remove(f"e{epoch - 2}-part{part}")

    def identity(self, epoch: int) -> dict[str, Any]:
        """What a stored store must match to be reused: the same job, the same epoch."""
        s = self.settings
        return {
            "epoch": epoch,
            "scheme": self.scheme,
            "seed": s.seed,
            "storage": s.storage,
            "points": s.num_points,
            "record_bytes": s.layout.record_bytes,
            "workers": s.workers,
        }

    def load(self, epoch: int, parts: int) -> WorkerStore | None:
        """The store after ``epoch``, if every part is present and intact."""
        caches = []
        for part in range(parts):
            slot = f"e{epoch}-part{part}"
            meta = {k: v for k, v in self.disk.meta(slot).items() if k != "digest"}
            array = self.disk.load(slot) if meta == self.identity(epoch) else None
            if array is None:
                return None
            caches.append(torch.from_numpy(array))
        return WorkerStore(caches)
