"""Where the codec's rows live: in the process's memory, or in files.

:func:`empty_rows` gives uninitialised rows in memory; large ones are recycled huge-page
buffers. :class:`Buffers` is a caller's choice of where a delivery's large rows go: in memory
(:data:`IN_MEMORY`), or in files of a directory (:class:`FileBuffers`: a worker's store
directory), memory-mapped, so that the page cache keeps what fits and the process's own
(anonymous) memory does not grow with the data set.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import threading
from pathlib import Path

import numpy as np
import torch

HUGE_PAGE_BYTES = 4 << 20  # outputs from this size on are backed by transparent huge pages
IDLE_BYTES_MAX = 512 << 20  # recycled output buffers kept mapped while no tensor uses them
FILE_MIN_BYTES = 1 << 20  # FileBuffers keeps scratch rows smaller than this in memory
_buffers: list[mmap.mmap] = []  # every huge-page buffer handed out (in use or idle)
_buffers_lock = threading.Lock()


def _idle(i: int) -> bool:
    """True when no tensor uses ``_buffers[i]`` (references: the list and this argument).

    ``torch.frombuffer`` holds a buffer export, hence a reference, for as long as any
    tensor or view on the storage lives; so an idle buffer can be handed out again.
    """
    return sys.getrefcount(_buffers[i]) == 2


def _huge_buffer(nbytes: int) -> mmap.mmap:
    """A mapping of ``nbytes`` rounded up to 2 MiB: an idle one reused, else a fresh one.

    Fresh pages cost a fault and the kernel's zeroing on first touch, as much as the XORs
    that fill them; reusing a buffer that the caller dropped avoids both. Idle buffers
    beyond ``IDLE_BYTES_MAX`` are unmapped.
    """
    size = -(-nbytes // (2 << 20)) * (2 << 20)
    idle = [i for i in range(len(_buffers)) if _idle(i)]
    for i in idle:
        if len(_buffers[i]) == size:
            return _buffers[i]
    kept = 0
    for i in reversed(idle):  # the oldest idle buffers go first
        kept += len(_buffers[i])
        if kept + size > IDLE_BYTES_MAX:
            del _buffers[i]
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # without huge pages: ordinary pages, same bytes
        buf.madvise(mmap.MADV_HUGEPAGE)
    _buffers.append(buf)
    return buf


def empty_rows(rows: int, row_bytes: int) -> torch.Tensor:
    """An uninitialised ``(rows, row_bytes)`` uint8 tensor for a codec output.

    Small outputs come from ``torch.empty``. From ``HUGE_PAGE_BYTES`` on, the buffer is a
    private anonymous mapping advised ``MADV_HUGEPAGE`` (the tensor keeps the mapping alive;
    where the advice is unavailable, ordinary pages), recycled once no tensor uses it: with
    4 KiB pages, the first touch of every page of a fresh output costs as much as the XORs.
    """
    nbytes = rows * row_bytes
    if nbytes < HUGE_PAGE_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty((rows, row_bytes), dtype=torch.uint8)
    with _buffers_lock:  # the export must exist before another thread looks for idle buffers
        buf = _huge_buffer(nbytes)
        return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes).view(rows, row_bytes)


class Buffers:
    """Where a delivery's large rows go (:meth:`empty`); this base keeps them in memory."""

    def empty(self, rows: int, width: int, slot: str | None = None) -> torch.Tensor:
        """Uninitialised ``(rows, width)`` uint8 rows. ``slot`` names rows that outlive the
        delivery (a worker's store: :meth:`FileBuffers.path`); ``None``: scratch rows."""
        del slot
        return empty_rows(rows, width)

    def path(self, slot: str) -> Path | None:
        """The file that holds ``slot``'s rows (None: in memory)."""
        del slot
        return None


IN_MEMORY = Buffers()


class FileBuffers(Buffers):
    """Rows in memory-mapped files under ``root``: a slot in ``<slot>.npy.tmp`` (a NumPy
    ``.npy`` file, renamed when the caller persists it), scratch rows in a file that is
    unlinked at once (its pages go when the rows do). The page cache holds what fits; the
    process's own memory does not grow with the rows."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._count = 0

    def path(self, slot: str) -> Path:
        return self.root / f"{slot}.npy.tmp"

    def empty(self, rows: int, width: int, slot: str | None = None) -> torch.Tensor:
        if slot is None and (rows * width < FILE_MIN_BYTES or rows * width == 0):
            return empty_rows(rows, width)
        if slot is None:
            self._count += 1
            path = self.root / f"scratch-{os.getpid()}-{self._count}.npy.tmp"
        else:
            path = self.path(slot)
        array = mapped_rows(path, rows, width)
        if slot is None:
            path.unlink()  # the mapping keeps the pages; nothing stays on disk
        return torch.from_numpy(array)


def mapped_rows(path: Path, rows: int, width: int) -> np.ndarray:
    """A new ``.npy`` file of ``(rows, width)`` uint8, memory-mapped for writing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    if rows * width == 0:  # numpy cannot map an empty file: a plain array, same shape
        empty = np.zeros((rows, width), dtype=np.uint8)
        with open(path, "wb") as f:
            np.save(f, empty)
        return empty
    return np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(rows, width))
