"""Multicast over real process groups in a private namespace: repairs, parity, slowed receivers,
and the job's own group, port and master."""

from __future__ import annotations

import dataclasses
import math
import socket
from collections.abc import Callable
from datetime import timedelta

import numpy as np
import pytest
import torch

from coded_shuffle.costs.wire import DGRAM_HEADER
from coded_shuffle.costs.wire import DGRAM_HEADER_BYTES as DGRAM_HEAD
from coded_shuffle.distributed.transports import (
    Link,
    Peer,
    Routes,
    build_transport,
)
from coded_shuffle.distributed.transports.framing import (
    KIND_SYMBOLS,
)
from coded_shuffle.distributed.transports.multicast.parity import (
    LOSS_PRIOR,
    repairs,
    window_edges,
)
from tests.links import (
    STRANGER,
    WORLD,
    L,
    check_rows,
    deliver_rows,
    framed,
)
from tests.ranks import is_root, private_netns, run_ranks

MC_ROWS, MC_WIDTH = 2000, 64  # about 260 datagrams of 512 bytes


@pytest.mark.distributed
@pytest.mark.skipif(not is_root(), reason="multicast runs only inside a private namespace (root)")
@pytest.mark.parametrize("drop", [0.0, 0.3])
def test_multicast_repairs_what_receivers_miss_and_counts_it(drop):
    """Every byte delivered and counted; with 30% lost and no parity (which would rebuild
    the losses of so short a stream), by repair rounds."""
    window = 0 if drop else 2048
    options = {"rate": "200mbit", "datagram_bytes": 512, "drop": drop, "parity_window": window}
    with private_netns() as ns:
        results = run_ranks(WORLD, deliver_rows, "multicast", options, netns=ns)
    check_rows(results, WORLD, "multicast")
    egress, ingress, repairs, control, parity, *_ = zip(*(r[1] for r in results), strict=True)
    datagrams = math.ceil(L / 512)
    # the first stream carries parity: the repairs of each window of 2,048 datagrams for the
    # loss assumed before any report, 512 bytes each (20-byte header)
    windows = _windows(datagrams) if window else [0]
    assert parity[0] == sum(windows) * (DGRAM_HEAD + 512)
    assert parity[1:] == (0, 0, 0)
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
        # (a receiver stops reading once it has every datagram: the last window's repairs and
        # the round's end, sent after it, are not read in this stream)
        heard = parity[0] - windows[-1] * (DGRAM_HEAD + 512)
        assert list(ingress[1:]) == [L + DGRAM_HEAD * datagrams + heard + 4 + bitmap] * (WORLD - 1)
        # each worker sends its bitmap (the master sends the union to each one itself)
        assert control[1:] == (bitmap, bitmap, bitmap)
        # "round sent" and the union to each, and the round's end (one header, to the group)
        assert control[0] == 4 * (WORLD - 1) + bitmap * (WORLD - 1) + DGRAM_HEAD
    else:  # datagrams dropped at the receivers were not counted as received
        assert all(i < egress[0] for i in ingress[1:])


def _windows(datagrams: int, window: int = 2048, loss: float = LOSS_PRIOR) -> list[int]:
    """The repair datagrams of each window of a stream of ``datagrams``."""
    return [repairs(int(size), loss) for size in np.diff(window_edges(datagrams, window))]


def _multicast_stream(
    rank: int, world: int, options: dict, streams: int, kept: Callable | None = None
) -> tuple:
    """``streams`` broadcast streams of random rows over multicast, every worker keeping every
    row (or ``kept(worker)``'s); per rank: whether every kept row arrived exactly, its counts,
    repair rounds, rebuilt datagrams, the pace of each, the slow workers it knew."""
    transport = build_transport("multicast", Peer(rank, world, timedelta(seconds=30)), options)
    try:
        link = Link(transport, 4096)
        exact, rounds, paces = True, [], []
        every = np.arange(MC_ROWS)
        needs = tuple(every if kept is None else kept(w) for w in range(1, world))
        for epoch in range(streams):
            gen = torch.Generator().manual_seed(epoch)
            rows = torch.randint(0, 256, (MC_ROWS, MC_WIDTH), generator=gen).to(torch.uint8)
            out = link.deliver(
                epoch=epoch,
                part=0,
                kind=KIND_SYMBOLS,
                num_rows=MC_ROWS,
                row_bytes=MC_WIDTH,
                routes=Routes(needs),
                rows=rows if rank == 0 else None,
            )
            if out is not None:
                exact &= torch.equal(out, rows[torch.from_numpy(needs[rank - 1])])
            rounds.append(transport.rounds)
            paces.append(transport.settings()["pace_bits"])
        counts, _ = link.take_counts()
        slow = transport.settings()["slow_workers"]
        return exact, dataclasses.astuple(counts), rounds, transport.rebuilt, paces, slow
    finally:
        transport.close()


MC_BASE = {"rate": "200mbit", "datagram_bytes": 512, "seed": 3}


def _kept_rows(worker: int) -> np.ndarray:
    """Worker ``worker``'s rows of an uneven stream: about two thirds, in runs of 256 rows
    (four messages; one run in three left to the others)."""
    rows = np.arange(MC_ROWS)
    return rows[(rows // 256) % 3 != worker - 1]


@pytest.mark.distributed
@pytest.mark.skipif(not is_root(), reason="multicast runs only inside a private namespace (root)")
@pytest.mark.parametrize("drop", [0.0, 0.2])
def test_multicast_sends_a_slow_worker_only_what_it_keeps(drop):
    """Worker 2 paced at a quarter of the others (``receiver_rates``): it joins only the
    groups of the datagrams it keeps and hears only those (about two thirds of the stream;
    the others every datagram), every kept row exact, with losses repaired; the master sends
    every datagram once (20-byte headers), its repairs and the feedback, no parity."""
    options = {
        **MC_BASE,
        "drop": drop,
        "receiver_rates": ["200mbit", "50mbit", "200mbit"],
    }
    with private_netns() as ns:
        results = run_ranks(WORLD, _multicast_stream, options, 2, _kept_rows, netns=ns)
    assert all(r[0] for r in results)
    assert all(r[5] == [2] for r in results)
    egress, _, repairs, control, parity, *_ = results[0][1]
    stream = framed(MC_ROWS, MC_WIDTH, 4096)
    assert parity == 0
    assert egress == 2 * (stream + DGRAM_HEAD * math.ceil(stream / 512)) + repairs + control
    ingress = [r[1][1] for r in results[1:]]
    fast = min(ingress[0], ingress[2])
    assert fast >= egress - control - repairs  # the fast workers: every datagram
    if drop == 0:
        assert 0.6 * fast < ingress[1] < 0.8 * fast, ingress  # the slow one: its own
    else:
        assert repairs > 0 and ingress[1] < fast, ingress


def _kept_in_quarters(worker: int) -> np.ndarray:
    """Runs of 256 rows in four classes: workers 1 and 2 keep their own class and the
    shared fourth (half the rows each, three quarters together), worker 3 every row."""
    rows = np.arange(MC_ROWS)
    cls = (rows // 256) % 4
    return rows if worker == 3 else rows[(cls == worker - 1) | (cls == 3)]


@pytest.mark.distributed
@pytest.mark.skipif(not is_root(), reason="multicast runs only inside a private namespace (root)")
@pytest.mark.parametrize(("lanes", "drop", "share"), [(2, 0.0, 0.5), (1, 0.0, 0.75), (1, 0.2, 0)])
def test_slow_workers_in_one_lane_hear_what_either_keeps(lanes, drop, share):
    """Workers 1 and 2 slow (100 and 50 of 200 Mbit/s), each keeping half the rows, three
    quarters together: in a lane each (``slow_lanes=2``) each hears its own half, in one lane
    (``slow_lanes=1``, slowest first) both hear the three quarters either keeps; every kept
    row exact, losses repaired in the shared lane too."""
    options = {
        **MC_BASE,
        "drop": drop,
        "receiver_rates": ["100mbit", "50mbit", "200mbit"],
        "slow_lanes": lanes,
    }
    with private_netns() as ns:
        results = run_ranks(WORLD, _multicast_stream, options, 2, _kept_in_quarters, netns=ns)
    assert all(r[0] for r in results)
    assert all(r[5] == [1, 2] for r in results)
    egress, _, repairs, control, *_ = results[0][1]
    ingress = [r[1][1] for r in results[1:]]
    if drop:
        assert repairs > 0 and max(ingress[:2]) < ingress[2], ingress
        return
    assert repairs == 0 and ingress[2] >= egress - control  # the fast worker: every datagram
    for heard in ingress[:2]:
        assert share - 0.08 < heard / ingress[2] < share + 0.08, ingress


@pytest.mark.distributed
@pytest.mark.skipif(not is_root(), reason="multicast runs only inside a private namespace (root)")
def test_multicast_parity_rebuilds_single_losses_where_they_happen():
    """3% of the datagrams lost at every receiver, windows of 64 datagrams: losses are
    rebuilt as each window's repairs arrive. Every stream exact, the parity counted in the
    master's egress (the model: every datagram once, 20-byte headers, repairs, parity,
    feedback), the second stream's sized by the first's loss."""
    options = {**MC_BASE, "drop": 0.03, "parity_window": 64}
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
    options = {**MC_BASE, "drop": 0.3, "parity_window": 0}
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
    options = {**MC_BASE, "slow_seconds": 0.0005, "rcvbuf_bytes": 8192, "parity_window": 0}
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
    parity = sum(_windows(datagrams)) * (DGRAM_HEAD + 512)  # one stream's
    assert results[0][1][4] == parity
    assert results[0][4] == [200_000_000] * 2


def _strangers_at_the_group(transport) -> None:
    """Datagrams to the job's group and port that look like its first stream's first one:
    the job's identifier from another address, another job's from the master's address."""
    group, job, payload = (transport.group, transport.port), transport.peer.job, b"\xff" * 512
    for source, who in ((STRANGER, job), (transport.master[0], job ^ 1)):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((source, 0))
            s.sendto(np.array([(who, 1, 0, 0, 0)], DGRAM_HEADER).tobytes() + payload, group)


@pytest.mark.distributed
@pytest.mark.skipif(not is_root(), reason="multicast runs only inside a private namespace (root)")
def test_multicast_drops_datagrams_not_from_the_jobs_master_and_counts_them():
    """Every worker hears both strangers' datagrams and drops them (two each, counted), the
    delivery is exact; the group and port came from the job's identifier."""
    options = {"rate": "200mbit", "datagram_bytes": 512, "parity_window": 0}
    with private_netns() as ns:
        results = run_ranks(
            WORLD, deliver_rows, "multicast", options, _strangers_at_the_group, netns=ns
        )
    check_rows(results, WORLD, "multicast")
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
