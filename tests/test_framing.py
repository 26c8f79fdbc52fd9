"""The link's framing: headers, checks on receipt, pruned streams and picked rows, through an
in-process wire (no process group)."""

from __future__ import annotations

from collections import deque
from datetime import timedelta

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.costs.wire import (
    chain_bytes,
    chain_reach,
    message_keepers,
    message_ranges,
    message_sizes,
)
from coded_shuffle.distributed.transports import (
    Link,
    Peer,
    Routes,
    Transport,
)
from coded_shuffle.distributed.transports.framing import (
    HEADER,
    HEADER_BYTES,
    KIND_SYMBOLS,
    Header,
    Inbox,
    check,
    frame,
    frame_parts,
)
from coded_shuffle.errors import VerificationError
from tests.links import (
    framed,
)

# --- framing and the header checks, through an in-process wire --------------------------------


class Wire(Transport):
    """A test transport: the master's messages wait on a shared queue until a worker reads them."""

    name = "test-wire"
    routing = "broadcast"

    def __init__(self, peer: Peer, wire: deque) -> None:
        super().__init__(peer)
        self.wire = wire

    def exchange(self, streams, outgoing, on_message) -> None:
        for i, stream in enumerate(streams):
            if self.peer.rank == 0:
                self.wire.extend(m.clone() for m in outgoing[i])
            else:
                for j in range(len(stream.sizes)):
                    on_message(i, j, self.wire.popleft())


def wire_pair(chunk: int) -> tuple[Link, Link, deque]:
    wire: deque = deque()
    master = Link(Wire(Peer(0, 2, timedelta(seconds=5)), wire), chunk)
    worker = Link(Wire(Peer(1, 2, timedelta(seconds=5)), wire), chunk)
    return master, worker, wire


def send_and_receive(
    rows: torch.Tensor, keep: np.ndarray, chunk: int, tamper=None, **expect
) -> torch.Tensor:
    master, worker, wire = wire_pair(chunk)
    n, w = rows.shape
    master.deliver(
        epoch=3,
        part=1,
        kind=KIND_SYMBOLS,
        num_rows=n,
        row_bytes=w,
        routes=Routes((keep,)),
        rows=rows,
    )
    if tamper:
        tamper(wire)
    args = {"epoch": 3, "part": 1, "kind": KIND_SYMBOLS, "num_rows": n, "row_bytes": w}
    args.update(expect)
    out = worker.deliver(**args, routes=Routes((keep,)))
    assert not wire
    return out


u32, u16 = st.integers(0, 2**32 - 1), st.integers(0, 2**16 - 1)


@given(u32, u16, u16, u32, u32, u32, u32)
def test_header_round_trip(epoch, part, kind, first, count, row_bytes, checksum):
    h = Header(epoch, part, kind, first, count, row_bytes, checksum)
    assert len(h.pack()) == 24 == HEADER_BYTES
    assert Header.unpack(h.pack()) == h


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 60), st.integers(1, 40), st.integers(1, 400), st.data())
def test_kept_rows_arrive_across_every_message_boundary(n, width, chunk, data):
    rows = torch.randint(0, 256, (n, width), dtype=torch.uint8)
    keep = np.array(sorted(data.draw(st.sets(st.integers(0, max(n - 1, 0))))) if n else [])
    keep = keep.astype(np.int64)
    master, worker, wire = wire_pair(chunk)
    master.deliver(
        epoch=1,
        part=0,
        kind=KIND_SYMBOLS,
        num_rows=n,
        row_bytes=width,
        routes=Routes((keep,)),
        rows=rows,
    )
    assert sum(m.numel() for m in wire) == framed(n, width, chunk)
    got = worker.deliver(
        epoch=1, part=0, kind=KIND_SYMBOLS, num_rows=n, row_bytes=width, routes=Routes((keep,))
    )
    assert torch.equal(got, rows[torch.from_numpy(keep)] if keep.size else rows[:0])


FIELDS = {  # header field -> (index in HEADER's tuple, a wrong value)
    "epoch": (0, 4),
    "part": (1, 0),
    "kind": (2, 9),
    "first": (3, 2),
    "count": (4, 1),
    "row_bytes": (5, 5),
}


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_every_header_field_is_checked(field):
    """A message whose header differs in one field (checksum still right) fails loudly."""
    index, wrong = FIELDS[field]

    def tamper(wire):
        values = list(HEADER.unpack(wire[0][:HEADER_BYTES].numpy().tobytes()))
        values[index] = wrong
        wire[0][:HEADER_BYTES] = torch.frombuffer(
            bytearray(HEADER.pack(*values)), dtype=torch.uint8
        )

    rows = torch.arange(40, dtype=torch.uint8).reshape(4, 10)
    with pytest.raises(VerificationError, match=rf"header mismatch \({field}\)"):
        send_and_receive(rows, np.arange(4), 20, tamper)


def test_a_tampered_payload_fails_its_checksum():
    def tamper(wire):
        wire[0][HEADER_BYTES + 3] ^= 1

    rows = torch.arange(40, dtype=torch.uint8).reshape(4, 10)
    with pytest.raises(VerificationError, match=r"payload checksum \(CRC-32\) mismatch"):
        send_and_receive(rows, np.arange(4), 20, tamper)


def test_only_messages_with_kept_rows_are_checksummed():
    """A relay's next hop checks what the relay keeps nothing of; a kept row is checked."""

    def tamper(wire):
        wire[0][HEADER_BYTES + 3] ^= 1  # message 0: rows 0 and 1

    rows = torch.arange(40, dtype=torch.uint8).reshape(4, 10)
    got = send_and_receive(rows, np.array([2, 3]), 20, tamper)
    assert torch.equal(got, rows[2:])
    with pytest.raises(VerificationError, match=r"payload checksum \(CRC-32\) mismatch"):
        send_and_receive(rows, np.array([1, 2]), 20, tamper)


def _inbox(keep: np.ndarray, skips: bool) -> tuple[Inbox, list[torch.Tensor], torch.Tensor]:
    """An inbox of a stream of 6 rows of 10 bytes in 3 messages of 2 rows, and the messages."""
    rows = torch.arange(60, dtype=torch.uint8).reshape(6, 10)
    messages = list(frame(rows, 3, 0, KIND_SYMBOLS, 20))
    out = torch.zeros((keep.size, 10), dtype=torch.uint8)
    inbox = Inbox((3, 0, KIND_SYMBOLS), 6, 10, 20, keep, out, np.arange(keep.size), skips=skips)
    return inbox, messages, rows


def test_a_pruned_stream_may_skip_only_messages_without_kept_rows():
    """A chain relay forwards only what a worker after it keeps: an inbox that ``skips``
    accepts a gap where it keeps nothing, and fails naming a skipped message it keeps a row of
    (in the middle and at the end); a plain inbox accepts no gap."""
    inbox, messages, rows = _inbox(np.array([0, 5]), skips=True)
    inbox.receive(0, messages[0])
    inbox.receive(2, messages[2])
    inbox.complete()
    assert torch.equal(torch.from_numpy(inbox.out), rows[[0, 5]])
    inbox, messages, _ = _inbox(np.array([0, 3]), skips=True)
    inbox.receive(0, messages[0])
    inbox.receive(2, messages[2])
    with pytest.raises(VerificationError, match=r"message 1 .* did not arrive.* row 3"):
        inbox.complete()
    inbox, messages, _ = _inbox(np.array([0, 4]), skips=True)
    inbox.receive(0, messages[0])
    with pytest.raises(VerificationError, match=r"message 2 .* did not arrive.* row 4"):
        inbox.complete()
    inbox, messages, _ = _inbox(np.array([0, 5]), skips=False)
    inbox.receive(0, messages[0])
    inbox.receive(2, messages[2])
    with pytest.raises(VerificationError, match=r"2 of 3 messages arrived .*message 1 did not"):
        inbox.complete()


def test_messages_may_arrive_in_any_order_once_each():
    """Messages past a lost datagram come before it (a multicast repair): every order gives
    the same rows and tells ``on_ready`` each message's kept rows; a message twice, or one
    out of the stream, fails naming it."""
    told: list[tuple[int, int]] = []
    rows = torch.arange(60, dtype=torch.uint8).reshape(6, 10)
    messages = list(frame(rows, 3, 0, KIND_SYMBOLS, 20))
    keep = np.array([1, 2, 3, 5])
    out = torch.zeros((keep.size, 10), dtype=torch.uint8)
    on_ready = lambda lo, hi: told.append((lo, hi))  # noqa: E731
    inbox = Inbox((3, 0, KIND_SYMBOLS), 6, 10, 20, keep, out, np.arange(4), on_ready)
    for i in (2, 0, 1):
        inbox.receive(i, messages[i])
    inbox.complete()
    assert torch.equal(out, rows[keep])
    assert told == [(3, 4), (0, 1), (1, 3)]
    with pytest.raises(VerificationError, match="message 1 of 3 arrived again in epoch 3"):
        inbox.receive(1, messages[1])
    with pytest.raises(VerificationError, match="message 3 of 3 arrived out of range"):
        inbox.receive(3, messages[1])


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_messages_reach_is_the_last_keeper_in_relay_order(data):
    workers = data.draw(st.integers(1, 6))
    rows, width, chunk = data.draw(st.integers(0, 40)), 3, data.draw(st.integers(3, 20))
    order = data.draw(st.permutations(range(1, workers + 1)))
    needs = [
        np.array(sorted(data.draw(st.sets(st.integers(0, max(rows - 1, 0)), max_size=rows))))
        for _ in range(workers)
    ]
    needs = [n.astype(np.int64) if rows else np.zeros(0, np.int64) for n in needs]
    ranges = message_ranges(rows, width, chunk)
    reach = chain_reach(message_keepers(needs, rows, width, chunk), order)
    for j, (first, count) in enumerate(ranges):
        keeps = [
            order.index(k + 1) + 1
            for k in range(workers)
            if np.any((needs[k] >= first) & (needs[k] < first + count))
        ]
        assert reach[j] == max([1, *keeps])
    sizes = message_sizes(rows, width, chunk)
    hops = sum(s * int(r) for s, r in zip(sizes, reach, strict=True))
    assert chain_bytes(sizes, reach, workers) == hops + 4 * len(sizes) * workers


def test_two_messages_swapped_on_the_wire_fail():
    """Same sizes, valid checksums: only the header's ``first`` tells them apart."""

    def tamper(wire):
        wire[0], wire[1] = wire[1], wire[0]

    rows = torch.arange(40, dtype=torch.uint8).reshape(4, 10)
    with pytest.raises(VerificationError, match=r"header mismatch \(first\)"):
        send_and_receive(rows, np.arange(4), 20, tamper)


def test_a_receiver_that_derived_other_sizes_fails():
    rows = torch.arange(40, dtype=torch.uint8).reshape(4, 10)
    with pytest.raises(VerificationError, match="header mismatch"):
        send_and_receive(rows, np.arange(4), 20, None, epoch=2)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 17), st.data())
def test_copy_rows_equals_fancy_indexing_for_runs_and_gathers(n, w, data):
    """The receive path's row copy (one memcpy for runs, the kernel otherwise)."""
    from coded_shuffle.codec.kernel import copy_rows

    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    src = rng.integers(0, 256, (n, w), dtype=np.uint8)
    count = data.draw(st.integers(0, n))
    run = data.draw(st.booleans())
    start = data.draw(st.integers(0, n - count))
    rows = np.arange(start, start + count) if run else np.sort(rng.choice(n, count, False))
    targets = rng.permutation(count) if data.draw(st.booleans()) else np.arange(count)
    dst = np.zeros((count, w), dtype=np.uint8)
    copy_rows(dst, targets.astype(np.int64), src, rows.astype(np.int64))
    want = np.zeros_like(dst)
    want[targets] = src[rows]
    assert np.array_equal(dst, want)


def test_picked_rows_frame_only_the_picked_rows():
    from coded_shuffle.distributed.transports.framing import PickedRows, frame

    rows = torch.arange(60, dtype=torch.uint8).reshape(12, 5)
    ids = np.array([0, 3, 4, 5, 11], dtype=np.int64)
    messages = list(frame(PickedRows(rows, ids), 1, 0, KIND_SYMBOLS, 10))  # 2 rows per message
    payload = torch.cat([m[HEADER_BYTES:] for m in messages]).view(-1, 5)
    assert torch.equal(payload, rows[torch.from_numpy(ids)])


@pytest.mark.parametrize("parts", [False, True], ids=["framed", "zero-copy"])
def test_a_planted_fault_sees_every_message_and_changes_only_what_it_replaces(parts):
    """The hook sees each message's rows where they are; the sender's rows are never
    written; the message it replaces goes out with its rows (their digest, where framed)
    and the others on the same path as without a hook (zero-copy: views of the rows)."""
    rows = torch.arange(40 * 10, dtype=torch.int64).remainder(251).to(torch.uint8).view(40, 10)
    before, seen = rows.clone(), []

    def flip(first: int, mine: torch.Tensor) -> torch.Tensor | None:
        seen.append((first, mine.shape[0]))
        if first != 10:
            return None
        flipped = mine.clone()
        flipped[0, 0] ^= 0xFF
        return flipped

    if parts:
        sent = [m.payload for m in frame_parts(rows, 1, 0, KIND_SYMBOLS, 100, hook=flip)]
        views = [m for m, (first, _) in zip(sent, seen, strict=True) if first != 10]
        lo, hi = rows.data_ptr(), rows.data_ptr() + rows.numel()
        assert all(lo <= m.data_ptr() < hi for m in views)  # no copy but the replaced one
    else:
        sent = []
        for message in frame(rows, 1, 0, KIND_SYMBOLS, 100, hook=flip):
            first = int.from_bytes(message[8:12].numpy().tobytes(), "little")
            header = Header(1, 0, KIND_SYMBOLS, first, 10, 10)
            sent.append(check(message, header))  # its digest covers the flipped byte
    assert seen == [(0, 10), (10, 10), (20, 10), (30, 10)]
    assert torch.equal(rows, before)
    got = torch.cat([m.reshape(-1) for m in sent]).view(40, 10)
    assert int(got[10, 0]) == int(before[10, 0]) ^ 0xFF
    got[10, 0] ^= 0xFF
    assert torch.equal(got, before)
