"""Where the codec's rows live: in the process's memory, or in files.

:func:`empty_rows` gives uninitialised rows in memory; large ones are recycled huge-page
buffers. :class:`Buffers` is a caller's choice of where a delivery's large rows go: in memory
(:data:`IN_MEMORY`), or in files of a directory (:class:`FileBuffers`: a worker's store
directory), memory-mapped, so that the page cache keeps what fits and the process's own
(anonymous) memory does not grow with the data set.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

HUGE_PAGE_BYTES = 4 << 20  # outputs from this size on are backed by transparent huge pages
IDLE_BYTES_MAX = 512 << 20  # recycled output buffers kept mapped while no tensor uses them
FILE_IDLE_BYTES_MAX = 2 << 30  # ... and recycled scratch files (page cache, not the process's)
FILE_MIN_BYTES = 1 << 20  # FileBuffers keeps scratch rows smaller than this in memory
GRANULE = 2 << 20  # a recycled buffer's size is a multiple of this
FILE_HEADROOM = 1 / 32  # a fresh scratch file this much larger: the next epoch's stream fits
REUSE_WITHIN = 1.25  # an idle buffer serves a request of at least 1/1.25 of its size


class Recycled:
    """Mappings handed out as buffers and handed out again once no tensor uses them.

    Fresh pages cost a fault and the kernel's zeroing on first touch (on this project's
    virtual machines several times the XORs that fill them; a scratch file's pages a
    read of a hole and its zeroing too); a buffer that the caller dropped is reused instead.
    ``make(size)`` maps ``size`` bytes; a fresh buffer is ``headroom`` larger than asked
    (rounded up to ``GRANULE``). Idle buffers beyond ``idle_max`` bytes are unmapped, the
    oldest first. A forked child does not reuse its parent's (a shared mapping would be
    written by both).
    """

    def __init__(
        self, make: Callable[[int], mmap.mmap], idle_max: int, headroom: float = 0.0
    ) -> None:
        self.make, self.idle_max, self.headroom = make, idle_max, headroom
        self.items: list[mmap.mmap] = []
        self.lock = threading.Lock()  # held until the caller exports the buffer
        self.pid = os.getpid()

    def _idle(self, i: int) -> bool:
        """True when no tensor uses ``items[i]`` (references: the list and this argument).

        ``torch.frombuffer`` holds a buffer export, hence a reference, for as long as any
        tensor or view on the storage lives; so an idle buffer can be handed out again.
        """
        return sys.getrefcount(self.items[i]) == 2

    def take(self, nbytes: int) -> mmap.mmap:
        """The smallest idle buffer of ``nbytes`` to ``REUSE_WITHIN`` times that (or to a fresh
        one's size), else a fresh one; call with :attr:`lock` held, and export the buffer
        before releasing it."""
        if os.getpid() != self.pid:
            self.items, self.pid = [], os.getpid()
        idle = [i for i in range(len(self.items)) if self._idle(i)]
        size = -(-int(nbytes * (1 + self.headroom)) // GRANULE) * GRANULE  # a fresh one's
        most = max(size, nbytes * REUSE_WITHIN)
        fits = [i for i in idle if nbytes <= len(self.items[i]) <= most]
        if fits:
            return self.items[min(fits, key=lambda i: len(self.items[i]))]
        kept = 0
        for i in reversed(idle):  # the oldest idle buffers go first
            kept += len(self.items[i])
            if kept + size > self.idle_max:
                del self.items[i]
        buf = self.make(size)
        self.items.append(buf)
        return buf


def _anonymous(size: int) -> mmap.mmap:
    """A private anonymous mapping advised ``MADV_HUGEPAGE`` (ordinary pages without)."""
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # without huge pages: ordinary pages, same bytes
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


_huge = Recycled(_anonymous, IDLE_BYTES_MAX)


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
    return _export(_huge, rows, row_bytes)


def _export(pool: Recycled, rows: int, row_bytes: int) -> torch.Tensor:
    """``(rows, row_bytes)`` uint8 rows on a buffer of ``pool``."""
    nbytes = rows * row_bytes
    with pool.lock:  # the export must exist before another thread looks for idle buffers
        buf = pool.take(nbytes)
        return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes).view(rows, row_bytes)


class Buffers:
    """Where a delivery's large rows go (:meth:`empty`); this base keeps them in memory."""

    def empty(self, rows: int, width: int, slot: str | None = None) -> torch.Tensor:
        """Uninitialised ``(rows, width)`` uint8 rows. ``slot`` names rows that outlive the
        delivery (a worker's store, persisted under that name: :meth:`FileBuffers.write`);
        ``None``: scratch rows."""
        del slot
        return empty_rows(rows, width)


IN_MEMORY = Buffers()


class FileBuffers(Buffers):
    """Rows in memory-mapped files under ``root``, each unlinked at once (its pages go when
    the rows do) and recycled once no tensor uses it; a slot's rows are written to
    ``<slot>.npy.tmp`` (a NumPy ``.npy`` file) when the caller persists them (:meth:`write`).
    The page cache holds what fits; the process's own memory does not grow with the rows.

    A slot's rows are not decoded into its file through a mapping: every 4 KiB page of a new
    file written through a shared mapping is a fault of its own (allocated, zeroed, made
    writable; 9.5 ms per 10 MB here), while one ``write`` of the finished rows takes 2 ms
    (docs/benchmarks.md)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._count = 0
        self._scratch = Recycled(self._scratch_file, FILE_IDLE_BYTES_MAX, FILE_HEADROOM)
        self._streamed: dict[str, SlotFile] = {}

    def path(self, slot: str) -> Path:
        """The file :meth:`write` puts ``slot``'s rows in."""
        return self.root / f"{slot}.npy.tmp"

    def empty(self, rows: int, width: int, slot: str | None = None) -> torch.Tensor:
        del slot  # a slot's rows live where scratch rows do until they are written
        if rows * width < FILE_MIN_BYTES or rows * width == 0:
            return empty_rows(rows, width)
        return _export(self._scratch, rows, width)

    def stream(self, slot: str, rows: np.ndarray) -> SlotFile:
        """``slot``'s file, to be written a leading run of ``rows`` at a time as the caller
        finishes them (:meth:`SlotFile.advance`), so that the disk takes them while the rest
        is made; :meth:`write` of the same rows then writes nothing again."""
        path = self.path(slot)
        path.parent.mkdir(parents=True, exist_ok=True)
        for unfinished in self._streamed.values():  # (never persisted: the job's last epoch)
            unfinished.close()
        self._streamed = {slot: SlotFile(path, rows)}
        return self._streamed[slot]

    def write(self, slot: str, rows: np.ndarray) -> Path:
        """``rows`` in ``slot``'s file (its ``.npy`` header, then the rows in one write, not
        synced), unless :meth:`stream` wrote them all already; returns the file's path."""
        streamed = self._streamed.pop(slot, None)
        if streamed is not None:
            streamed.close()
            if streamed.holds(rows):
                return streamed.path
        path = self.path(slot)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            np.save(f, np.ascontiguousarray(rows))
        return path

    def _scratch_file(self, size: int) -> mmap.mmap:
        """A shared mapping of a new file of ``size`` bytes, unlinked at once (the mapping
        keeps its pages; nothing stays on disk)."""
        self._count += 1
        path = self.root / f"scratch-{os.getpid()}-{self._count}.tmp"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            return mmap.mmap(fd, size)
        finally:
            os.close(fd)
            path.unlink()


class SlotFile:
    """A ``.npy`` file of ``rows`` (C-contiguous) written a leading run of rows at a time
    (:meth:`advance`); it lets go of the rows once it holds them all, or is closed."""

    def __init__(self, path: Path, rows: np.ndarray) -> None:
        if not rows.flags.c_contiguous:
            raise ValueError(f"a slot file of rows {rows.shape} that are not contiguous")
        self.path, self.rows = path, rows
        self.shape, self.address = rows.shape, rows.__array_interface__["data"][0]
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(rows))
        self.start, self.done = len(head.getvalue()), 0
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        _write_all(self.fd, memoryview(head.getvalue()), 0)
        self._close_when_done()

    def advance(self, upto: int) -> None:
        """Rows up to ``upto`` (excluded) final: those not written yet go to the file."""
        if self.rows is None or upto <= self.done:
            return
        row_bytes = self.rows.strides[0]
        run = memoryview(self.rows[self.done : upto]).cast("B")
        _write_all(self.fd, run, self.start + self.done * row_bytes)
        self.done = upto
        self._close_when_done()

    def holds(self, rows: np.ndarray) -> bool:
        """Whether the file holds every one of ``rows`` (the very rows it was given)."""
        same = rows.shape == self.shape and rows.__array_interface__["data"][0] == self.address
        return same and self.done == self.shape[0]

    def close(self) -> None:
        """No more rows: the file is closed and the rows let go (written or not)."""
        if self.rows is not None:
            os.close(self.fd)
            self.rows = None

    def _close_when_done(self) -> None:
        if self.done == self.shape[0]:
            self.close()


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    """``data`` at ``offset`` of the file, however many calls ``pwrite`` takes."""
    while data.nbytes:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n
