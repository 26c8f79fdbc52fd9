"""Transports and the link: framing, header checks, routing, and every transport's byte counts
against its cost model (transports.md), computed here independently of the code under test."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import socket
import threading
import time
from collections import deque
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.costs.rates import format_rate, parse_rate
from coded_shuffle.costs.wire import DGRAM_HEADER_BYTES as DGRAM_HEAD
from coded_shuffle.costs.wire import (
    chain_bytes,
    chain_reach,
    default_datagram_bytes,
    message_keepers,
    message_ranges,
    message_sizes,
    wire_bytes,
)
from coded_shuffle.distributed.transports import (
    JOB_NAMES,
    REGISTRY,
    ChainOptions,
    Link,
    MulticastOptions,
    Peer,
    Routes,
    Transport,
    build_transport,
    transport_class,
)
from coded_shuffle.distributed.transports.chain import chain_order
from coded_shuffle.distributed.transports.framing import (
    HEADER,
    HEADER_BYTES,
    KIND_SYMBOLS,
    Header,
    Inbox,
    frame,
)
from coded_shuffle.distributed.transports.multicast import DGRAM
from coded_shuffle.distributed.transports.multicast.pacing import CATCH_UP_BYTES, Pacer
from coded_shuffle.distributed.transports.sockets import HELLO
from coded_shuffle.distributed.transports.tree import children
from coded_shuffle.errors import UsageError, VerificationError
from tests.ranks import is_root, private_netns, run_ranks

PEER = Peer(0, 2, timedelta(seconds=5))


def framed(rows: int, width: int, chunk: int) -> int:
    """Bytes of ``rows`` rows of ``width`` bytes in messages of at most ``chunk`` payload bytes
    (at least one row each), each with a 24-byte header: the wire format, derived here."""
    per = max(1, chunk // width)
    return rows * width + math.ceil(rows / per) * 24


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
    master.deliver(epoch=3, part=1, kind=KIND_SYMBOLS, num_rows=n, row_bytes=w,
                   routes=Routes((keep,)), rows=rows)  # fmt: skip
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
    master.deliver(epoch=1, part=0, kind=KIND_SYMBOLS, num_rows=n, row_bytes=width,
                   routes=Routes((keep,)), rows=rows)  # fmt: skip
    assert sum(m.numel() for m in wire) == framed(n, width, chunk)
    got = worker.deliver(epoch=1, part=0, kind=KIND_SYMBOLS, num_rows=n, row_bytes=width,
                         routes=Routes((keep,)))  # fmt: skip
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
    with pytest.raises(VerificationError, match=r"message 1 .* did not arrive.* row 3"):
        inbox.receive(2, messages[2])
    inbox, messages, _ = _inbox(np.array([0, 4]), skips=True)
    inbox.receive(0, messages[0])
    with pytest.raises(VerificationError, match=r"message 2 .* did not arrive.* row 4"):
        inbox.complete()
    inbox, messages, _ = _inbox(np.array([0, 5]), skips=False)
    inbox.receive(0, messages[0])
    with pytest.raises(VerificationError, match="message 2 arrived, expected 1"):
        inbox.receive(2, messages[2])


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


# --- models and options -----------------------------------------------------------------------


def test_gloo_binomial_tree_children():
    """gloo/broadcast.cc: in round i every rank r < 2^i sends to r + 2^i (root 0)."""
    assert children(0, 5) == [1, 2, 4]
    assert children(1, 5) == [3]
    assert children(2, 5) == []
    assert children(3, 8) == [7]
    assert children(0, 9) == [1, 2, 4, 8]
    assert [len(children(0, p)) for p in range(2, 18)] == [
        math.ceil(math.log2(p)) for p in range(2, 18)
    ]


def test_the_multicast_pacer_catches_up_a_hold_up_within_its_slack():
    pacer = Pacer(8e6, 1000)  # 1 ms per 1000-byte datagram; slack: 2 MiB = 2.1 s
    assert pacer.interval == pytest.approx(1e-3)
    assert pacer.slack == pytest.approx(CATCH_UP_BYTES * 8 / 8e6)
    held = pacer.due = time.perf_counter() - pacer.slack / 2  # held up, within the slack
    pacer.wait()
    assert pacer.due == held  # what fell due meanwhile goes out at once (no sleep)
    before = time.perf_counter()
    pacer.due = before - 10 * pacer.slack  # held up far longer
    pacer.wait()
    assert before - pacer.slack <= pacer.due <= time.perf_counter() - pacer.slack


def test_default_datagrams_are_about_four_fragments():
    assert default_datagram_bytes(1500) == 8192  # 6 fragments: the floor
    assert default_datagram_bytes(9000) == 32768  # 4 fragments: the ceiling
    assert default_datagram_bytes(4000) == 4 * (4000 - 48)  # IPv4, UDP, our header


def test_wire_bytes_of_a_fragmented_datagram():
    # 8208 bytes + 8 UDP = 8216 IP payload; 1480 per fragment -> 6 fragments of 34 header bytes
    assert wire_bytes(8208, 1500) == 8216 + 6 * 34
    assert wire_bytes(1000, 1500) == 1008 + 34
    assert wire_bytes(8208, 9000) == 8216 + 34


@pytest.mark.parametrize(
    ("text", "bits"),
    [("400mbit", 400_000_000), ("1gbit", 10**9), ("50mbps", 400_000_000), ("2.5Mbit", 2_500_000)],
)
def test_rates_in_tc_units(text, bits):
    assert parse_rate(text) == bits
    assert parse_rate(format_rate(bits)) == bits


@pytest.mark.parametrize("text", ["400mb", "fast", "", "-3mbit", "1kbit"])
def test_bad_rates_are_one_usage_error(text):
    with pytest.raises(UsageError, match="rate"):
        parse_rate(text)


def test_registry_and_option_errors():
    assert set(REGISTRY) == {"tree", "chain", "multicast", "unicast", "p2p"}
    with pytest.raises(UsageError, match=r"^transport='smoke' unknown; valid: chain, "):
        build_transport("smoke", PEER)
    with pytest.raises(UsageError, match=r"must list every worker rank 1\.\.3 once"):
        chain_order([1, 1, 2], 4)
    assert chain_order([3, 1, 2], 4) == (3, 1, 2)
    with pytest.raises(UsageError, match=r"^transport_options\['window'\]=0 out of range"):
        REGISTRY["chain"].validate(4, window=0)
    with pytest.raises(UsageError, match=r"^transport_options\['rate'\] is required"):
        REGISTRY["multicast"].validate(4)
    with pytest.raises(UsageError, match="not an IPv4 multicast address"):
        REGISTRY["multicast"].validate(4, rate="1gbit", group="10.0.0.1")
    with pytest.raises(UsageError, match=r"^transport=tree takes no options, got \['window'\]"):
        REGISTRY["tree"].validate(4, window=3)
    with pytest.raises(UsageError, match=r"^transport_options\['windows'\] is not an option"):
        REGISTRY["chain"].validate(4, windows=3)
    with pytest.raises(UsageError, match=r"segment_bytes'\]=10 out of range \(must be >= 1024\)"):
        REGISTRY["chain"].validate(4, segment_bytes=10)


def test_the_job_names_its_hydra_keys():
    """The same checks, named the way the training job's config names them."""
    with pytest.raises(UsageError, match=r"^dist\.chain\.window=0 out of range"):
        REGISTRY["chain"].validate(4, JOB_NAMES, window=0)
    with pytest.raises(UsageError, match=r"^dist\.chain\.order=\[1, 1, 2\] must list"):
        REGISTRY["chain"].validate(4, JOB_NAMES, order=[1, 1, 2])
    with pytest.raises(UsageError, match=r"^dist\.multicast\.rate is required"):
        REGISTRY["multicast"].validate(4, JOB_NAMES)
    with pytest.raises(UsageError, match=r"^dist\.multicast\.rate 'x' cannot be parsed"):
        REGISTRY["multicast"].validate(4, JOB_NAMES, rate="x")
    with pytest.raises(UsageError, match=r"^dist\.transport='smoke' unknown"):
        transport_class("smoke", JOB_NAMES)


def test_each_option_has_one_default_the_job_schema_reuses():
    """The Hydra schema's ``dist.chain``/``dist.multicast`` are the transports' dataclasses."""
    from train.config import DistConf

    fields = {f.name: f.default_factory for f in dataclasses.fields(DistConf) if f.default_factory}
    assert fields["chain"] is ChainOptions and fields["multicast"] is MulticastOptions
    assert REGISTRY["chain"].Options is ChainOptions
    conf = (Path(__file__).resolve().parent.parent / "conf" / "config.yaml").read_text()
    assert "window:" not in conf and "grace_seconds:" not in conf  # no second default


# --- real process groups: every transport, its routes and its counts --------------------------

N_ROWS, WIDTH, CHUNK = 57, 13, 100


def _routes_for(name: str, world: int, seed: int = 0) -> tuple[tuple, tuple | None]:
    """Random needs per worker; for p2p a random sender other than the receiver per row."""
    rng = np.random.default_rng(seed)
    workers = world - 1
    needs = tuple(
        np.sort(rng.choice(N_ROWS, size=10 + 5 * k, replace=False)) for k in range(workers)
    )
    if REGISTRY[name].routing != "peers":
        return needs, None
    senders = []
    for k, need in enumerate(needs):
        choices = [r for r in range(world) if r != k + 1]
        senders.append(np.array(choices)[rng.integers(0, len(choices), need.size)])
    return needs, tuple(senders)


def _deliver(rank: int, world: int, name: str, options: dict, knock=None) -> tuple:
    """One delivery of every worker's rows; ``knock(transport)`` (if given) runs on rank 1
    before it, while every other rank waits: strangers at its door."""
    peer = Peer(rank, world, timedelta(seconds=30))
    transport = build_transport(name, peer, options)
    try:
        if knock is not None:
            if rank == 1:
                knock(transport)
            dist.barrier()
        link = Link(transport, CHUNK)
        rows = torch.arange(N_ROWS * WIDTH, dtype=torch.int64).remainder(251)
        rows = rows.to(torch.uint8).reshape(N_ROWS, WIDTH)
        needs, senders = _routes_for(name, world)
        if senders is None:
            known = needs if rank == 0 or transport.routing == "broadcast" else None
            routes = Routes(
                known or tuple(n if k == rank - 1 else None for k, n in enumerate(needs))
            )
            mine = rows if rank == 0 else None
            out = link.deliver(epoch=5, part=0, kind=KIND_SYMBOLS, num_rows=N_ROWS,
                               row_bytes=WIDTH, routes=routes, rows=mine)  # fmt: skip
        else:
            ids = np.unique(
                np.concatenate([n[s == rank] for n, s in zip(needs, senders, strict=True)])
            )
            out = link.deliver(epoch=5, part=0, kind=KIND_SYMBOLS, num_rows=N_ROWS,
                               row_bytes=WIDTH, routes=Routes(needs, senders),
                               rows=rows[torch.from_numpy(ids)], row_ids=ids)  # fmt: skip
        got = None if out is None else out.numpy().tobytes()
        counts, _ = link.take_counts()
        return got, counts.as_list()
    finally:
        transport.close()


def _check_rows(results, world, name):
    rows = (np.arange(N_ROWS * WIDTH) % 251).astype(np.uint8).reshape(N_ROWS, WIDTH)
    needs, _ = _routes_for(name, world)
    assert results[0][0] is None
    for k in range(world - 1):
        assert results[k + 1][0] == rows[needs[k]].tobytes(), f"{name}: worker {k}"


WORLD = 4  # a master and three workers
L = framed(N_ROWS, WIDTH, CHUNK)  # one broadcast stream of every row


GLOO = {"plane": "gloo"}  # the default plane is socket


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("name", "options"),
    [("tree", {}), ("chain", {}), ("unicast", {}), ("p2p", {}), ("chain", GLOO),
     ("unicast", GLOO)],
)  # fmt: skip
def test_tcp_transports_deliver_exactly_and_count_their_model(name, options):
    results = run_ranks(WORLD, _deliver, name, options)
    _check_rows(results, WORLD, name)
    egress = [r[1][0] for r in results]
    ingress = [r[1][1] for r in results]
    needs, senders = _routes_for(name, WORLD)
    if name == "tree":  # binomial tree over 4 ranks: 0 -> 1, 2; 1 -> 3
        assert egress == [2 * L, L, 0, 0] and ingress == [0, L, L, L]
    elif name == "chain":  # 0 -> 1 -> 2 -> 3, each message as far as a worker keeps it
        assert (egress, ingress) == _chain_counts(needs, [1, 2, 3], WORLD)
    elif name == "unicast":
        own = [framed(n.size, WIDTH, CHUNK) for n in needs]
        assert egress == [sum(own), 0, 0, 0] and ingress == [0, *own]
    else:
        streams = [
            (int(s), k + 1, framed(int(np.sum(senders[k] == s)), WIDTH, CHUNK))
            for k in range(WORLD - 1)
            for s in np.unique(senders[k])
        ]
        assert egress == [sum(b for s, _, b in streams if s == r) for r in range(WORLD)]
        assert ingress == [sum(b for _, d, b in streams if d == r) for r in range(WORLD)]
    assert sum(egress) == sum(ingress)  # every byte sent was received once


def _chain_counts(needs, order, world) -> tuple[list[int], list[int]]:
    """Every rank's (egress, ingress) on a chain in ``order``: a message travels to the last
    worker that keeps one of its rows (at least to the first), and a reach table of 4 bytes
    per message crosses every link."""
    ranges = [(a, min(a + CHUNK // WIDTH, N_ROWS)) for a in range(0, N_ROWS, CHUNK // WIDTH)]
    sizes = [HEADER_BYTES + (b - a) * WIDTH for a, b in ranges]
    path = [0, *order]
    egress, ingress = [0] * world, [0] * world
    for (a, b), size in zip(ranges, sizes, strict=True):
        keepers = [
            p
            for p in range(1, world)
            if np.any((needs[path[p] - 1] >= a) & (needs[path[p] - 1] < b))
        ]
        for hop in range(1, max([1, *keepers]) + 1):  # the link into position hop
            egress[path[hop - 1]] += size
            ingress[path[hop]] += size
    for hop in range(1, world):
        egress[path[hop - 1]] += 4 * len(sizes)
        ingress[path[hop]] += 4 * len(sizes)
    return egress, ingress


def _chain_pruned(rank: int, world: int, plane: str) -> tuple:
    """Every worker keeps one block of rows of its own (as an uncoded stream, ordered by
    worker) and two rows of the next block; relay order 2, 3, 1."""
    order = [2, 3, 1]
    transport = build_transport(
        "chain", Peer(rank, world, timedelta(seconds=30)), {"order": order, "plane": plane}
    )
    try:
        link = Link(transport, CHUNK)
        rows = torch.arange(N_ROWS * WIDTH, dtype=torch.int64).remainder(249)
        rows = rows.to(torch.uint8).reshape(N_ROWS, WIDTH)
        needs = _pruned_needs(world)
        routes = Routes(
            needs if rank == 0 else tuple(n if k == rank - 1 else None for k, n in enumerate(needs))
        )
        out = link.deliver(epoch=3, part=0, kind=KIND_SYMBOLS, num_rows=N_ROWS, row_bytes=WIDTH,
                           routes=routes, rows=rows if rank == 0 else None)  # fmt: skip
        counts, _ = link.take_counts()
        got = None if out is None else out.numpy().tobytes()
        return got, counts.egress, counts.ingress, counts.control, link.take_modelled()
    finally:
        transport.close()


def _pruned_needs(world: int) -> tuple[np.ndarray, ...]:
    blocks = np.array_split(np.arange(N_ROWS), world - 1)
    nxt = [blocks[(k + 1) % len(blocks)][:2] for k in range(len(blocks))]
    return tuple(np.union1d(b, n) for b, n in zip(blocks, nxt, strict=True))


@pytest.mark.distributed
@pytest.mark.parametrize("plane", ["socket", "gloo"])
def test_a_chain_relay_forwards_only_what_a_worker_after_it_keeps(plane):
    results = run_ranks(WORLD, _chain_pruned, plane)
    rows = (np.arange(N_ROWS * WIDTH) % 249).astype(np.uint8).reshape(N_ROWS, WIDTH)
    needs = _pruned_needs(WORLD)
    assert results[0][0] is None
    for k in range(WORLD - 1):
        assert results[k + 1][0] == rows[needs[k]].tobytes(), f"worker {k}"
    egress, ingress = _chain_counts(needs, [2, 3, 1], WORLD)
    assert [r[1] for r in results] == egress and [r[2] for r in results] == ingress
    assert sum(egress) < (WORLD - 1) * L  # it pruned: fewer bytes than the stream on every link
    # the reach table (4 B per message) is control, sent by all but the chain's last (rank 1)
    assert [r[3] for r in results] == [4 * 9, 0, 4 * 9, 4 * 9]
    assert results[0][4] == sum(egress)  # the master's byte model: what the hosts counted
    assert all(r[4] is None for r in results[1:])


BIG_ROWS, BIG_WIDTH, BIG_CHUNK = 6, 384 * 1024, 384 * 1024  # messages of 384 KiB


def _relay_big(rank: int, world: int, plane: str = "gloo") -> bytes | None:
    """A chain of ``world - 1`` workers, one segment received ahead (``window=1``), messages
    far larger than a socket buffer and cut into segments: a relay that forwarded a segment
    before it had fully arrived would pass on a partly filled buffer, and the next worker's
    checksum fails."""
    options = {"window": 1, "segment_bytes": 100_000, "plane": plane}  # unequal segments
    transport = build_transport("chain", Peer(rank, world, timedelta(seconds=30)), options)
    try:
        link = Link(transport, BIG_CHUNK)
        gen = torch.Generator().manual_seed(11)
        rows = torch.randint(0, 256, (BIG_ROWS, BIG_WIDTH), generator=gen).to(torch.uint8)
        everything = np.arange(BIG_ROWS)
        out = link.deliver(epoch=2, part=0, kind=KIND_SYMBOLS, num_rows=BIG_ROWS,
                           row_bytes=BIG_WIDTH, routes=Routes((everything,) * (world - 1)),
                           rows=rows if rank == 0 else None)  # fmt: skip
        return None if out is None else hashlib.sha256(out.numpy().tobytes()).digest()
    finally:
        transport.close()


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("plane", ["gloo", "socket"])
def test_a_chain_relay_forwards_only_whole_messages(plane):
    """(The socket plane receives these payloads into place and relays them from there.)"""
    gen = torch.Generator().manual_seed(11)
    rows = torch.randint(0, 256, (BIG_ROWS, BIG_WIDTH), generator=gen).to(torch.uint8)
    want = hashlib.sha256(rows.numpy().tobytes()).digest()
    assert run_ranks(WORLD, _relay_big, plane) == [None, want, want, want]


@pytest.mark.distributed
@pytest.mark.skipif(not is_root(), reason="multicast runs only inside a private namespace (root)")
@pytest.mark.parametrize("drop", [0.0, 0.3])
def test_multicast_repairs_what_receivers_miss_and_counts_it(drop):
    options = {"rate": "200mbit", "datagram_bytes": 512, "drop": drop}
    with private_netns() as ns:
        results = run_ranks(WORLD, _deliver, "multicast", options, netns=ns)
    _check_rows(results, WORLD, "multicast")
    egress, ingress, repairs, control, parity, *_ = zip(*(r[1] for r in results), strict=True)
    datagrams = math.ceil(L / 512)
    # the first stream carries parity: one 512-byte datagram per block of 32 (20-byte header)
    assert parity[0] == math.ceil(datagrams / 32) * (DGRAM_HEAD + 512) and parity[1:] == (
        0,
        0,
        0,
    )
    if drop == 0:
        assert repairs[0] == 0
    else:
        assert repairs[0] > 0  # 30% of the datagrams lost at every receiver: repairs ran
    # model: every datagram once (20-byte header each), the repairs, parity, the feedback
    assert egress[0] == L + DGRAM_HEAD * datagrams + repairs[0] + parity[0] + control[0]
    assert all(e == c for e, c in zip(egress[1:], control[1:], strict=True))  # workers: feedback
    # what each worker missed, one bit per datagram, and its count of lost or late (4 bytes)
    bitmap = math.ceil(datagrams / 8) + 4
    if drop == 0:  # one round: every datagram and parity, "round sent" (4 bytes), the union
        # (a receiver stops reading once it has every datagram: the last block's parity, sent
        # after it, is not read in this stream)
        heard = parity[0] - (DGRAM_HEAD + 512)
        assert list(ingress[1:]) == [L + DGRAM_HEAD * datagrams + heard + 4 + bitmap] * (WORLD - 1)
        # each worker sends its bitmap (the master sends the union to each one itself)
        assert control[1:] == (bitmap, bitmap, bitmap)
        assert control[0] == 4 * (WORLD - 1) + bitmap * (WORLD - 1)  # "round sent", the union
    else:  # datagrams dropped at the receivers were not counted as received
        assert all(i < egress[0] for i in ingress[1:])


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


MC_ROWS, MC_WIDTH = 2000, 64  # about 260 datagrams of 512 bytes


def _multicast_stream(rank: int, world: int, options: dict, streams: int) -> tuple:
    """``streams`` broadcast streams of random rows over multicast; per rank: whether every
    stream arrived exactly, its counts, repair rounds, rebuilt datagrams, the pace of each."""
    transport = build_transport("multicast", Peer(rank, world, timedelta(seconds=30)), options)
    try:
        link = Link(transport, 4096)
        exact, rounds, paces = True, [], []
        for epoch in range(streams):
            gen = torch.Generator().manual_seed(epoch)
            rows = torch.randint(0, 256, (MC_ROWS, MC_WIDTH), generator=gen).to(torch.uint8)
            everything = np.arange(MC_ROWS)
            out = link.deliver(epoch=epoch, part=0, kind=KIND_SYMBOLS, num_rows=MC_ROWS,
                               row_bytes=MC_WIDTH, routes=Routes((everything,) * (world - 1)),
                               rows=rows if rank == 0 else None)  # fmt: skip
            exact &= out is None or torch.equal(out, rows)
            rounds.append(transport.rounds)
            paces.append(transport.settings()["pace_bits"])
        counts, _ = link.take_counts()
        return exact, counts.as_list(), rounds, transport.rebuilt, paces
    finally:
        transport.close()


MC_BASE = {"rate": "200mbit", "datagram_bytes": 512, "seed": 3}


@pytest.mark.distributed
@pytest.mark.skipif(not is_root(), reason="multicast runs only inside a private namespace (root)")
def test_multicast_parity_rebuilds_single_losses_where_they_happen():
    """3% of the datagrams lost at every receiver, parity every 8 datagrams: losses are
    rebuilt as the parity arrives. Every stream exact, the parity counted in the master's
    egress (the model: every datagram once, 20-byte headers, repairs, parity, feedback)."""
    options = {**MC_BASE, "drop": 0.03, "parity_block": 8}
    with private_netns() as ns:
        results = run_ranks(WORLD, _multicast_stream, options, 2, netns=ns)
    assert all(r[0] for r in results)
    rebuilt = [r[3] for r in results[1:]]
    assert sum(rebuilt) > 0, rebuilt  # losses rebuilt from parity, not by a repair round
    egress, _, repairs, control, parity, *_ = results[0][1]
    assert (
        parity > 0
        and egress
        == sum(
            DGRAM_HEAD * math.ceil(framed(MC_ROWS, MC_WIDTH, 4096) / 512)
            + framed(MC_ROWS, MC_WIDTH, 4096)
            for _ in range(2)
        )
        + repairs
        + parity
        + control
    )


@pytest.mark.distributed
@pytest.mark.skipif(not is_root(), reason="multicast runs only inside a private namespace (root)")
def test_multicast_repair_rounds_resend_every_missed_datagram_and_slow_down():
    """30% lost at every receiver, no parity: a round re-sends every datagram some receiver
    missed, so about log(260 * 3) / log(1 / 0.3) rounds suffice (a repair of only the first
    missing datagram per round would need hundreds); the pace falls below the rate."""
    options = {**MC_BASE, "drop": 0.3, "parity_block": 0}
    with private_netns() as ns:
        results = run_ranks(WORLD, _multicast_stream, options, 1, netns=ns)
    assert all(r[0] for r in results)
    rounds, paces = results[0][2], results[0][4]
    assert 1 <= rounds[0] <= 12, rounds
    assert paces[0] < 200e6  # lossy rounds slowed the master down


@pytest.mark.distributed
@pytest.mark.skipif(not is_root(), reason="multicast runs only inside a private namespace (root)")
def test_multicast_with_a_slowed_receiver_delivers_exactly_and_slows_down():
    """Rank 1 sleeps after every datagram, with a small socket buffer: it loses datagrams
    the others get; the repairs bring it every byte and the master's pace falls."""
    options = {**MC_BASE, "slow_seconds": 0.0005, "rcvbuf_bytes": 8192, "parity_block": 0}
    with private_netns() as ns:
        results = run_ranks(WORLD, _multicast_stream, options, 2, netns=ns)
    assert all(r[0] for r in results)
    assert results[0][1][2] > 0  # repairs ran
    assert min(results[0][4]) < 200e6, results[0][4]


@pytest.mark.distributed
@pytest.mark.skipif(not is_root(), reason="multicast runs only inside a private namespace (root)")
def test_multicast_sends_parity_only_while_the_network_loses_datagrams():
    """A clean network: the first stream carries parity (nothing known yet), the second none,
    and the pace stays at the rate. (A receiver that a busy machine descheduled may still miss
    a datagram: a run where any was missed, rebuilt or repaired, is not a clean one and is run
    again, up to three times.)"""
    for _ in range(3):
        with private_netns() as ns:
            results = run_ranks(WORLD, _multicast_stream, MC_BASE, 2, netns=ns)
        assert all(r[0] for r in results)
        if results[0][1][2] == 0 and not any(r[3] for r in results[1:]):
            break
    else:
        pytest.fail("no run of three without a lost datagram on an unlimited network")
    datagrams = math.ceil(framed(MC_ROWS, MC_WIDTH, 4096) / 512)
    parity = math.ceil(datagrams / 32) * (DGRAM_HEAD + 512)  # one stream's
    assert results[0][1][4] == parity
    assert results[0][4] == [200_000_000] * 2


def test_the_socket_plane_sends_parts_whole_and_names_a_peer_that_hangs_up():
    """``sendmsg`` may send part of what it is given: every byte still goes, in order; a
    connection closed mid-message is one ConnectionError naming the sender."""
    from coded_shuffle.distributed.transports.framing import Parts
    from coded_shuffle.distributed.transports.sockets import (
        receive_message,
        send_message,
    )

    a, b = socket.socketpair()
    with a, b:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # partial sends
        payload = torch.randint(0, 256, (3_000_000,), dtype=torch.uint8)
        header = bytes(range(24))
        got: list = []
        reader = threading.Thread(
            target=lambda: got.append(receive_message(b, 24 + payload.numel(), None, "rank 7"))
        )
        reader.start()
        assert send_message(a, Parts(header, payload)) == 24 + payload.numel()
        reader.join()
        assert got[0][:24].numpy().tobytes() == header and torch.equal(got[0][24:], payload)
        into = torch.empty(100, dtype=torch.uint8)
        a.sendall(header + bytes(50))
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(ConnectionError, match="rank 7 closed the connection after 50 of 100"):
            receive_message(b, 124, into, "rank 7")


STRANGER = "127.0.0.2"  # loopback, but not the address any rank was gathered at


def _strangers_at_the_listener(transport) -> None:
    """Three connections to rank 1's listener that are not rank 0 of this job: the right
    hello from another address, another job's hello from the right one, half a hello."""
    listener, job = transport.plane.listener.getsockname(), transport.peer.job
    knocks = [
        (STRANGER, HELLO.pack(0, job)),
        (listener[0], HELLO.pack(0, job ^ 1)),
        (listener[0], HELLO.pack(0, job)[:5]),
    ]
    for source, hello in knocks:
        with socket.create_connection(listener, timeout=5, source_address=(source, 0)) as s:
            s.sendall(hello)


@pytest.mark.distributed
def test_the_socket_plane_refuses_strangers_and_counts_them():
    """Only a rank of this job, from that rank's address, gets in: the strangers' connections
    are closed (three, counted at rank 1), the delivery is exact and counts what it did."""
    results = run_ranks(WORLD, _deliver, "unicast", {}, _strangers_at_the_listener)
    _check_rows(results, WORLD, "unicast")
    refused = [r[1][-1] for r in results]
    assert refused == [0, 3, 0, 0]
    clean = run_ranks(WORLD, _deliver, "unicast", {})
    assert [r[1][:-2] for r in results] == [r[1][:-2] for r in clean]  # bytes: the same


def _strangers_at_the_group(transport) -> None:
    """Datagrams to the job's group and port that look like its first stream's first one:
    the job's identifier from another address, another job's from the master's address."""
    group, job, payload = (transport.group, transport.port), transport.peer.job, b"\xff" * 512
    for source, who in ((STRANGER, job), (transport.master[0], job ^ 1)):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((source, 0))
            s.sendto(DGRAM.pack(who, 1, 0, 0, 0) + payload, group)


@pytest.mark.distributed
@pytest.mark.skipif(not is_root(), reason="multicast runs only inside a private namespace (root)")
def test_multicast_drops_datagrams_not_from_the_jobs_master_and_counts_them():
    """Every worker hears both strangers' datagrams and drops them (two each, counted), the
    delivery is exact; the group and port came from the job's identifier."""
    options = {"rate": "200mbit", "datagram_bytes": 512, "parity_block": 0}
    with private_netns() as ns:
        results = run_ranks(WORLD, _deliver, "multicast", options, _strangers_at_the_group,
                            netns=ns)  # fmt: skip
    _check_rows(results, WORLD, "multicast")
    foreign = [r[1][-2] for r in results]
    assert foreign == [0, 2, 2, 2]
    assert all(r[1][2] == 0 for r in results)  # nothing lost, nothing repaired


def test_a_jobs_multicast_group_and_port_come_from_its_identifier():
    from coded_shuffle.distributed.transports.multicast.options import job_group

    rng = np.random.default_rng(5)
    jobs = [int(j) for j in rng.integers(1, 2**63, 200, dtype=np.int64)]
    places = {job_group(j) for j in jobs}
    assert len(places) == len(jobs)  # two jobs: another group and port
    for group, port in places:
        octets = [int(x) for x in group.split(".")]
        assert octets[:2] == [239, 255] and all(1 <= x <= 254 for x in octets[2:])
        assert 10000 <= port < 20000
