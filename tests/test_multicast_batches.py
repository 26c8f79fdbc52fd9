"""Multicast's datagrams in batches: the master's send buffer, the kernel's segmentation and
coalescing on a loopback socket, and a receiver's round taking any run of datagrams apart."""

from __future__ import annotations

import socket
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.costs.wire import (
    DGRAM_HEADER,
    DGRAM_HEADER_BYTES,
    default_datagram_bytes,
    wire_bytes,
)
from coded_shuffle.distributed.transports.base import HostBytes
from coded_shuffle.distributed.transports.multicast.batches import (
    GATHER_MAX_SECONDS,
    GATHER_MIN_SECONDS,
    GRO_CMSG_BYTES,
    RECEIVE_BYTES,
    UDP_GRO,
    SendBatch,
    batch_datagrams,
    gather_seconds,
    segment_size,
)
from coded_shuffle.distributed.transports.multicast.parity import (
    FLAG_PARITY,
    REPAIRS_SHIFT,
    STRIDE,
    Parity,
    encode,
)
from coded_shuffle.distributed.transports.multicast.receive import Debug, Handover, Round
from coded_shuffle.math.worker_program import first_missing
from tests.helpers import stream_bytes

JOB, STREAM = 0x1234_5678_9ABC_DEF0, 7
D = 100  # stream bytes per datagram in the synthetic runs


def run_of(
    data: np.ndarray,
    seqs: list[int],
    total: int,
    job: int = JOB,
    rnd: int = 0,
    stream: int = STREAM,
    d: int = D,
) -> tuple[np.ndarray, int]:
    """Datagrams ``seqs`` laid end to end as one coalesced read: (buffer, bytes read)."""
    segment = DGRAM_HEADER_BYTES + d
    buf = np.zeros(RECEIVE_BYTES + d, dtype=np.uint8)
    end = 0
    for i, seq in enumerate(seqs):
        length = min(d, total - seq * d)
        at = i * segment
        head = np.array([(job, stream, seq, rnd, 0)], dtype=DGRAM_HEADER)
        buf[at : at + DGRAM_HEADER_BYTES] = head.view(np.uint8)
        buf[at + DGRAM_HEADER_BYTES : at + DGRAM_HEADER_BYTES + length] = data[seq * d :][:length]
        end = at + DGRAM_HEADER_BYTES + length
    return buf, end


def new_round(total: int, rnd: int = 0, d: int = D, window: int = 0) -> Round:
    n = -(-total // d)
    out, have = np.zeros(n * d, dtype=np.uint8), np.zeros(n, dtype=bool)
    debug = Debug(0.0, 0.0, np.random.default_rng(0))
    return Round(JOB, STREAM, rnd, out, have, Parity(total, d, window), HostBytes(), debug)


def test_a_batch_is_a_millisecond_at_the_rate_within_the_kernels_limits():
    d = default_datagram_bytes(1500)
    frame = wire_bytes(DGRAM_HEADER_BYTES + d, 1500)
    assert d == 1452 and frame == 1514  # one Ethernet frame, no IP fragment
    assert batch_datagrams(400e6, frame, d) == 400e6 * 1e-3 / 8 // frame == 33
    assert batch_datagrams(1e6, frame, d) == 1  # slower than a frame per millisecond
    assert batch_datagrams(100e9, frame, d) == 65507 // (DGRAM_HEADER_BYTES + d)  # 64 KiB
    assert batch_datagrams(100e9, 546, 512) == 64  # the kernel's cap on segments


def test_a_receivers_pause_lets_at_most_a_quarter_of_its_buffer_gather():
    """The pause between reads: 3 ms where the buffer holds plenty (the cluster's forced
    256 MiB), shorter where a quarter of it fills sooner at the rate, none below 0.5 ms."""
    assert gather_seconds(400e6, 512 << 20) == GATHER_MAX_SECONDS == 0.003
    quarter = 425_984 / 4  # an unprivileged socket's buffer (the kernel's default cap)
    assert gather_seconds(400e6, 425_984) == pytest.approx(quarter / 50e6)  # 2.1 ms
    assert gather_seconds(10e9, 425_984) == 0.0  # 85 us: read at the next datagram
    assert gather_seconds(0.0, 512 << 20) == 0.0
    for rate in (1e6, 1e8, 1e9, 1e10):
        for held in (1 << 16, 1 << 20, 1 << 24, 1 << 28):
            pause = gather_seconds(rate, held)
            assert pause == 0.0 or GATHER_MIN_SECONDS <= pause <= GATHER_MAX_SECONDS
            assert pause * rate / 8 <= held / 4 + 1e-9


def test_segment_size_reads_the_coalescing_control_message_or_the_whole_read():
    assert segment_size([], 900) == 900
    size = struct.pack("=i", 1472)
    assert segment_size([(socket.SOL_UDP, UDP_GRO, size)], 40000) == 1472
    assert segment_size([(socket.SOL_IP, 8, size)], 40000) == 40000  # another level's


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(1, 40 * D),
    order=st.randoms(use_true_random=False),
    runs=st.lists(st.integers(1, 9), min_size=1, max_size=50),
    shuffled=st.booleans(),
)
def test_a_round_takes_any_runs_of_datagrams_apart_into_their_slots(total, order, runs, shuffled):
    """Every datagram, in order (the runs taken whole) or in any order, in runs of any
    length (a repeated one among them): the stream byte for byte, each counted once,
    nothing late or foreign."""
    data = stream_bytes(total, D)
    n = data.size // D
    seqs = list(range(n))
    if shuffled:
        order.shuffle(seqs)
    seqs.insert(order.randrange(n + 1), order.randrange(n))  # one datagram twice
    r = new_round(total)
    at = 0
    for length in [*runs, len(seqs)]:  # a last run takes what is left
        part = seqs[at : at + length]
        at += length
        if part:
            short = [s for s in part if s == n - 1]  # the stream's short last datagram
            for chunk in ([s for s in part if s != n - 1], short):  # it ends its own run
                if chunk:
                    buf, nbytes = run_of(data, chunk, total)
                    r.take(buf, nbytes, DGRAM_HEADER_BYTES + D)
    assert r.have.all() and r.count == r.received == n
    assert np.array_equal(r.out[:total], data[:total])
    assert r.late == 0 and r.counts.foreign == 0


def test_runs_in_order_with_gaps_held_or_late_datagrams_come_out_byte_for_byte():
    """Runs in order (the common read where a debug knob keeps the compiled loop away), then
    a run with a gap, one with a held datagram, another round's and the short last one: the
    stream comes out byte for byte, each datagram counted once."""
    total = 30 * D
    data = stream_bytes(total, D, seed=3)
    segment = DGRAM_HEADER_BYTES + D
    r = new_round(total)
    for lo in range(0, 12, 4):
        r.take(*run_of(data, list(range(lo, lo + 4)), total), segment)
    assert r.have[:12].all() and r.received == 12
    r.take(*run_of(data, [12, 14], total), segment)  # a gap
    r.take(*run_of(data, [11, 13], total), segment)  # 11 is held already
    r.take(*run_of(data, [15, 16], total, rnd=1), segment)  # another round's header
    r.take(*run_of(data, list(range(15, 29)), total), segment)
    r.take(*run_of(data, [29], total), segment)  # the stream's short last one
    assert r.have.all() and r.count == r.received == 30
    assert np.array_equal(r.out[:total], data[:total])


def test_a_round_drops_strangers_and_later_streams_and_counts_late_ones():
    total = 10 * D
    data = stream_bytes(total, D)
    r = new_round(total, rnd=1)
    segment = DGRAM_HEADER_BYTES + D
    r.take(*run_of(data, [0, 1, 2], total, job=JOB + 1), segment)  # another job's
    r.take(*run_of(data, [3, 4], total, stream=STREAM + 1), segment)  # a later stream's
    r.take(*run_of(data, [5, 6], total, stream=STREAM - 1), segment)  # an earlier one's
    r.take(*run_of(data, [7, 8], total, rnd=0), segment)  # this stream's, an earlier round
    assert r.counts.foreign == 3 and r.late == 4
    assert r.have.tolist() == [False] * 7 + [True, True, False]
    assert r.counts.ingress == 2 * segment  # only what the round took
    r.take(*run_of(data, [9], total), segment)  # alone: the one-datagram path
    assert r.have[9] and r.received == 3


@pytest.mark.parametrize("gro", [True, False])
def test_datagrams_sent_in_a_batch_arrive_whole_over_loopback(udp_pair, gro):
    """A batch through the kernel (segmented where it can, coalesced where the receiver asks)
    arrives as the same datagrams: every read taken apart gives the stream byte for byte."""
    d, total = 1000, 50 * 1000 - 123
    data = stream_bytes(total, d, seed=1)
    rx, tx = udp_pair(gro)
    batch = SendBatch(tx, 16, d)
    seqs = np.arange(data.size // d)
    sent = sum(
        batch.send(data, seqs[i : i + 16], (JOB, STREAM, 0), total) for i in range(0, seqs.size, 16)
    )
    assert sent == total + DGRAM_HEADER_BYTES * seqs.size
    r = new_round(total, d=d)
    reads = np.empty(RECEIVE_BYTES + d, dtype=np.uint8)
    into = [memoryview(reads)[:RECEIVE_BYTES]]
    calls = 0
    while not r.have.all():
        nbytes, ancdata, _, _ = rx.recvmsg_into(into, GRO_CMSG_BYTES)
        r.take(reads, nbytes, segment_size(ancdata, nbytes))
        calls += 1
    assert np.array_equal(r.out[:total], data[:total]) and r.received == seqs.size
    assert batch.gso  # the kernel segmented every batch (Linux >= 4.18)
    assert (calls < seqs.size) == gro  # coalesced only where the receiver asked


@pytest.mark.parametrize("gro", [True, False])
def test_repairs_sent_in_one_batch_rebuild_what_their_window_lacks(udp_pair, gro):
    """``SendBatch.send_repairs``: a window's repairs in one call (the stream's last
    datagram short, its padding zero) arrive as datagrams a round takes apart, coalesced or
    not: the last solves the window, which lacks three datagrams."""
    d, window, total, count = 1000, 16, 16 * 1000 - 77, 8
    data = stream_bytes(total, d, seed=2)
    data[total:] = 0
    rx, tx = udp_pair(gro)
    r = new_round(total, d=d, window=window)
    lost = [1, 6, 15]
    r.out[:total] = data[:total]
    r.have[:] = True
    r.have[lost] = False
    r.out.reshape(-1, d)[lost] = 0
    r.count = r.have.size - len(lost)
    payloads = np.empty((count, d), dtype=np.uint8)
    encode(data.reshape(-1, d), payloads)
    sent = SendBatch(tx, 16, d).send_repairs(payloads, 0, count, (JOB, STREAM, 0))
    assert sent == count * (DGRAM_HEADER_BYTES + d)
    reads = np.empty(RECEIVE_BYTES + d, dtype=np.uint8)
    into = [memoryview(reads)[:RECEIVE_BYTES]]
    while r.counts.ingress < sent:
        nbytes, ancdata, _, _ = rx.recvmsg_into(into, GRO_CMSG_BYTES)
        r.take(reads, nbytes, segment_size(ancdata, nbytes))
    assert r.have.all() and r.rebuilt == 3
    assert np.array_equal(r.out[:total], data[:total])


def test_repairs_in_an_in_order_run_rebuild_what_their_window_lacks():
    """Windows of 16 datagrams, each followed by its 6 repairs in the same run (as the
    master sends them while the network loses datagrams); datagrams 3 and 20 never arrive:
    their windows' repairs rebuild them, and the stream is whole."""
    total, window, count = 16 * 3 * D - 37, 16, 6
    data = stream_bytes(total, D)
    n = data.size // D
    r = new_round(total, window=window)
    segment = DGRAM_HEADER_BYTES + D
    flags = FLAG_PARITY | count << REPAIRS_SHIFT
    for w in range(n // window):
        seqs = [s for s in range(w * window, (w + 1) * window) if s not in (3, 20)]
        buf, nbytes = run_of(data, seqs, total)
        payloads = np.empty((count, D), dtype=np.uint8)
        encode(data.reshape(n, D)[w * window : (w + 1) * window], payloads)
        heads = np.array(
            [(JOB, STREAM, w * STRIDE + i, 0, flags) for i in range(count)], dtype=DGRAM_HEADER
        ).view(np.uint8)
        repaired = np.concatenate([heads.reshape(count, -1), payloads], axis=1).reshape(-1)
        if nbytes % segment == 0:
            buf[nbytes : nbytes + repaired.size] = repaired
            r.take(buf, nbytes + repaired.size, segment)
        else:  # the stream's short last datagram ends its run: the repairs in a run of their own
            r.take(buf, nbytes, segment)
            one = np.zeros(RECEIVE_BYTES, dtype=np.uint8)
            one[: repaired.size] = repaired
            r.take(one, repaired.size, segment)
    assert r.rebuilt == 2 and r.have.all() and r.received == n - 2
    assert np.array_equal(r.out[:total], data[:total])


@settings(max_examples=60, deadline=None)
@given(held=st.lists(st.booleans(), max_size=40), data=st.data(), step=st.integers(1, 7))
def test_the_first_missing_datagram_is_the_one_a_scan_finds(held, data, step):
    """``first_missing`` (``step`` datagrams at a time) names the datagram a scan one by one
    from ``start`` stops at: the first not held, or the stream's end."""
    have = np.array(held, dtype=bool)
    start = data.draw(st.integers(0, have.size))
    scan = start
    while scan < have.size and have[scan]:
        scan += 1
    assert first_missing(have, start, step) == scan


def test_a_receiver_hands_on_the_messages_past_a_lost_datagram():
    """Four messages of 10 bytes in datagrams of 4 (a datagram may hold two messages' bytes),
    datagram 3 (message 1's) lost: message 0 goes in order, messages 2 and 3 past the loss
    (3 only where it is given), message 1 once the repair brings datagram 3; none twice."""
    for gets, want in (
        (np.ones(4, bool), [0, 2, 3, 1]),
        (np.array([1, 1, 1, 0], bool), [0, 2, 1]),
    ):
        handed: list[int] = []
        handover = Handover(np.arange(0, 50, 10), 4, gets, handed.append)
        have = np.ones(10, dtype=bool)
        have[3] = False
        handover.upto(3)
        handover.past(have)
        assert handed == want[:-1]
        handover.past(have)  # a second look hands on nothing again
        assert handed == want[:-1]
        have[3] = True
        handover.upto(10)
        handover.past(have)
        assert handed == want
