"""The TCP transports over real process groups: every one delivers exactly and counts the bytes
of its cost model (transports.md, computed here independently); chain relays forward only
what is kept further on; the socket plane sends whole parts and refuses strangers."""

from __future__ import annotations

import hashlib
import socket
import threading
from datetime import timedelta

import numpy as np
import pytest
import torch

from coded_shuffle.distributed.transports import (
    Link,
    Peer,
    Routes,
    build_transport,
)
from coded_shuffle.distributed.transports.framing import (
    HEADER_BYTES,
    KIND_SYMBOLS,
)
from coded_shuffle.distributed.transports.sockets import HELLO
from tests.links import (
    CHUNK,
    GLOO,
    N_ROWS,
    STRANGER,
    WIDTH,
    WORLD,
    L,
    check_rows,
    deliver_rows,
    framed,
    routes_for,
)
from tests.ranks import run_ranks


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("name", "options"),
    [("tree", {}), ("chain", {}), ("unicast", {}), ("p2p", {}), ("chain", GLOO), ("unicast", GLOO)],
)
def test_tcp_transports_deliver_exactly_and_count_their_model(name, options):
    results = run_ranks(WORLD, deliver_rows, name, options)
    check_rows(results, WORLD, name)
    egress = [r[1][0] for r in results]
    ingress = [r[1][1] for r in results]
    needs, senders = routes_for(name, WORLD)
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
        out = link.deliver(
            epoch=3,
            part=0,
            kind=KIND_SYMBOLS,
            num_rows=N_ROWS,
            row_bytes=WIDTH,
            routes=routes,
            rows=rows if rank == 0 else None,
        )
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
        out = link.deliver(
            epoch=2,
            part=0,
            kind=KIND_SYMBOLS,
            num_rows=BIG_ROWS,
            row_bytes=BIG_WIDTH,
            routes=Routes((everything,) * (world - 1)),
            rows=rows if rank == 0 else None,
        )
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
    results = run_ranks(WORLD, deliver_rows, "unicast", {}, _strangers_at_the_listener)
    check_rows(results, WORLD, "unicast")
    refused = [r[1][-1] for r in results]
    assert refused == [0, 3, 0, 0]
    clean = run_ranks(WORLD, deliver_rows, "unicast", {})
    assert [r[1][:-2] for r in results] == [r[1][:-2] for r in clean]  # bytes: the same
