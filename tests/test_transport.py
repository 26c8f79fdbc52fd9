"""The framed broadcast link: headers, chunking, byte counts, integrity checks (loopback and
real gloo)."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from collections import deque
from datetime import timedelta

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.errors import UsageError, VerificationError
from coded_shuffle.transport import (
    HEADER_BYTES,
    KIND_DIGESTS,
    KIND_SYMBOLS,
    Header,
    Link,
    dist_broadcast,
    framed_bytes,
    message_ranges,
    rows_per_message,
)


class Loopback:
    """A broadcast that hands the master's messages to one receiver, in order."""

    def __init__(self) -> None:
        self.queue: deque[torch.Tensor] = deque()

    def send(self, buf: torch.Tensor) -> None:
        self.queue.append(buf.clone())

    def receive(self, buf: torch.Tensor) -> None:
        msg = self.queue.popleft()
        assert msg.numel() == buf.numel(), "receiver expected a different message size"
        buf.copy_(msg)


def pair(chunk_bytes: int, group_size: int = 3) -> tuple[Link, Link, Loopback]:
    wire = Loopback()
    return (
        Link(wire.send, group_size, chunk_bytes),
        Link(wire.receive, group_size, chunk_bytes),
        wire,
    )


u32, u16 = st.integers(0, 2**32 - 1), st.integers(0, 2**16 - 1)


@given(u32, u16, u16, u32, u32, u32, st.binary(min_size=32, max_size=32))
def test_header_round_trip(epoch, part, kind, first, count, row_bytes, digest):
    h = Header(epoch, part, kind, first, count, row_bytes, digest)
    raw = h.pack()
    assert len(raw) == HEADER_BYTES
    assert Header.unpack(raw) == h


@given(st.integers(0, 500), st.integers(1, 300), st.integers(1, 5000))
def test_messages_cover_every_row_once(rows, row_bytes, chunk):
    ranges = message_ranges(rows, row_bytes, chunk)
    covered = [i for first, count in ranges for i in range(first, first + count)]
    assert covered == list(range(rows))
    assert all(count * row_bytes <= max(chunk, row_bytes) for _, count in ranges)
    assert framed_bytes(rows, row_bytes, chunk) == rows * row_bytes + len(ranges) * HEADER_BYTES


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 60),
    st.integers(1, 40),
    st.integers(1, 400),
    st.data(),
)
def test_loopback_delivers_kept_rows_and_counts_every_byte(n, width, chunk, data):
    rows = torch.randint(0, 256, (n, width), dtype=torch.uint8)
    keep = np.array(sorted(data.draw(st.sets(st.integers(0, max(n - 1, 0)))) if n else []))
    keep = keep.astype(np.int64)
    master, worker, wire = pair(chunk, group_size=5)
    master.send(rows, epoch=7, part=1, kind=KIND_SYMBOLS)
    got = worker.receive(n, width, epoch=7, part=1, kind=KIND_SYMBOLS, keep=keep)
    assert not wire.queue
    assert torch.equal(got, rows[torch.from_numpy(keep)] if keep.size else rows[:0])
    expected = framed_bytes(n, width, chunk)
    for end in (master, worker):
        stats = end.take_stats()
        assert stats.link_bytes == expected
        assert stats.tree_bytes == expected * 4  # a binomial tree over 5 ranks: 4 links
        assert end.stats.link_bytes == 0  # take_stats starts again from zero


def test_tampered_payload_fails_loudly():
    master, worker, wire = pair(64)
    master.send(torch.arange(40, dtype=torch.uint8).reshape(4, 10), 3, 0, KIND_SYMBOLS)
    wire.queue[0][HEADER_BYTES + 5] ^= 1
    with pytest.raises(VerificationError, match="payload digest mismatch"):
        worker.receive(4, 10, 3, 0, KIND_SYMBOLS)


@pytest.mark.parametrize(
    ("epoch", "part", "kind"), [(4, 0, KIND_SYMBOLS), (3, 1, KIND_SYMBOLS), (3, 0, KIND_DIGESTS)]
)
def test_header_mismatch_names_both_sides(epoch, part, kind):
    master, worker, _ = pair(1 << 10)
    master.send(torch.zeros((4, 10), dtype=torch.uint8), 3, 0, KIND_SYMBOLS)
    with pytest.raises(VerificationError, match="header mismatch: expected epoch"):
        worker.receive(4, 10, epoch, part, kind)


def test_bad_chunk_and_keep_are_refused():
    with pytest.raises(UsageError, match="chunk_bytes"):
        rows_per_message(8, 0)
    _, worker, _ = pair(64)
    with pytest.raises(ValueError, match="sorted"):
        worker.receive(4, 2, 0, 0, KIND_SYMBOLS, keep=np.array([2, 1]))
    with pytest.raises(ValueError, match="out of range"):
        worker.receive(4, 2, 0, 0, KIND_SYMBOLS, keep=np.array([1, 4]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_rank(rank: int, world: int, port: int, rows: torch.Tensor, out: mp.Queue) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=20),
    )
    link = Link(*dist_broadcast(None, 0), chunk_bytes=100)
    if rank == 0:
        link.send(rows, 2, 0, KIND_SYMBOLS)
        got = rows
    else:
        keep = np.arange(rank - 1, rows.shape[0], world - 1)
        got = link.receive(rows.shape[0], rows.shape[1], 2, 0, KIND_SYMBOLS, keep=keep)
    stats = link.take_stats()
    out.put((rank, got.numpy().tobytes(), stats.link_bytes, stats.tree_bytes))
    dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.skipif(os.name != "posix", reason="forks processes")
def test_real_gloo_broadcast_matches_the_loopback_count():
    world, rows = 3, torch.randint(0, 256, (50, 7), dtype=torch.uint8)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_gloo_rank, args=(r, world, port, rows, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = {r: (b, link, tree) for r, b, link, tree in (out.get(timeout=60) for _ in procs)}
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    expected = framed_bytes(50, 7, 100)
    for rank, (got, link, tree) in results.items():
        assert link == expected and tree == expected * (world - 1)
        if rank:
            want = rows[torch.arange(rank - 1, 50, world - 1)]
            assert got == want.numpy().tobytes()
