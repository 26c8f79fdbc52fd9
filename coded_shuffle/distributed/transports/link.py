"""The link: rows framed into messages, routed by the transport's rule, checked on receipt.

:class:`Link` sits between the byte layer (symbols, placement rows) and a :class:`Transport`.
Every rank calls :meth:`Link.deliver` with what it derived from the shared seed (the row count,
the row size and the :class:`Routes`); the rows themselves come from the rank that sends them.
Under ``broadcast`` routing every worker hears every message and keeps the rows it needs; under
``master`` and ``peers`` routing each worker gets one stream per sender with only its own rows.
Every header field and every payload digest is checked on receipt
(:func:`~coded_shuffle.distributed.transports.framing.check`).

A link may hold a second transport for the uncoded placement (``placement``): where the coded
epochs broadcast, the placement still puts each point only where it goes (``unicast``), so no
worker takes in, and drops, the other workers' points.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from coded_shuffle.costs.wire import message_keepers, message_sizes
from coded_shuffle.distributed import faults
from coded_shuffle.distributed.transports.base import HostBytes, Stream, Transport
from coded_shuffle.distributed.transports.framing import (
    KIND_PLACEMENT,
    Inbox,
    RowSource,
    frame,
    frame_parts,
    message_ranges,
    pick_rows,
)


@dataclass(frozen=True)
class Routes:
    """Which rows each worker needs, and which rank sends each of them.

    ``needs[k]``: sorted row ids that worker ``k`` (rank ``k + 1``) must receive (``None`` where
    this rank does not know it: a worker under ``broadcast`` routing knows only its own).
    ``senders[k]``: the sending rank of each of those rows; ``None``: the master sends all.
    """

    needs: tuple[np.ndarray | None, ...]
    senders: tuple[np.ndarray, ...] | None = None

    def sender_rows(self, worker: int, sender: int) -> np.ndarray:
        """Positions in ``needs[worker]`` of the rows that ``sender`` sends to it."""
        need = self.needs[worker]
        assert need is not None
        if self.senders is None:
            return np.arange(need.size) if sender == 0 else np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.senders[worker] == sender)

    def rows_from(self, sender: int) -> np.ndarray:
        """Every row ``sender`` sends to any worker (sorted, each once)."""
        assert self.senders is not None
        sent = [
            n[s == sender] for n, s in zip(self.needs, self.senders, strict=True) if n is not None
        ]
        return np.unique(np.concatenate(sent)) if sent else np.zeros(0, dtype=np.int64)

    def sources(self, worker: int) -> list[int]:
        """The ranks that send to ``worker`` (sorted)."""
        if self.senders is None:
            return [0]
        return sorted(int(s) for s in np.unique(self.senders[worker]))


class Link:
    """One rank's end of the link: frames, routes and checks; the transport moves the bytes."""

    def __init__(
        self,
        transport: Transport,
        chunk_bytes: int,
        on_progress: Callable[[int, int], None] | None = None,
        placement: Transport | None = None,
    ) -> None:
        message_ranges(1, 1, chunk_bytes)  # validates chunk_bytes
        self.transport = transport
        self.peer = transport.peer  # this rank's place in the job (role, group, roles)
        self.placement = placement  # what carries the placement's rows (None: ``transport``)
        self.chunk_bytes = chunk_bytes
        self.on_progress = on_progress  # (bytes this rank moved, its total) after each message
        self.seconds = 0.0
        self.modelled: int | None = None  # the master's: network bytes by the transport's model

    def behind_training(self, background: bool) -> None:
        """Whether the deliveries that follow run behind a training loop (prefetched): the
        transports that pace themselves leave the loop part of the link
        (:attr:`Transport.background`)."""
        for t in (self.transport, self.placement):
            if t is not None:
                t.background = background

    def take_counts(self) -> tuple[HostBytes, float]:
        """This host's bytes and the seconds spent moving them, since the last call."""
        seconds, self.seconds = self.seconds, 0.0
        counts = self.transport.take_counts()
        if self.placement is not None:
            counts.add(self.placement.take_counts())
        return counts, seconds

    def carrier(self, kind: int) -> Transport:
        """The transport that carries a stream of ``kind`` (the placement's, or the link's)."""
        if kind == KIND_PLACEMENT and self.placement is not None:
            return self.placement
        return self.transport

    def scratch_shapes(self, kind: int, num_rows: int, row_bytes: int) -> list[tuple[int, int]]:
        """The rows the carrier of ``kind`` takes from its buffers for a stream of
        ``num_rows`` rows of ``row_bytes`` from the master (:meth:`Transport.scratch_shapes`)."""
        t = self.carrier(kind)
        if t.routing != "broadcast":
            return []
        return t.scratch_shapes(sum(message_sizes(num_rows, row_bytes, self.chunk_bytes)))

    def close(self) -> None:
        self.transport.close()
        if self.placement is not None:
            self.placement.close()

    def take_modelled(self) -> int | None:
        """The network bytes the transport's byte model gives the master's deliveries since
        the last call (None where the transport has no per-delivery model)."""
        done, self.modelled = self.modelled, None
        return done

    def deliver(
        self,
        *,
        epoch: int,
        part: int,
        kind: int,
        num_rows: int,
        row_bytes: int,
        routes: Routes,
        rows: torch.Tensor | RowSource | None = None,
        row_ids: np.ndarray | None = None,
        out: torch.Tensor | None = None,
        on_rows: Callable[[int, int], None] | None = None,
    ) -> torch.Tensor | None:
        """Moves one stream of rows; a worker gets its ``needs`` rows back, in order.

        ``rows`` are the rows this rank sends: all ``num_rows`` rows at the master (``row_ids``
        None; a :class:`RowSource` produces them message by message as they are sent), or the
        rows ``row_ids`` (sorted) at a worker that sends under ``peers`` routing. A worker's
        rows land in ``out`` (fresh rows if None); ``on_rows(lo, hi)`` is told, as messages arrive
        (in any order), that rows ``lo .. hi - 1`` of them are in (when they come from the
        master alone).
        """
        t0 = time.perf_counter()
        header = (epoch, part, kind)
        t = self.carrier(kind)
        from_master = routes.senders is None
        if t.routing == "broadcast" or (t.shares_medium and from_master):
            out = self._broadcast(t, header, num_rows, row_bytes, routes, rows, out, on_rows)
        elif t.shares_medium:
            out = self._shared(t, header, row_bytes, routes, rows, row_ids, out, on_rows)
        else:
            out = self._routed(t, header, row_bytes, routes, rows, row_ids, out, on_rows)
        self.seconds += time.perf_counter() - t0
        return out

    def _frame(
        self, t: Transport, rows: torch.Tensor | RowSource, header: tuple[int, int, int]
    ) -> Iterator:
        """The messages of ``rows``: joined and digested, or as :class:`Parts` for a
        transport that sends them without a copy (``zero_copy``); each message's rows past
        this process's planted fault, if any (:func:`~coded_shuffle.distributed.faults.
        outgoing`: the same path either way)."""
        hook = faults.outgoing(header[0])
        if t.zero_copy:
            return frame_parts(rows, *header, self.chunk_bytes, hook=hook)
        return frame(rows, *header, self.chunk_bytes, digest=t.digests, hook=hook)

    @staticmethod
    def _targets(t: Transport, target: Callable[[int, int], torch.Tensor | None] | None) -> dict:
        """``exchange``'s ``targets`` keyword for a ``zero_copy`` transport (none otherwise):
        where each message's payload may be received in place."""
        return {"targets": target} if t.zero_copy else {}

    def _broadcast(
        self,
        t: Transport,
        header: tuple[int, int, int],
        num_rows: int,
        row_bytes: int,
        routes: Routes,
        rows: torch.Tensor | RowSource | None,
        out: torch.Tensor | None,
        on_rows: Callable[[int, int], None] | None,
    ) -> torch.Tensor | None:
        workers = t.peer.workers
        stream = Stream(0, workers, tuple(message_sizes(num_rows, row_bytes, self.chunk_bytes)))
        meter = _Meter(stream.total, self.on_progress)
        if self.peer.rank == 0:
            assert rows is not None and tuple(rows.shape) == (num_rows, row_bytes)
            outgoing = {0: meter.count(self._frame(t, rows, header))}
            extra = self._targets(t, None)
            needs = [n for n in routes.needs if n is not None]
            if t.prunes and len(needs) == len(routes.needs):
                keepers = message_keepers(needs, num_rows, row_bytes, self.chunk_bytes)
                extra["keepers"] = [keepers]
                modelled = t.network_bytes(stream, keepers)
                if modelled is not None:
                    self.modelled = (self.modelled or 0) + modelled
            t.exchange([stream], outgoing, _refuse, **extra)
            return None
        keep = routes.needs[self.peer.rank - 1]
        assert keep is not None
        out = _buffer(out, keep.size, row_bytes)
        inbox = Inbox(
            header,
            num_rows,
            row_bytes,
            self.chunk_bytes,
            keep,
            out,
            np.arange(keep.size),
            on_rows,
            checksums=t.digests,
            skips=t.prunes,
        )
        sizes = stream.sizes

        def on_message(_: int, i: int, msg: torch.Tensor) -> None:
            inbox.receive(i, msg)
            meter.add(sizes[i])

        extra = self._targets(t, lambda _, i: inbox.target(i))
        if t.prunes:
            extra["keepers"] = [inbox.kept_messages()]
        t.exchange([stream], {}, on_message, **extra)
        inbox.complete()
        return out

    def _routed(
        self,
        t: Transport,
        header: tuple[int, int, int],
        row_bytes: int,
        routes: Routes,
        rows: torch.Tensor | RowSource | None,
        row_ids: np.ndarray | None,
        out: torch.Tensor | None,
        on_rows: Callable[[int, int], None] | None,
    ) -> torch.Tensor | None:
        me = self.peer.rank
        mine = routes.needs[me - 1] if me > 0 else None
        out = None if mine is None else _buffer(out, mine.size, row_bytes)
        if routes.senders is not None:
            on_rows = None  # rows from several senders: none is complete before the end
        streams: list[Stream] = []
        outgoing: dict[int, Iterator[torch.Tensor]] = {}
        inboxes: dict[int, Inbox] = {}
        for k, need in enumerate(routes.needs):
            if need is None:
                continue
            for src in routes.sources(k):
                if src != me and k + 1 != me:
                    continue
                pos = routes.sender_rows(k, src)
                if pos.size == 0:
                    continue
                index = len(streams)
                sizes = tuple(message_sizes(pos.size, row_bytes, self.chunk_bytes))
                streams.append(Stream(src, (k + 1,), sizes))
                if src == me:
                    outgoing[index] = self._sent(t, header, rows, row_ids, need[pos])
                else:
                    assert out is not None
                    every = np.arange(pos.size, dtype=np.int64)
                    inboxes[index] = self._inbox(t, header, row_bytes, every, out, pos, on_rows)
        self._exchange(t, streams, outgoing, inboxes)
        return out

    def _sent(
        self,
        t: Transport,
        header: tuple[int, int, int],
        rows: torch.Tensor | RowSource | None,
        row_ids: np.ndarray | None,
        ids: np.ndarray,
    ) -> Iterator:
        """The messages of the rows ``ids`` this rank sends (``rows`` holds all rows, or the
        rows ``row_ids`` of a worker sending under ``peers`` routing)."""
        assert rows is not None
        local = ids if row_ids is None else np.searchsorted(row_ids, ids)
        return self._frame(t, pick_rows(rows, local), header)

    def _inbox(
        self,
        t: Transport,
        header: tuple[int, int, int],
        row_bytes: int,
        keep: np.ndarray,
        out: torch.Tensor,
        dest: np.ndarray,
        on_ready: Callable[[int, int], None] | None,
        num_rows: int | None = None,
    ) -> Inbox:
        """Where a stream of ``num_rows`` rows (default: as many as are kept) lands: its rows
        ``keep`` into ``out``'s rows ``dest``."""
        rows = keep.size if num_rows is None else num_rows
        chunk = self.chunk_bytes
        return Inbox(header, rows, row_bytes, chunk, keep, out, dest, on_ready, checksums=t.digests)

    def _exchange(
        self,
        t: Transport,
        streams: list[Stream],
        outgoing: dict[int, Iterator[torch.Tensor]],
        inboxes: dict[int, Inbox],
    ) -> None:
        """Moves ``streams`` (this rank sends ``outgoing``, receives into ``inboxes``, in place
        where the transport can), counting the bytes of the streams it takes part in."""
        me = self.peer.rank
        mine = sum(s.total for s in streams if me in s.dsts or s.src == me)
        meter = _Meter(mine, self.on_progress)
        outgoing = {i: meter.count(msgs) for i, msgs in outgoing.items()}

        def on_message(s: int, i: int, msg: torch.Tensor) -> None:
            inboxes[s].receive(i, msg)
            meter.add(streams[s].sizes[i])

        targets = self._targets(t, lambda s, i: inboxes[s].target(i))
        t.exchange(streams, outgoing, on_message, **targets)
        for inbox in inboxes.values():
            inbox.complete()

    def _shared(
        self,
        t: Transport,
        header: tuple[int, int, int],
        row_bytes: int,
        routes: Routes,
        rows: torch.Tensor | RowSource | None,
        row_ids: np.ndarray | None,
        out: torch.Tensor | None,
        on_rows: Callable[[int, int], None] | None,
    ) -> torch.Tensor | None:
        """Rows between the workers on a shared medium: one stream per sender with every row
        it sends, heard by every other worker, each keeping its own (every rank passes every
        stream, in sender order). Where a worker's rows come sender by sender (their senders
        ascend with their ids), ``on_rows`` hears of each sender's as they arrive."""
        me, workers = self.peer.rank, len(routes.needs)
        mine = routes.needs[me - 1] if me > 0 else None
        out = None if mine is None else _buffer(out, mine.size, row_bytes)
        if mine is not None and np.any(np.diff(routes.senders[me - 1]) < 0):
            on_rows = None  # not sender by sender: no prefix is complete before the end
        streams: list[Stream] = []
        outgoing: dict[int, Iterator[torch.Tensor]] = {}
        inboxes: dict[int, Inbox] = {}
        for src in range(1, workers + 1):
            ids = routes.rows_from(src)
            if ids.size == 0:
                continue
            index = len(streams)
            sizes = tuple(message_sizes(ids.size, row_bytes, self.chunk_bytes))
            others = tuple(r for r in range(1, workers + 1) if r != src)
            streams.append(Stream(src, others, sizes))
            if src == me:
                outgoing[index] = self._sent(t, header, rows, row_ids, ids)
            elif mine is not None:
                assert out is not None
                pos = routes.sender_rows(me - 1, src)
                keep = np.searchsorted(ids, mine[pos])
                ready = None
                if on_rows is not None and pos.size:
                    base = int(pos[0])
                    ready = lambda lo, hi, base=base: on_rows(base + lo, base + hi)  # noqa: E731
                inbox = self._inbox(t, header, row_bytes, keep, out, pos, ready, ids.size)
                inboxes[index] = inbox
        self._exchange(t, streams, outgoing, inboxes)
        return out


class _Meter:
    """Bytes this rank moved in one delivery, reported after every message (progress lines)."""

    def __init__(self, total: int, report: Callable[[int, int], None] | None) -> None:
        self.total, self.done, self.report = total, 0, report

    def add(self, nbytes: int) -> None:
        self.done += nbytes
        if self.report is not None:
            self.report(self.done, self.total)

    def count(self, messages: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
        for m in messages:
            yield m
            self.add(m.numel())


def _buffer(out: torch.Tensor | None, rows: int, row_bytes: int) -> torch.Tensor:
    """``out`` checked for shape, or fresh ``(rows, row_bytes)`` uint8 rows."""
    if out is None:
        return torch.empty((rows, row_bytes), dtype=torch.uint8)
    if tuple(out.shape) != (rows, row_bytes) or not out.is_contiguous():
        raise ValueError(
            f"receive buffer of shape {tuple(out.shape)}, expected {(rows, row_bytes)}"
        )
    return out


def _refuse(stream: int, index: int, message: torch.Tensor) -> None:
    raise RuntimeError(f"the master received message {index} of stream {stream}")
