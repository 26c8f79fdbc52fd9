"""A worker's persistent store on its own disk: named arrays that survive a restart.

Each slot is ``<slot>.npy`` plus ``<slot>.json`` (digest and metadata), written to a temporary
file and renamed, so a worker killed mid-write leaves either the old slot or the new one. A
restarted worker reloads its slot and proves it intact by the SHA-256 digest. Used by coded
elastic computing (a worker's coded block) and by :class:`~coded_shuffle.CodedShuffle`
(a worker's cached rows, ``store_dir=``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

DIGEST_BYTES = 16 << 20  # bytes hashed at a time (a mapped array is read, never copied whole)
DIGEST_KEYS = ("digest", "bytes_sha256", "dtype", "shape")  # a slot's description, not its meta


def array_digest(array: np.ndarray) -> bytes:
    """SHA-256 of an array's shape, dtype and bytes (to recognise a stored array)."""
    a = np.ascontiguousarray(array)
    return _hash_bytes(hashlib.sha256(f"{a.dtype.str}{a.shape}".encode()), a)


def bytes_digest(array: np.ndarray) -> bytes:
    """SHA-256 of an array's bytes alone, in row-major order (a worker's batch digest)."""
    return _hash_bytes(hashlib.sha256(), np.ascontiguousarray(array))


def _hash_bytes(h: Any, a: np.ndarray) -> bytes:
    flat = a.reshape(-1).view(np.uint8) if a.size else np.zeros(0, np.uint8)
    for start in range(0, flat.size, DIGEST_BYTES):
        h.update(flat[start : start + DIGEST_BYTES])
    return h.digest()


class BlockStore:
    """Named arrays persisted under ``root`` (one directory per worker), stored as ``dtype``
    (``None``: as given)."""

    def __init__(
        self, root: str | os.PathLike[str], dtype: np.dtype | type | None = np.float64
    ) -> None:
        self.dtype = dtype
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._cache: dict[str, np.ndarray] = {}

    def _paths(self, slot: str) -> tuple[Path, Path]:
        return self.root / f"{slot}.npy", self.root / f"{slot}.json"

    def save(self, slot: str, array: np.ndarray, meta: dict[str, Any] | None = None) -> bytes:
        """Persists ``array`` in ``slot`` atomically; returns its digest."""
        data = self._paths(slot)[0]
        array = np.ascontiguousarray(array, dtype=self.dtype)
        d = array_digest(array)
        tmp = data.with_suffix(".npy.tmp")
        with open(tmp, "wb") as f:
            np.save(f, array)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, data)
        self._describe(slot, d, meta)
        self._cache[slot] = array
        return d

    def adopt(
        self,
        slot: str,
        path: Path,
        array: np.ndarray,
        meta: dict[str, Any] | None = None,
        known: bytes | None = None,
    ) -> bytes:
        """Makes the ``.npy`` file at ``path`` (``array``: its rows, memory-mapped, written in
        place) the slot, without a copy: synced to disk, then renamed and described. Returns
        its digest. ``known``: the :func:`bytes_digest` of ``array`` already computed (a
        worker hashed its batch as it decoded it), recorded with the array's dtype and shape
        instead of hashing it again."""
        data, _ = self._paths(slot)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # the mapping's dirty pages too (they are the file's page cache)
        finally:
            os.close(fd)
        os.replace(path, data)
        if known is None:
            d = array_digest(array)
            self._describe(slot, d, meta)
        else:
            d = known
            shape = {"bytes_sha256": known.hex(), "dtype": array.dtype.str, "shape": array.shape}
            self._describe(slot, None, {**(meta or {}), **shape})
        self._cache[slot] = array
        return d

    def _describe(self, slot: str, digest: bytes | None, meta: dict[str, Any] | None) -> None:
        info = self._paths(slot)[1]
        tmp_info = info.with_suffix(".json.tmp")
        head = {} if digest is None else {"digest": digest.hex()}
        tmp_info.write_text(json.dumps({**head, **(meta or {})}))
        os.replace(tmp_info, info)

    def load(self, slot: str, mapped: bool = False) -> np.ndarray | None:
        """The slot's array if present and intact (digest matches), else None; ``mapped``:
        memory-mapped read-only instead of read into memory."""
        if slot in self._cache:
            return self._cache[slot]
        data, info = self._paths(slot)
        try:
            meta = json.loads(info.read_text())
            array = _read(data, mapped)
        except (OSError, ValueError):
            return None
        if not _intact(array, meta):
            return None
        self._cache[slot] = array
        return array

    def retire(self, slot: str) -> Path | None:
        """Forgets ``slot`` but leaves its data file (returned; None where it has none) for the
        caller to reuse or delete."""
        self._cache.pop(slot, None)
        data, info = self._paths(slot)
        info.unlink(missing_ok=True)
        return data if data.exists() else None

    def remove(self, slot: str) -> None:
        """Forgets ``slot`` (on disk too; absent is fine)."""
        data = self.retire(slot)
        if data is not None:
            data.unlink(missing_ok=True)

    def meta(self, slot: str) -> dict[str, Any]:
        try:
            return json.loads(self._paths(slot)[1].read_text())
        except (OSError, ValueError):
            return {}

    def wipe(self) -> None:
        """A new machine: nothing stored."""
        self._cache.clear()
        for child in self.root.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()


def _intact(array: np.ndarray, meta: dict[str, Any]) -> bool:
    """Whether ``array`` is what its slot's description recorded (:func:`array_digest`, or
    the dtype, shape and :func:`bytes_digest` of an adopted batch)."""
    if "bytes_sha256" in meta:
        return (
            array.dtype.str == meta.get("dtype")
            and list(array.shape) == list(meta.get("shape", ()))
            and bytes_digest(array).hex() == meta["bytes_sha256"]
        )
    return array_digest(array).hex() == meta.get("digest")


def _read(path: Path, mapped: bool) -> np.ndarray:
    """``np.load`` of ``path``, memory-mapped read-only where asked (an empty array, which
    cannot be mapped, is read)."""
    if mapped:
        array = np.load(path, mmap_mode="r")
        if array.size:
            return array
    return np.load(path)
