"""One data set for the whole run (``cs.dataset``) and the order a worker visits it in
(``cs.sampler``), for a ``DataLoader`` built once, with any ``num_workers``,
``persistent_workers=True`` and ``pin_memory``.

After ``cs.set_epoch(e)`` (or ``cs.epoch(e)``) on a worker, index ``i`` of :class:`EpochDataset`
is the ``i``-th item of that worker's batch of epoch ``e``; on the master it is empty.
Minibatches are gathered from the batch's records in one vectorised read (``__getitems__``).

Loader workers are other processes, forked (or spawned) once and kept across epochs. They learn
of each new epoch through a few shared words (a memory file the training process publishes
into, :class:`Cell`), and read the batch where the training process holds it: the file its
store maps it from (opened by the training process and named ``/proc/<pid>/fd/<fd>``: the
path survives the store's renames), or, for a batch in anonymous memory, a memory file the
batch is copied into. The copy is made only once a loader worker exists (it is forked after
the training process published its first epoch, which it then reads from its own copy of
the memory). Linux only, as the rest of the delivery.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from coded_shuffle.codec.records import LocalBatch, RecordLayout
from coded_shuffle.errors import UsageError

# the shared words of a Cell (int64 each)
SEQ, GENERATION, EPOCH, LENGTH, PID, FD, OFFSET, ROWS, WIDTH, READERS = range(10)
CELL_BYTES = mmap.PAGESIZE


class Cell:
    """A few int64 words in a memory file shared by the training process and its loader
    workers: a seqlock (the training process writes, the workers read a consistent view),
    the published batch (its generation, epoch, length, and the ``(pid, fd, offset, rows,
    width)`` a worker maps it from; fd ``-1``: not published as a file) and a flag that a
    loader worker exists."""

    def __init__(self, owner: tuple[int, int] | None = None) -> None:
        if owner is None:  # the training process: a new memory file
            self.fd = os.memfd_create("coded-shuffle-cell")
            os.ftruncate(self.fd, CELL_BYTES)
            self.pid = os.getpid()
            self.map = mmap.mmap(self.fd, CELL_BYTES)
        else:  # a spawned loader worker: the training process's file, by its fd
            self.pid, self.fd = owner
            with open(f"/proc/{self.pid}/fd/{self.fd}", "r+b") as f:
                self.map = mmap.mmap(f.fileno(), CELL_BYTES)
        self.words = np.frombuffer(self.map, dtype=np.int64, count=16)

    def publish(self, values: dict[int, int]) -> None:
        """Writes ``values`` (word -> value) as one change the readers see whole."""
        self.words[SEQ] += 1  # odd: being written
        for word, value in values.items():
            self.words[word] = value
        self.words[SEQ] += 1

    def read(self) -> np.ndarray:
        """A consistent copy of the words."""
        while True:
            seq = int(self.words[SEQ])
            copy = self.words.copy()
            if seq % 2 == 0 and int(self.words[SEQ]) == seq:
                return copy

    def changed_since(self, seq: int) -> bool:
        return int(self.words[SEQ]) != seq


@dataclass
class Exported:
    """A batch's records where loader workers map them from: ``fd`` (this process's), at
    ``offset``; ``copied``: a memory file this process filled."""

    fd: int
    offset: int
    copied: bool

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _mapping_of(rows: torch.Tensor) -> tuple[str, int, int] | None:
    """``(path, offset in the file, inode)`` where ``rows`` (contiguous) lie in a mapping of a
    file that still has a name; None for anonymous memory or a deleted file."""
    start, end = rows.data_ptr(), rows.data_ptr() + rows.numel()
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if not lo <= start < hi:
                continue
            path = parts[5].strip() if len(parts) == 6 else ""
            if end > hi or parts[4] == "0" or not path.startswith("/") or "(deleted)" in path:
                return None
            return path, int(parts[2], 16) + start - lo, int(parts[4])
    return None


def export_rows(rows: torch.Tensor) -> Exported:
    """``rows`` (``(n, width)`` uint8) published for other processes: the named file they
    are mapped from, opened here; else a copy in a new memory file."""
    rows = rows.contiguous()
    found = _mapping_of(rows) if rows.numel() else None
    if found is not None:
        path, offset, inode = found
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            if os.fstat(fd).st_ino == inode:
                return Exported(fd, offset, copied=False)
            os.close(fd)  # renamed over meanwhile: copy instead
    fd = os.memfd_create("coded-shuffle-batch")
    nbytes = rows.numel()
    os.ftruncate(fd, nbytes)
    if nbytes:
        with mmap.mmap(fd, nbytes) as out:
            np.frombuffer(out, dtype=np.uint8)[:] = rows.numpy().reshape(-1)
    return Exported(fd, 0, copied=True)


_live: weakref.WeakSet[EpochDataset] = weakref.WeakSet()


def _forked() -> None:
    """In a forked child (a loader worker): every live data set's cell says a reader exists,
    so the training process publishes its next batches as files."""
    for ds in list(_live):
        ds.cell.words[READERS] = 1


os.register_at_fork(after_in_child=_forked)


class EpochDataset(Dataset):
    """The worker's batch of the current epoch (module docstring); build it once
    (``cs.dataset``) and tell ``cs.set_epoch(e)`` each epoch."""

    def __init__(self, layout: RecordLayout, set_epoch: Callable[[int], Any] | None) -> None:
        self.layout = layout
        self._set_epoch = set_epoch  # the training process's CodedShuffle (never pickled)
        self.cell = Cell()
        self._batch: LocalBatch | None = None  # this process's own copy of a generation
        self._generation = 0
        self._mapped: tuple[int, torch.Tensor] | None = None  # a loader worker's map
        self._exported: Exported | None = None
        _live.add(self)

    # -- the training process --------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Delivers (or collects the prefetched) epoch ``epoch`` and serves its batch: the
        same as ``cs.set_epoch(epoch)``."""
        if self._set_epoch is None:
            raise UsageError("set_epoch() is the training process's: call it outside the loader")
        self._set_epoch(epoch)

    def show(self, epoch: int, batch: LocalBatch | None) -> None:
        """Serves ``batch`` (epoch ``epoch``'s; None on the master: nothing) from now on."""
        generation = int(self.cell.words[GENERATION]) + 1
        self._batch, self._generation = batch, generation
        length = 0 if batch is None else len(batch)
        published: dict[int, int] = {GENERATION: generation, EPOCH: epoch, LENGTH: length, FD: -1}
        old, self._exported = self._exported, None
        if batch is not None and int(self.cell.words[READERS]):
            self._exported = export_rows(batch.rows)
            rows, width = batch.rows.shape
            published.update(
                {
                    PID: os.getpid(),
                    FD: self._exported.fd,
                    OFFSET: self._exported.offset,
                    ROWS: rows,
                    WIDTH: width,
                }
            )
        self.cell.publish(published)
        if old is not None:
            old.close()

    def close(self) -> None:
        """Lets the published files go (loader workers keep what they mapped)."""
        if self._exported is not None:
            self._exported.close()
            self._exported = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for a spawned loader worker: the cell by its fd, the batch as published
        (published now, as a file, if it was not yet)."""
        if self._batch is not None and self._exported is None:
            self.cell.words[READERS] = 1
            self.show(int(self.cell.words[EPOCH]), self._batch)
        return {"layout": self.layout, "cell": (self.cell.pid, self.cell.fd)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.layout = state["layout"]
        self._set_epoch = None
        self.cell = Cell(state["cell"])
        self._batch, self._generation, self._mapped, self._exported = None, 0, None, None

    # -- every process ---------------------------------------------------------------------

    def __len__(self) -> int:
        if self._batch is not None and self._generation == int(self.cell.words[GENERATION]):
            return len(self._batch)
        return int(self.cell.read()[LENGTH])

    def rows(self) -> torch.Tensor:
        """The current batch's records, ``(n, record_bytes)`` uint8."""
        while True:
            words = self.cell.read()
            generation = int(words[GENERATION])
            if generation == 0:
                raise UsageError(
                    "cs.dataset has no batch yet: call cs.set_epoch(epoch) before iterating"
                )
            if self._batch is not None and self._generation == generation:
                return self._batch.rows
            if self._mapped is not None and self._mapped[0] == generation:
                return self._mapped[1]
            rows = _map(words)
            if not self.cell.changed_since(int(words[SEQ])):  # the fd was still that batch's
                self._mapped = (generation, rows)
                return rows

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The items at ``indices`` of the current batch, gathered from its records at once."""
        picked = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        fields = self.layout.unpack(self.rows(), picked)
        if self.layout.single:
            return list(fields[0].unbind(0))
        return list(zip(*(f.unbind(0) for f in fields), strict=True))

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]


def _map(words: np.ndarray) -> torch.Tensor:
    """The published batch's records, mapped from the training process's file."""
    rows, width = int(words[ROWS]), int(words[WIDTH])
    if int(words[FD]) < 0:
        raise RuntimeError(
            "cs.dataset: the training process published no file for this batch (a loader "
            "worker made outside fork or pickling)"
        )
    if rows * width == 0:
        return torch.empty((rows, width), dtype=torch.uint8)
    path = f"/proc/{int(words[PID])}/fd/{int(words[FD])}"
    array = np.memmap(
        path, dtype=np.uint8, mode="c", offset=int(words[OFFSET]), shape=(rows, width)
    )
    return torch.from_numpy(array)


class EpochSampler(Sampler[int]):
    """The positions in the worker's current batch in the order the training job visits
    them (:func:`~coded_shuffle.distributed.ddp.minibatch_order`: from the seed, the epoch and
    the worker); empty on the master. Lives in the training process (a ``DataLoader``'s
    sampler does): it follows ``cs.set_epoch``."""

    def __init__(self, order: Callable[[], np.ndarray]) -> None:
        self._order = order

    def __iter__(self) -> Iterator[int]:
        return iter(self._order().tolist())

    def __len__(self) -> int:
        return int(self._order().size)
