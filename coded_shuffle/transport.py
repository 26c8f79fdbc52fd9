"""The shared broadcast link on torch.distributed: framed messages in bounded chunks.

A thin layer between the math (plans, codec) and the process group: the master sends a
``(n, w)`` uint8 tensor of rows (coded symbols, placement points, digests) as messages of at
most ``chunk_bytes`` payload; every message is ``header + payload`` in one ``broadcast``.
The header (:data:`HEADER`) carries epoch, part, kind, first row, row count, row bytes and the
SHA-256 of the payload; receivers check every field against what they derived themselves and
fail loudly (:class:`~coded_shuffle.errors.VerificationError`) on any difference.

Every byte of every message is counted (design section 1, "bytes on the link = load * point
bytes plus padding and framing"); :class:`LinkStats` also counts what gloo's binomial-tree
broadcast moves between processes (each message crosses ``P - 1`` process links).

The math modules (plan, codec, decoder, delivery, schemes) never import this module.
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import UsageError, VerificationError

# epoch u32, part u16, kind u16, first row u32, row count u32, row bytes u32, SHA-256 of payload
HEADER = struct.Struct("<IHHIII32s")
HEADER_BYTES = HEADER.size  # 52

KIND_META = 0  # data set shape (points, features, classes, point bytes, dropped points)
KIND_PLACEMENT = 1  # whole points of the first epoch's (uncoded) placement
KIND_SYMBOLS = 2  # coded symbols of one byte part
KIND_DIGESTS = 3  # SHA-256 of every worker's new batch
KIND_NAMES = {KIND_META: "meta", KIND_PLACEMENT: "placement", KIND_SYMBOLS: "symbols"}
KIND_NAMES[KIND_DIGESTS] = "digests"

DEFAULT_CHUNK_BYTES = 1 << 20

Broadcast = Callable[[torch.Tensor], None]


@dataclass(frozen=True)
class Header:
    """One message header; :meth:`pack` gives its :data:`HEADER_BYTES` wire bytes."""

    epoch: int
    part: int
    kind: int
    first: int
    count: int
    row_bytes: int
    digest: bytes = b"\0" * 32

    def pack(self) -> bytes:
        return HEADER.pack(
            self.epoch, self.part, self.kind, self.first, self.count, self.row_bytes, self.digest
        )

    @classmethod
    def unpack(cls, raw: bytes) -> Header:
        return cls(*HEADER.unpack(raw))

    def describe(self) -> str:
        kind = KIND_NAMES.get(self.kind, str(self.kind))
        return (
            f"epoch {self.epoch} part {self.part} {kind} rows {self.first}.."
            f"{self.first + self.count} x {self.row_bytes} B"
        )


def rows_per_message(row_bytes: int, chunk_bytes: int) -> int:
    """Rows in one message: as many as fit in ``chunk_bytes`` of payload (at least one)."""
    if chunk_bytes < 1:
        raise UsageError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    return max(1, chunk_bytes // max(row_bytes, 1))


def message_ranges(num_rows: int, row_bytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``(first, count)`` of every message that carries ``num_rows`` rows (none if zero)."""
    step = rows_per_message(row_bytes, chunk_bytes)
    return [(a, min(step, num_rows - a)) for a in range(0, num_rows, step)]


def framed_bytes(num_rows: int, row_bytes: int, chunk_bytes: int) -> int:
    """Bytes on the link for ``num_rows`` rows: payload plus one header per message."""
    messages = len(message_ranges(num_rows, row_bytes, chunk_bytes))
    return num_rows * row_bytes + messages * HEADER_BYTES


def framed_parts_bytes(rows: list[int], row_bytes: list[int], chunk_bytes: int) -> int:
    """:func:`framed_bytes` summed over the parts of a delivery (one message stream each)."""
    return sum(framed_bytes(n, b, chunk_bytes) for n, b in zip(rows, row_bytes, strict=True))


def payload_digest(payload: torch.Tensor) -> bytes:
    """SHA-256 of a contiguous uint8 tensor's bytes."""
    return hashlib.sha256(payload.contiguous().numpy().tobytes()).digest()


@dataclass
class LinkStats:
    """What crossed the link since the last :meth:`reset` (counted by every endpoint)."""

    messages: int = 0
    header_bytes: int = 0
    payload_bytes: int = 0
    tree_bytes: int = 0  # bytes gloo moved between processes: message bytes * (P - 1)
    seconds: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def link_bytes(self) -> int:
        """Bytes on the shared broadcast link: headers and payload (padding included)."""
        return self.header_bytes + self.payload_bytes

    def add(self, header: Header, payload_bytes: int, group_size: int, seconds: float) -> None:
        self.messages += 1
        self.header_bytes += HEADER_BYTES
        self.payload_bytes += payload_bytes
        self.tree_bytes += (HEADER_BYTES + payload_bytes) * max(group_size - 1, 0)
        self.seconds += seconds
        kind = KIND_NAMES.get(header.kind, str(header.kind))
        self.by_kind[kind] = self.by_kind.get(kind, 0) + HEADER_BYTES + payload_bytes


def dist_broadcast(group=None, src: int = 0) -> tuple[Broadcast, int]:
    """A gloo broadcast from ``src`` over ``group`` and the group's size."""
    import torch.distributed as dist

    def broadcast(buf: torch.Tensor) -> None:
        dist.broadcast(buf, src=src, group=group)

    return broadcast, dist.get_world_size(group)


class Link:
    """One endpoint of the shared link: the master sends, every other rank receives."""

    def __init__(
        self,
        broadcast: Broadcast,
        group_size: int,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        rows_per_message(1, chunk_bytes)  # validates chunk_bytes
        self.broadcast = broadcast
        self.group_size = group_size
        self.chunk_bytes = chunk_bytes
        self.stats = LinkStats()

    def take_stats(self) -> LinkStats:
        """The counts since the last call; counting starts again from zero."""
        done, self.stats = self.stats, LinkStats()
        return done

    def send(self, rows: torch.Tensor, epoch: int, part: int, kind: int) -> None:
        """Master: broadcasts ``rows`` (``(n, w)`` uint8) as framed messages."""
        n, w = rows.shape
        for first, count in message_ranges(n, w, self.chunk_bytes):
            payload = rows[first : first + count].contiguous()
            header = Header(epoch, part, kind, first, count, w, payload_digest(payload))
            buf = torch.empty(HEADER_BYTES + count * w, dtype=torch.uint8)
            buf[:HEADER_BYTES] = torch.frombuffer(bytearray(header.pack()), dtype=torch.uint8)
            buf[HEADER_BYTES:] = payload.view(-1)
            self._move(buf, header)

    def receive(
        self,
        num_rows: int,
        row_bytes: int,
        epoch: int,
        part: int,
        kind: int,
        keep: np.ndarray | None = None,
    ) -> torch.Tensor:
        """Worker: the rows the master sends (only the sorted row ids ``keep``, if given).

        The worker derived ``num_rows`` and ``row_bytes`` itself (shared seed); every header
        and payload digest is checked against that derivation.
        """
        keep_sorted = None if keep is None else np.asarray(keep, dtype=np.int64)
        if keep_sorted is not None and keep_sorted.size:
            if np.any(np.diff(keep_sorted) <= 0) or keep_sorted[0] < 0:
                raise ValueError("keep must be sorted, unique, non-negative row ids")
            if keep_sorted[-1] >= num_rows:
                raise ValueError(f"keep row {int(keep_sorted[-1])} out of range 0..{num_rows - 1}")
        out_rows = num_rows if keep_sorted is None else keep_sorted.size
        out = torch.empty((out_rows, row_bytes), dtype=torch.uint8)
        for first, count in message_ranges(num_rows, row_bytes, self.chunk_bytes):
            expected = Header(epoch, part, kind, first, count, row_bytes)
            buf = torch.empty(HEADER_BYTES + count * row_bytes, dtype=torch.uint8)
            self._move(buf, expected)
            payload = self._check(buf, expected).view(count, row_bytes)
            if keep_sorted is None:
                out[first : first + count] = payload
            else:
                lo, hi = np.searchsorted(keep_sorted, [first, first + count])
                if hi > lo:
                    local = torch.from_numpy(keep_sorted[lo:hi] - first)
                    out[lo:hi] = payload.index_select(0, local)
        return out

    def _move(self, buf: torch.Tensor, header: Header) -> None:
        t0 = time.perf_counter()
        self.broadcast(buf)
        seconds = time.perf_counter() - t0
        self.stats.add(header, buf.numel() - HEADER_BYTES, self.group_size, seconds)

    @staticmethod
    def _check(buf: torch.Tensor, expected: Header) -> torch.Tensor:
        got = Header.unpack(buf[:HEADER_BYTES].numpy().tobytes())
        if (got.epoch, got.part, got.kind, got.first, got.count, got.row_bytes) != (
            expected.epoch,
            expected.part,
            expected.kind,
            expected.first,
            expected.count,
            expected.row_bytes,
        ):
            raise VerificationError(
                f"message header mismatch: expected {expected.describe()}, got {got.describe()} "
                "(master and worker derived different plans)"
            )
        payload = buf[HEADER_BYTES:]
        if payload_digest(payload) != got.digest:
            raise VerificationError(f"payload digest mismatch in {got.describe()}")
        return payload
