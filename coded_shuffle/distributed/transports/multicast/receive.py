"""A ``multicast`` receiver's round: what each read brings, sorted into the stream's slots.

A read holds one datagram or a run of them that the kernel coalesced (``UDP_GRO``,
:mod:`.batches`); a run is taken apart with array operations over its headers, a single
datagram by a plain header unpack. The common read (this round's data datagrams, full,
numbered one after the other, none held yet, and repair datagrams) is taken by
:mod:`.drain`'s compiled loop before it gets here, except where a debug knob is set.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from coded_shuffle.costs.wire import DGRAM_HEADER, DGRAM_HEADER_BYTES
from coded_shuffle.distributed.transports.base import HostBytes
from coded_shuffle.distributed.transports.multicast.batches import FLAG_END, headers, payloads
from coded_shuffle.distributed.transports.multicast.parity import FLAG_PARITY, Parity, is_repair


@dataclass
class Debug:
    """The debug knobs a receiver applies: ``drop`` (a share of datagrams discarded, drawn
    from ``rng``) and ``slow`` (seconds slept per datagram read)."""

    drop: float
    slow: float
    rng: np.random.Generator


@dataclass
class Round:
    """One receiver's round of one stream: the datagrams it holds (``have``), rebuilt by
    parity or received, and how many came late (an earlier round's or stream's)."""

    job: int
    stream: int
    rnd: int
    out: np.ndarray  # the stream's bytes, datagram ``i`` at ``i * d``
    have: np.ndarray
    parity: Parity
    counts: HostBytes
    debug: Debug
    count: int = 0
    received: int = 0
    late: int = 0
    rebuilt: int = 0
    ended: bool = False  # the sender's end of this round read: nothing more will come
    d: int = field(init=False)

    def __post_init__(self) -> None:
        self.d = self.parity.d
        self.count = int(self.have.sum())
        # this round's data datagram's header, its number 0
        head = (self.job, self.stream, 0, self.rnd, 0)
        self.head = np.array([head], dtype=DGRAM_HEADER).view(np.uint8)
        self.prefix = self.head[:12]  # the job and the stream

    def take(self, buffer: np.ndarray, nbytes: int, segment: int) -> None:
        """Every datagram of one read of ``nbytes`` (``segment`` bytes apart)."""
        if nbytes <= segment:
            self._one(buffer, nbytes)
        else:
            self._run(buffer, nbytes, segment)

    def _one(self, buffer: np.ndarray, nbytes: int) -> None:
        job, stream, seq, rnd, flags = buffer[:DGRAM_HEADER_BYTES].view(DGRAM_HEADER)[0].item()
        if job != self.job:
            self.counts.foreign += 1
            return
        if flags & FLAG_END:
            self._end(int(stream == self.stream and rnd == self.rnd))
            return
        if not self._current(stream, flags, rnd, 1):
            return
        if self.debug.drop and self.debug.rng.random() < self.debug.drop:
            return  # debug: this datagram is lost on the way
        self.counts.ingress += nbytes
        payload = buffer[DGRAM_HEADER_BYTES:nbytes]
        if flags & FLAG_PARITY:
            self._parity(seq, flags, payload)
        elif seq < self.have.size and not self.have[seq]:
            self.out[seq * self.d : seq * self.d + payload.size] = payload
            self.have[seq] = True
            self.count += 1
            self.received += 1

    def _end(self, ends: int) -> None:
        """``ends`` of the sender's ends of this round read (a header alone each): it ends, their
        bytes counted. An earlier round's end (read after its round ended with every datagram
        in) is not passed here: neither late nor lost."""
        self.ended |= ends > 0
        self.counts.ingress += ends * DGRAM_HEADER_BYTES

    def _current(self, stream: int, flags: int, rnd: int, k: int) -> bool:
        """False for a later stream's datagram (dropped) and an earlier one's (late, unless
        parity read after the end of its stream); counts one of an earlier round as late."""
        if self.debug.slow:
            time.sleep(self.debug.slow * k)  # debug: a receiver that cannot keep up
        if stream > self.stream:
            return False
        if stream != self.stream:
            self.late += not flags & FLAG_PARITY
            return False
        self.late += rnd < self.rnd  # an earlier round's, late (its bytes are still good)
        return True

    def _run(self, buffer: np.ndarray, nbytes: int, segment: int) -> None:
        if not self._in_order(buffer, nbytes, segment):
            self._any(buffer, nbytes, segment)

    def _keep(self, first: int, rows: np.ndarray, nbytes: int) -> None:
        """A read's data datagrams ``first``, ``first + 1``, ... (``rows``, full) into their
        slots; ``nbytes`` of the read counted."""
        m, d = rows.shape
        self.out[first * d : (first + m) * d].reshape(m, d)[:] = rows
        self.have[first : first + m] = True
        self.counts.ingress += nbytes
        self.count += m
        self.received += m

    def _in_order(self, buffer: np.ndarray, nbytes: int, segment: int) -> bool:
        """The common run, taken whole: this round's datagrams, full, one after the other,
        none held yet, and the repair datagrams among them (False, having taken nothing, for
        any other run)."""
        k, d = nbytes // segment, self.d
        if k * segment != nbytes or self.debug.drop or self.debug.slow:
            return False
        raw = np.ndarray((k, 12), dtype=np.uint8, buffer=buffer, strides=(segment, 1))
        head = headers(buffer, nbytes, segment)
        flags = head["flags"]
        data = flags == 0
        if not (
            (raw == self.prefix).all()
            and (head["round"] == self.rnd).all()
            and (data | is_repair(flags)).all()
        ):
            return False
        seq = head["seq"][data]
        m = seq.size
        first = int(seq[0]) if m else 0
        if m and (first + m > self.have.size or self.have[first : first + m].any()):
            return False
        if m and not (seq - first == np.arange(m, dtype=seq.dtype)).all():
            return False
        body = payloads(buffer, k, segment, d)
        self._keep(first, body if m == k else body[data], nbytes)
        for i in np.flatnonzero(~data):  # after the data: its window may lack fewer
            self._parity(int(head["seq"][i]), int(flags[i]), body[i])
        return True

    def _any(self, buffer: np.ndarray, nbytes: int, segment: int) -> None:
        """Any run: strangers', other streams' and rounds', repeated, parity, the stream's
        short last datagram, debug drops."""
        head = headers(buffer, nbytes, segment)
        k = head.size
        ours = head["job"] == self.job
        self.counts.foreign += int(k - ours.sum())
        if self.debug.slow:
            time.sleep(self.debug.slow * k)
        stream, flags = head["stream"], head["flags"]
        parity, end = (flags & FLAG_PARITY) != 0, (flags & FLAG_END) != 0
        mine = ours & ~end  # an end carries no data
        self.late += int((mine & (stream < self.stream) & ~parity).sum())
        now = mine & (stream == self.stream)
        self.late += int((now & (head["round"] < self.rnd)).sum())
        this_round = ours & (stream == self.stream) & (head["round"] == self.rnd)
        self._end(int((end & this_round).sum()))
        if self.debug.drop:
            now &= self.debug.rng.random(k) >= self.debug.drop
        sizes = np.full(k, segment)
        sizes[-1] = nbytes - (k - 1) * segment
        self.counts.ingress += int(sizes[now].sum())
        self._data(buffer, head["seq"], now & ~parity, sizes, segment)
        for i in np.flatnonzero(now & parity):  # after the data: its window may lack fewer
            start = i * segment + DGRAM_HEADER_BYTES
            self._parity(int(head["seq"][i]), int(flags[i]), buffer[start : i * segment + sizes[i]])

    def _data(
        self,
        buffer: np.ndarray,
        seqs: np.ndarray,
        take: np.ndarray,
        sizes: np.ndarray,
        segment: int,
    ) -> None:
        """Copies the new datagrams among ``take`` into their slots."""
        n, d = self.have.size, self.d
        take = take & (seqs < n)
        take[take] = ~self.have[seqs[take]]
        rows = np.flatnonzero(take)
        if rows.size == 0:
            return
        seq = seqs[rows].astype(np.int64)
        seq, first = np.unique(seq, return_index=True)  # a repeated datagram counts once
        rows = rows[first]
        whole = sizes[rows] == segment
        body = payloads(buffer, int(rows.max()) + 1, segment, d)
        self.out.reshape(-1, d)[seq[whole]] = body[rows[whole]]
        for i, s in zip(rows[~whole], seq[~whole], strict=True):  # the stream's short last one
            length = int(sizes[i]) - DGRAM_HEADER_BYTES
            self.out[s * d : s * d + length] = body[i, :length]
        self.have[seq] = True
        self.count += seq.size
        self.received += seq.size

    def _parity(self, seq: int, flags: int, payload: np.ndarray) -> None:
        rebuilt = self.parity.receive(seq, flags, payload, self.out, self.have)
        self.rebuilt += rebuilt
        self.count += rebuilt


class Handover:
    """Which of a stream's messages a receiver has handed on (to the checks and the decoder),
    handing on the next ones: in order as the leading datagrams arrive (:meth:`upto`), and,
    past a missing datagram, every message whose datagrams have all arrived (:meth:`past`),
    so that what lies behind a loss is checked and decoded before the repair comes.

    ``edges``: the messages' stream offsets (message ``j``: bytes ``edges[j] .. edges[j + 1]``,
    as the receiver lays them out); ``d``: stream bytes per datagram; ``given``: the messages
    this receiver is given (a slow worker's, :mod:`.lanes`); ``deliver(j)`` hands message ``j``
    on.
    """

    def __init__(
        self, edges: np.ndarray, d: int, given: np.ndarray, deliver: Callable[[int], None]
    ) -> None:
        self.first, self.end = edges[:-1] // d, -(-edges[1:] // d)  # message j: [first, end)
        self.deliver = deliver
        self.handed = ~given  # a message not given counts as handed
        self.next = 0  # every message before it is handed on
        messages = len(edges) - 1
        self.step = max(1, -(-int(self.end[-1]) // messages)) if messages else 1

    def upto(self, prefix: int) -> None:
        """Hands on every message whose datagrams lie before ``prefix`` (all arrived)."""
        j, n = self.next, self.end.size
        while j < n and self.end[j] <= prefix:
            if not self.handed[j]:
                self.handed[j] = True
                self.deliver(j)
            j += 1
        self.next = j

    def past(self, have: np.ndarray) -> None:
        """Hands on every message past the leading ones whose datagrams have all arrived."""
        j = self.next
        todo = j + np.flatnonzero(~self.handed[j:] & have[self.end[j:] - 1])
        for i in todo.tolist():
            if have[self.first[i] : self.end[i]].all():
                self.handed[i] = True
                self.deliver(i)
