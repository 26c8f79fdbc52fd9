"""Where the codec's rows live: in the process's memory, or in files.

:func:`empty_rows` gives uninitialised rows in memory; large ones are recycled huge-page
buffers. :class:`Buffers` is a caller's choice of where a delivery's large rows go: in memory
(:data:`IN_MEMORY`), or in files of a directory (:class:`FileBuffers`: a worker's store
directory), memory-mapped, so that the page cache keeps what fits and the process's own
(anonymous) memory does not grow with the data set.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
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
PAYLOAD_GRANULE = 4 << 10  # a message payload's buffer: a multiple of a page
PAYLOAD_IDLE_BYTES_MAX = 8 << 20  # ... and idle ones kept, a window of messages or more
SPARES_MAX = 4  # files a FileBuffers keeps to write the next slots over (the oldest go first)
PAGE_BYTES = mmap.PAGESIZE
PRIME_BYTES_MAX = 256 << 20  # rows a process primes for its first delivery, at most
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14 on

Buffer = mmap.mmap | bytearray  # what a pool hands out (``torch.frombuffer`` exports it)


class Recycled:
    """Buffers (mappings; heap ``bytearray`` for message payloads) handed out, and handed out
    again once nothing uses them: a buffer goes out as one uint8 array over it (:meth:`take`),
    which every tensor made from it (``torch.from_numpy`` keeps the array alive) and every view
    keeps alive; the pool holds only a weak reference to that array, so the buffer is idle
    once it is gone.

    Fresh pages cost a fault and the kernel's zeroing on first touch (on this project's
    virtual machines several times the XORs that fill them; a scratch file's pages a
    read of a hole and its zeroing too); a buffer that the caller dropped is reused instead.
    ``make(size)`` makes a buffer of ``size`` bytes; a fresh buffer is ``headroom`` larger than
    asked (rounded up to ``granule``). Idle buffers beyond ``idle_max`` bytes are let go, the
    oldest first. A forked child does not reuse its parent's (a shared mapping would be
    written by both).
    """

    def __init__(
        self,
        make: Callable[[int], Buffer],
        idle_max: int,
        headroom: float = 0.0,
        granule: int = GRANULE,
    ) -> None:
        self.make, self.idle_max, self.headroom = make, idle_max, headroom
        self.granule = granule
        self.items: list[Buffer] = []
        self.users: list[weakref.ref[np.ndarray] | None] = []  # items[i]'s array while out
        self.lock = threading.Lock()  # held while a buffer is chosen and handed out
        self.pid = os.getpid()

    def _idle(self, i: int) -> bool:
        """True when the array over ``items[i]`` that :meth:`take` handed out is gone."""
        user = self.users[i]
        return user is None or user() is None

    def take(self, nbytes: int, make: Callable[[int], Buffer] | None = None) -> np.ndarray:
        """A uint8 array over the smallest idle buffer of ``nbytes`` to ``REUSE_WITHIN`` times
        that (or to a fresh one's size), else over a fresh one (by ``make``, else the pool's
        own): the whole buffer, busy until the array and everything made from it are gone."""
        with self.lock:
            if os.getpid() != self.pid:
                self.items, self.users, self.pid = [], [], os.getpid()
            i = self._choose(nbytes, make)
            rows = np.frombuffer(self.items[i], dtype=np.uint8)
            self.users[i] = weakref.ref(rows)
            return rows

    def _choose(self, nbytes: int, make: Callable[[int], Buffer] | None) -> int:
        """:meth:`take`'s buffer: an idle one that fits, else a fresh one appended (the oldest
        idle ones let go beyond ``idle_max``)."""
        idle = [i for i in range(len(self.items)) if self._idle(i)]
        size = -(-int(nbytes * (1 + self.headroom)) // self.granule) * self.granule
        most = max(size, nbytes * REUSE_WITHIN)
        fits = [i for i in idle if nbytes <= len(self.items[i]) <= most]
        if fits:
            return min(fits, key=lambda i: len(self.items[i]))
        kept = 0
        for i in reversed(idle):  # the oldest idle buffers go first
            kept += len(self.items[i])
            if kept + size > self.idle_max:
                del self.items[i], self.users[i]
        self.items.append((make or self.make)(size))
        self.users.append(None)
        return len(self.items) - 1

    def prime(self, sizes: Sequence[int], make: Callable[[int], Buffer] | None = None) -> None:
        """Buffers for requests of ``sizes`` bytes taken together (made by ``make`` where none
        is idle) and every page touched (:func:`touch`), then idle again: the requests that
        follow find them ready, as a later epoch's do."""
        held = [self.take(nbytes, make) for nbytes in sizes]  # held: none is taken twice
        for rows in held:
            touch(rows)


def touch(rows: np.ndarray) -> None:
    """Every page of ``rows`` (the whole of a buffer) faulted in writable now, so that a later
    write into it takes no fault. Its bytes are not kept (a buffer handed out is
    uninitialised)."""
    if rows.size and not _populate(rows):
        rows[::PAGE_BYTES] = 0  # a byte written per page


def _populate(rows: np.ndarray) -> bool:
    """``MADV_POPULATE_WRITE`` over ``rows`` (a whole mapping): every fault in one call, the
    interpreter free meanwhile (ctypes lets go of it); False where the kernel (before 5.14)
    or C library cannot."""
    if _libc is None:
        return False
    start, length = ctypes.c_void_p(rows.ctypes.data), ctypes.c_size_t(rows.size)
    return _libc.madvise(start, length, MADV_POPULATE_WRITE) == 0


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # no C library to call: pages written one by one
        return None


_libc = _load_libc()


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


_payloads = Recycled(bytearray, PAYLOAD_IDLE_BYTES_MAX, granule=PAYLOAD_GRANULE)


def payload_rows(rows: int, row_bytes: int) -> torch.Tensor:
    """Uninitialised ``(rows, row_bytes)`` uint8 rows for one message's payload (or a whole
    framed message), on a buffer handed out again once no tensor or view uses it. A message
    of 256 KiB or just under (the default ``chunk_bytes``) is below the ranks' mmap
    threshold: one fresh allocation per message made glibc's heap grow by 7-13 MB at the
    master over the first few hundred messages (docs/benchmarks.md, "Memory")."""
    if rows * row_bytes == 0:
        return torch.empty((rows, row_bytes), dtype=torch.uint8)
    return _export(_payloads, rows, row_bytes)


def _export(pool: Recycled, rows: int, row_bytes: int) -> torch.Tensor:
    """``(rows, row_bytes)`` uint8 rows on a buffer of ``pool``."""
    nbytes = rows * row_bytes
    return torch.from_numpy(pool.take(nbytes)[:nbytes]).view(rows, row_bytes)


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

    def prime(
        self, scratch: Sequence[tuple[int, int]], slots: Sequence[tuple[int, int]] = ()
    ) -> None:
        """Makes ready, every page touched, the rows that the next :meth:`empty` calls of
        these ``(rows, width)`` shapes ask for: ``scratch`` rows, and ``slots`` (rows that
        outlive the delivery). A process's first delivery otherwise writes into fresh pages
        (each faults and is zeroed; in a file, allocated too), which cost it several times
        the CPU of a later one (docs/benchmarks.md, "Multicast at the cluster's default
        MTU"). Called while the process waits anyway (the placement). Nothing where the
        rows exceed ``PRIME_BYTES_MAX``: so many pages written ahead (on disk: dirty pages
        the kernel writes back while the placement writes its own) cost the placement more
        than they save (a 1 GB set's placement: 4.5 s longer). In memory: the recycled
        huge-page buffers."""
        scratch_bytes = [rows * width for rows, width in scratch]
        slot_bytes = [rows * width for rows, width in slots]
        if sum(scratch_bytes) + sum(slot_bytes) <= PRIME_BYTES_MAX:
            self._prime([n for n in scratch_bytes if n], [n for n in slot_bytes if n])

    def _prime(self, scratch: list[int], slots: list[int]) -> None:
        """:meth:`prime`'s rows by their bytes (none empty), within the cap."""
        _huge.prime([n for n in (*scratch, *slots) if n >= HUGE_PAGE_BYTES])


IN_MEMORY = Buffers()


class FileBuffers(Buffers):
    """Rows in memory-mapped files under ``root``: a slot in ``<slot>.npy.tmp`` (a NumPy
    ``.npy`` file, renamed when the caller persists it), scratch rows in a file that is
    unlinked at once (its pages go when the rows do). The page cache holds what fits; the
    process's own memory does not grow with the rows."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._names = itertools.count(1)  # a file's number (next() is atomic: two threads)
        self._scratch = Recycled(self._scratch_file, FILE_IDLE_BYTES_MAX, FILE_HEADROOM)
        self.spares: list[Path] = []  # files of slots given back (:meth:`recycle`), oldest first
        self._spares_lock = threading.Lock()
        for stale in self.root.glob("spare-*.tmp"):  # a process before this one's (restarted)
            stale.unlink(missing_ok=True)

    def path(self, slot: str) -> Path:
        return self.root / f"{slot}.npy.tmp"

    def empty(self, rows: int, width: int, slot: str | None = None) -> torch.Tensor:
        if slot is None and (rows * width < FILE_MIN_BYTES or rows * width == 0):
            return empty_rows(rows, width)
        if slot is None:
            return _export(self._scratch, rows, width)
        over = self._spare(rows * width) if rows * width else None
        return torch.from_numpy(mapped_rows(self.path(slot), rows, width, over))

    def _prime(self, scratch: list[int], slots: list[int]) -> None:
        """Scratch rows: the recycled scratch files' pages, the files written with zeros
        (rows under ``FILE_MIN_BYTES`` are the process's own, fresh each time: nothing to
        prime); slots: a spare file (:meth:`recycle`) of each size, written with zeros, for
        the next slots to be written over."""
        filled = functools.partial(self._scratch_file, filled=True)
        self._scratch.prime([n for n in scratch if n >= FILE_MIN_BYTES], filled)
        for nbytes in slots[:SPARES_MAX]:  # and room for a ``.npy`` header
            with self._new_file("spare", nbytes + PAGE_BYTES, filled=True) as (path, _):
                self._keep_spare(path)

    @contextlib.contextmanager
    def _new_file(self, kind: str, size: int, filled: bool) -> Iterator[tuple[Path, int]]:
        """A new file of ``size`` bytes (written with zeros where ``filled``:
        :func:`zero_fill`, its blocks reserved and its pages cached; else a hole), and its
        descriptor while the caller needs it; removed where anything fails."""
        path = self._file(kind)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if filled:
                zero_fill(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            yield path, fd
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)

    def _file(self, kind: str) -> Path:
        """A new ``<kind>-<pid>-<n>.tmp`` in the root, named once whatever thread asks."""
        return self.root / f"{kind}-{os.getpid()}-{next(self._names)}.tmp"

    def _keep_spare(self, spare: Path) -> None:
        with self._spares_lock:
            self.spares.append(spare)
            while len(self.spares) > SPARES_MAX:
                self.spares.pop(0).unlink(missing_ok=True)

    def recycle(self, path: Path) -> None:
        """Keeps the file at ``path`` (a slot's, which the caller no longer needs, and which
        no tensor of the caller's maps any more) to write a later slot of about its size over:
        its blocks are allocated and its pages cached, where a new file's first write of every
        page faults, allocates and zeroes it (several times the cost of writing over a cached
        page here; docs/benchmarks.md, "Multicast at the cluster's default MTU")."""
        spare = self._file("spare")
        try:
            os.replace(path, spare)
        except FileNotFoundError:
            return
        self._keep_spare(spare)

    def _spare(self, nbytes: int) -> Path | None:
        """The spare file closest in size to ``nbytes`` (taken out of the spares), if any."""
        with self._spares_lock:  # :meth:`prime` may add spares from another thread
            sizes = []
            for path in list(self.spares):
                try:
                    sizes.append((abs(path.stat().st_size - nbytes), path))
                except FileNotFoundError:
                    self.spares.remove(path)
            if not sizes:
                return None
            best = min(sizes)[1]
            self.spares.remove(best)
            return best

    def _scratch_file(self, size: int, filled: bool = False) -> mmap.mmap:
        """A shared mapping of a new file of ``size`` bytes (:meth:`_new_file`), unlinked at
        once (the mapping keeps its pages; nothing stays on disk)."""
        with self._new_file("scratch", size, filled) as (path, fd):
            try:
                return mmap.mmap(fd, size)
            finally:
                path.unlink()


def zero_fill(fd: int, start: int, end: int) -> None:
    """Bytes ``start .. end`` of the file ``fd`` written with zeros, by ``pwrite``: the page
    cache then holds them in large folios where the file system can (ext4 from Linux 6.16),
    and a mapping of them later faults (or is populated) many times faster than one of pages
    that faults made one by one (10 MB here: 0.2-0.3 ms against 3 ms)."""
    at = start
    while at < end:
        at += os.pwrite(fd, _ZEROS[: min(len(_ZEROS), end - at)], at)


_ZEROS = memoryview(bytes(1 << 20))


def mapped_rows(path: Path, rows: int, width: int, over: Path | None = None) -> np.ndarray:
    """A ``.npy`` file of ``(rows, width)`` uint8 at ``path``, memory-mapped for writing: a
    new file, or the file ``over`` renamed and written over (its bytes are not the rows':
    the caller writes every row, as into a new file's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    if rows * width == 0:  # numpy cannot map an empty file: a plain array, same shape
        if over is not None:
            over.unlink(missing_ok=True)
        empty = np.zeros((rows, width), dtype=np.uint8)
        with open(path, "wb") as f:
            np.save(f, empty)
        return empty
    if over is not None:
        try:
            os.replace(over, path)
        except FileNotFoundError:  # gone meanwhile: a new file
            over = None
    if over is None:
        return np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(rows, width))
    header = {"descr": "|u1", "fortran_order": False, "shape": (rows, width)}
    with open(path, "r+b") as f:
        np.lib.format.write_array_header_1_0(f, header)
        offset = f.tell()
        f.truncate(offset + rows * width)
    return np.memmap(path, dtype=np.uint8, mode="r+", offset=offset, shape=(rows, width))
