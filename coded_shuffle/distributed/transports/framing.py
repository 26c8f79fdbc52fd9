"""Message framing: rows cut into messages of bounded size, each ``header + payload``.

The header (:data:`HEADER`, 24 bytes) carries epoch, part, kind, first row, row count, row
bytes and the CRC-32 of the payload. A receiver derives every field itself (shared seed) and
:func:`check` compares all seven; any difference fails loudly with
:class:`~coded_shuffle.errors.VerificationError`. Every transport moves these messages, so
every byte of every header is counted on every link it crosses.

The CRC catches a message that was damaged, cut or put in the wrong place on its way (at
about 4 GB/s per core, where SHA-256 ran at 1.5 and was the largest cost of a worker on a fast
link); the cryptographic check is end to end: every worker's decoded batch is compared with the
master's SHA-256 (:mod:`~coded_shuffle.distributed.reports`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from coded_shuffle.codec.buffers import payload_rows
from coded_shuffle.codec.kernel import copy_rows
from coded_shuffle.costs.wire import (  # the sizes' one home, torch-free
    HEADER_BYTES,
    HEADER_FORMAT,
    message_ranges,
)
from coded_shuffle.errors import VerificationError

HEADER = struct.Struct(HEADER_FORMAT)

KIND_PLACEMENT = 1  # whole points of the first epoch's (uncoded) placement
KIND_SYMBOLS = 2  # coded symbols of one byte part
KIND_NAMES = {KIND_PLACEMENT: "placement", KIND_SYMBOLS: "symbols"}


@dataclass(frozen=True)
class Header:
    """One message header; :meth:`pack` gives its :data:`HEADER_BYTES` wire bytes."""

    epoch: int
    part: int
    kind: int
    first: int
    count: int
    row_bytes: int
    checksum: int = 0

    def pack(self) -> bytes:
        return HEADER.pack(
            self.epoch, self.part, self.kind, self.first, self.count, self.row_bytes, self.checksum
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


def payload_checksum(payload: torch.Tensor) -> int:
    """CRC-32 (zlib) of a contiguous uint8 payload."""
    return zlib.crc32(payload.numpy())


class RowSource(Protocol):
    """Rows produced on demand (a streaming encoder): ``rows(first, count, out)`` writes rows
    ``first .. first + count`` into ``out``."""

    shape: tuple[int, int]

    def rows(self, first: int, count: int, out: torch.Tensor | None = None) -> torch.Tensor: ...


class PickedRows:
    """The rows ``ids`` of ``rows`` as a :class:`RowSource`: each message's rows are copied
    straight into its payload, with no whole copy of the picked rows first."""

    def __init__(self, rows: torch.Tensor | np.ndarray, ids: np.ndarray) -> None:
        self.src = rows.numpy() if isinstance(rows, torch.Tensor) else rows
        self.ids = ids
        self.shape = (ids.size, self.src.shape[1])

    def rows(self, first: int, count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            out = torch.empty((count, self.shape[1]), dtype=torch.uint8)
        where = np.arange(count, dtype=np.int64)
        copy_rows(out.numpy(), where, self.src, self.ids[first : first + count])
        return out

    def pick(self, ids: np.ndarray) -> PickedRows:
        return PickedRows(self.src, self.ids[ids])


def pick_rows(rows: torch.Tensor | RowSource, ids: np.ndarray) -> RowSource:
    """The rows ``ids`` of ``rows``, in that order, produced as they are sent: picked from a
    tensor or a source that picks (records, a gathering encoder), else from all its rows."""
    if isinstance(rows, torch.Tensor):
        return PickedRows(rows, ids)
    if hasattr(rows, "pick"):
        return rows.pick(ids)
    return PickedRows(rows.rows(0, rows.shape[0]), ids)  # an encoder of rows in memory


RowsHook = Callable[[int, torch.Tensor], torch.Tensor | None]
"""``(first, rows)``: the rows ``first ..`` of one message about to be framed, where they are
(not to be written); the rows to send instead, or None (a planted fault:
:mod:`~coded_shuffle.distributed.faults`)."""


def _hooked(hook: RowsHook | None, first: int, rows: torch.Tensor) -> torch.Tensor | None:
    """What ``hook`` sends instead of ``rows`` (None: them, or no hook)."""
    return None if hook is None else hook(first, rows)


def frame(
    rows: torch.Tensor | RowSource,
    epoch: int,
    part: int,
    kind: int,
    chunk_bytes: int,
    digest: bool = True,
    hook: RowsHook | None = None,
) -> Iterator[torch.Tensor]:
    """``(n, w)`` uint8 rows as messages (header + payload), one uint8 tensor each; the
    header carries the payload's CRC-32 where ``digest`` (else 0: nothing checks it), of the
    rows ``hook`` sends instead where it does (the digest covers what is sent).

    Lazy: a transport can send the first message while the next ones are framed. From a
    :class:`RowSource`, every message's rows are produced straight into its payload when it
    is framed (the master encodes while earlier messages are on the link).
    """
    n, w = rows.shape
    for first, count in message_ranges(n, w, chunk_bytes):
        buf = payload_rows(1, HEADER_BYTES + count * w).view(-1)
        payload = buf[HEADER_BYTES:]
        if isinstance(rows, torch.Tensor):
            payload.copy_(rows[first : first + count].reshape(-1))
        else:
            rows.rows(first, count, out=payload.view(count, w))
        instead = _hooked(hook, first, payload.view(count, w))
        if instead is not None:
            payload.view(count, w).copy_(instead)
        checksum = payload_checksum(payload) if digest else 0
        header = Header(epoch, part, kind, first, count, w, checksum)
        buf[:HEADER_BYTES] = torch.frombuffer(bytearray(header.pack()), dtype=torch.uint8)
        yield buf


@dataclass(frozen=True)
class Parts:
    """A message as its header and its payload, unjoined: the ``socket`` plane sends both in
    one ``sendmsg``, the payload straight from the rows where they are contiguous."""

    header: bytes
    payload: torch.Tensor

    def numel(self) -> int:
        return len(self.header) + self.payload.numel()


def frame_parts(
    rows: torch.Tensor | RowSource,
    epoch: int,
    part: int,
    kind: int,
    chunk_bytes: int,
    hook: RowsHook | None = None,
) -> Iterator[Parts]:
    """:func:`frame`'s messages as :class:`Parts`, without a payload digest (the plane's
    links carry TCP's checksum, the batch its SHA-256) and without a copy of tensor rows
    (but of those ``hook`` sends instead)."""
    n, w = rows.shape
    for first, count in message_ranges(n, w, chunk_bytes):
        if isinstance(rows, torch.Tensor) and rows.is_contiguous():
            payload = rows[first : first + count].reshape(-1)
        else:
            payload = payload_rows(count, w).view(-1)
            if isinstance(rows, torch.Tensor):
                payload.view(count, w).copy_(rows[first : first + count])
            else:
                rows.rows(first, count, out=payload.view(count, w))
        instead = _hooked(hook, first, payload.view(count, w))
        if instead is not None:
            payload = instead.reshape(-1).contiguous()
        yield Parts(Header(epoch, part, kind, first, count, w).pack(), payload)


def check_header(raw: torch.Tensor, expected: Header) -> Header:
    """The header in ``raw`` (its first bytes) after every field but the digest was checked."""
    got = Header.unpack(raw[:HEADER_BYTES].numpy().tobytes())
    fields = ("epoch", "part", "kind", "first", "count", "row_bytes")
    wrong = [f for f in fields if getattr(got, f) != getattr(expected, f)]
    if wrong:
        raise VerificationError(
            f"message header mismatch ({', '.join(wrong)}): expected {expected.describe()}, "
            f"got {got.describe()} (master and worker derived different plans, or messages "
            "were reordered)"
        )
    return got


def check(message: torch.Tensor, expected: Header, checksum: bool = True) -> torch.Tensor:
    """The payload of ``message`` after every header field and (``checksum``) the digest were
    checked."""
    got = check_header(message, expected)
    payload = message[HEADER_BYTES:]
    if payload.numel() != expected.count * expected.row_bytes:
        raise VerificationError(
            f"message of {payload.numel()} payload bytes, expected "
            f"{expected.count * expected.row_bytes} in {expected.describe()}"
        )
    if checksum and payload_checksum(payload) != got.checksum:
        raise VerificationError(f"payload checksum (CRC-32) mismatch in {got.describe()}")
    return payload


class Inbox:
    """Checks the messages of one stream as they arrive and puts the kept rows in place.

    The stream carries ``num_rows`` rows; ``keep`` are the (sorted) stream rows to keep and
    ``dest`` their rows in ``out``. :meth:`receive` is called once per message, in any order
    (a multicast receiver hands on the messages past a lost datagram before it is repaired),
    and ``on_ready(lo, hi)`` told that rows ``lo .. hi - 1`` of ``out`` are in; with ``skips``,
    a message this rank keeps no row of may not come (a chain relay forwards only what is kept
    further on). :meth:`complete` fails naming a message that did not come.
    """

    def __init__(
        self,
        header: tuple[int, int, int],
        num_rows: int,
        row_bytes: int,
        chunk_bytes: int,
        keep: np.ndarray,
        out: torch.Tensor,
        dest: np.ndarray,
        on_ready: Callable[[int, int], None] | None = None,
        checksums: bool = True,
        skips: bool = False,
    ) -> None:
        self.header, self.row_bytes, self.checksums = header, row_bytes, checksums
        self.skips = skips
        self.in_place: set[int] = set()  # messages whose payload was received into ``out``
        self.ranges = message_ranges(num_rows, row_bytes, chunk_bytes)
        self.keep, self.out, self.dest = keep, out.numpy(), dest
        # kept rows before every message (and all of them last): message i keeps i..i+1
        firsts = np.array([first for first, _ in self.ranges] + [num_rows], dtype=np.int64)
        self.kept = np.searchsorted(keep, firsts).tolist()
        self.on_ready = on_ready
        self.got = np.zeros(len(self.ranges), dtype=bool)  # the messages received

    def target(self, index: int) -> torch.Tensor | None:
        """Where message ``index``'s payload can be received in place: its rows in ``out``
        when this rank keeps all of them, in order and next to each other (else None: the
        message arrives in a buffer of its own and the kept rows are copied from it)."""
        count = self.ranges[index][1]
        lo, hi = self.kept[index], self.kept[index + 1]
        rows = self.dest[lo:hi]
        if hi - lo != count or (count > 1 and not np.all(np.diff(rows) == 1)):
            return None
        self.in_place.add(index)
        start = int(rows[0])
        return torch.from_numpy(self.out[start : start + count].reshape(-1))

    def kept_messages(self) -> np.ndarray:
        """Bools, one per message: whether this rank keeps a row of it."""
        return np.diff(np.asarray(self.kept, dtype=np.int64)) > 0

    def receive(self, index: int, message: torch.Tensor) -> None:
        """Message ``index`` checked and its kept rows put in place (``message``: the header
        alone where its payload was received in place, at :meth:`target`)."""
        if not 0 <= index < len(self.ranges) or self.got[index]:
            again = "again" if 0 <= index < len(self.ranges) else "out of range"
            raise VerificationError(
                f"message {index} of {len(self.ranges)} arrived {again} in epoch "
                f"{self.header[0]} part {self.header[1]}"
            )
        first, count = self.ranges[index]
        expected = Header(*self.header, first, count, self.row_bytes)
        lo, hi = self.kept[index], self.kept[index + 1]
        if index in self.in_place:
            check_header(message, expected)
        else:  # the digest only where rows are kept: a relay's next hop checks the rest
            checksum = self.checksums and hi > lo
            payload = check(message, expected, checksum).view(count, self.row_bytes)
            copy_rows(self.out, self.dest[lo:hi], payload.numpy(), self.keep[lo:hi] - first)
        self.got[index] = True
        if self.on_ready is not None:
            self.on_ready(int(lo), int(hi))

    def complete(self) -> None:
        """Fails naming the first message that did not come (with ``skips``: the first one
        this rank keeps a row of)."""
        missing = ~self.got
        if self.skips:
            missing &= self.kept_messages()
        if not missing.any():
            return
        index = int(np.argmax(missing))
        where = f"epoch {self.header[0]} part {self.header[1]}"
        if self.skips:
            row = int(self.keep[self.kept[index]])
            raise VerificationError(
                f"message {index} of {where} did not arrive, and this rank keeps row {row} of it"
            )
        raise VerificationError(
            f"{int(self.got.sum())} of {len(self.ranges)} messages arrived in {where} "
            f"(message {index} did not)"
        )
