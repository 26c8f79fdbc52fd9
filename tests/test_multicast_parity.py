"""Multicast's parity at a receiver (:mod:`~coded_shuffle.distributed.transports.multicast.
parity`): the repair datagrams of each window, in any order of arrival, some lost, rebuild
exactly what the equations in hand determine, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.costs.wire import DGRAM_HEADER, DGRAM_HEADER_BYTES
from coded_shuffle.distributed.transports.multicast.batches import (
    GRO_CMSG_BYTES,
    RECEIVE_BYTES,
    SendBatch,
    segment_size,
)
from coded_shuffle.distributed.transports.multicast.parity import (
    EQUATIONS,
    FLAG_PARITY,
    REPAIRS_SHIFT,
    STRIDE,
    Parity,
    encode,
    equations,
    is_repair,
    repairs,
    window_edges,
)
from tests.helpers import stream_bytes


def _members(size: int, count: int) -> np.ndarray:
    """``(count, size)``: which datagrams of a window of ``size`` each equation holds."""
    into = np.empty(EQUATIONS, dtype=np.int64)
    member = np.zeros((count, size), dtype=bool)
    for i in range(size):
        member[into[: equations(i, count, into)], i] = True
    return member


def _determined(member: np.ndarray, lost: np.ndarray) -> bool:
    """Whether equations ``member`` (rows) determine every lost datagram: the rank of their
    columns at ``lost`` over GF(2) is the number lost (the reference, by elimination on bits
    packed in Python integers)."""
    rows = [int("".join("1" if b else "0" for b in r[lost]) or "0", 2) for r in member]
    rank = 0
    for bit in reversed(range(int(lost.sum()))):
        pivot = next((r for r in rows if r >> bit & 1), None)
        if pivot is None:
            continue
        rows = [r ^ pivot if r >> bit & 1 else r for r in rows if r is not pivot]
        rank += 1
    return rank == int(lost.sum())


def test_the_repairs_are_each_the_xor_of_their_equations_datagrams():
    """:func:`encode` against its definition; every datagram in 8 distinct equations (half
    of them where there are fewer than 16), the same for the sender and every receiver (a
    pure function of place and R)."""
    d, size, count = 12, 100, 19
    rows = stream_bytes(size * d, d, seed=1).reshape(size, d)
    out = np.empty((count, d), dtype=np.uint8)
    encode(rows, out)
    member = _members(size, count)
    assert (member.sum(axis=0) == EQUATIONS).all()
    for r in range(count):
        assert np.array_equal(out[r], np.bitwise_xor.reduce(rows[member[r]], axis=0))
    assert (_members(5, 6).sum(axis=0) == 3).all()  # fewer than 16 equations: half of them
    assert np.array_equal(_members(size, count), member)


def test_repairs_follow_the_loss():
    """Expected losses, three standard deviations and 10 more; none at no loss; at most 255
    and the window's size."""
    assert repairs(2048, 0.01) == 45 and repairs(2048, 0.001) == 17
    assert repairs(2048, 0.05) == 143 and repairs(2048, 0.2) == 255
    assert repairs(2048, 0.0) == 0 and repairs(5, 0.01) == 5
    assert is_repair(FLAG_PARITY | 45 << REPAIRS_SHIFT) and not is_repair(FLAG_PARITY)


@st.composite
def losses(draw):
    d = draw(st.integers(4, 16))
    window = draw(st.sampled_from([64, 96, 128]))  # at most four windows: the ring keeps all
    total = draw(st.integers(1, 120 * d))
    n = -(-total // d)
    lost = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    lost &= np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    loss = draw(st.sampled_from([0.01, 0.1, 0.3]))
    late = draw(st.booleans())  # repairs first, the data after them (a late datagram)
    return d, window, total, lost, loss, late, draw(st.randoms(use_true_random=False))


@given(losses())
@settings(max_examples=200, deadline=None)
def test_repairs_rebuild_exactly_what_their_equations_determine_in_any_order(case):
    """Random losses (about a quarter), some repairs lost too, repairs in any order, before
    or after the data: a window is rebuilt whole where the repairs in hand determine all it
    lacks (the reference: the rank of their equations at its lost datagrams), else it is left
    as it was; every datagram held is the master's."""
    d, window, total, lost, loss, late, rnd = case
    data = stream_bytes(total, d, seed=int(lost.sum()))
    n = data.size // d
    rows = data.reshape(n, d)
    parity = Parity(total, d, window)
    out, have = np.zeros_like(data), np.zeros(n, dtype=bool)
    arrivals, inhand = [], {}
    edges = window_edges(n, window)
    for w in range(edges.size - 1):
        block = rows[edges[w] : edges[w + 1]]
        count = repairs(block.shape[0], loss)
        payloads = np.empty((count, d), dtype=np.uint8)
        encode(block, payloads)
        got = [r for r in range(count) if rnd.random() < 0.9]  # some repairs are lost too
        inhand[w] = (count, got)
        arrivals += [(w, r, count, payloads[r]) for r in got]
    rnd.shuffle(arrivals)

    def data_in():
        out.reshape(n, d)[~lost] = rows[~lost]
        have[~lost] = True

    if not late:
        data_in()
    for w, r, count, payload in arrivals:
        parity.receive(w * STRIDE + r, FLAG_PARITY | count << REPAIRS_SHIFT, payload, out, have)
    if late:
        data_in()
    parity.rebuild_all(out, have)
    for w, (count, got) in inhand.items():
        lo, hi = edges[w], edges[w + 1]
        member = _members(hi - lo, count)[got]
        whole = _determined(member, lost[lo:hi])
        assert have[lo:hi].all() == whole, (w, lost[lo:hi].sum(), len(got))
    assert np.array_equal(out.reshape(n, d)[have], rows[have])


def test_a_window_whose_last_repair_is_lost_is_solved_when_the_next_window_begins():
    """Windows of 16 datagrams, 3 lost in the first; its last repair lost: the first repair
    of the second window solves it; a window that lost more than it holds repairs for stays
    as it was."""
    d, window, total = 8, 16, 32 * 8
    data = stream_bytes(total, d, seed=5)
    rows = data.reshape(-1, d)
    parity = Parity(total, d, window)
    out, have = data.copy(), np.ones(32, dtype=bool)
    lost = [3, 9, 12, *range(17, 31)]
    out.reshape(-1, d)[lost], have[lost] = 0, False
    count = repairs(window, 0.01)  # 12, the last lost: fewer than the second window lost
    for w in (0, 1):
        payloads = np.empty((count, d), dtype=np.uint8)
        encode(rows[w * window : (w + 1) * window], payloads)
        flags = FLAG_PARITY | count << REPAIRS_SHIFT
        got = [
            parity.receive(w * STRIDE + r, flags, payloads[r], out, have) for r in range(count - 1)
        ]
        assert got[0] == (3 if w == 1 else 0) and sum(got) == got[0]  # at window 1's first
    assert have[:16].all() and not have[17:31].any()
    assert np.array_equal(out.reshape(-1, d)[have], rows[have])


def test_the_last_windows_halve_down_to_a_sixteenth():
    """Windows of 2,048 but the last ones 1,024, 512, 256, 128 and 128; the first takes what
    is left over; a stream shorter than the tail has only its last windows."""
    assert np.diff(window_edges(10550, 2048)).tolist() == [
        310,
        *[2048] * 4,
        1024,
        512,
        256,
        128,
        128,
    ]
    assert np.diff(window_edges(300, 2048)).tolist() == [44, 128, 128]
    assert np.diff(window_edges(100, 16)).tolist() == [4, *[16] * 6]
    assert window_edges(0, 2048).tolist() == [0] and window_edges(1, 2048).tolist() == [0, 1]


@pytest.mark.parametrize("gro", [True, False])
def test_repairs_sent_in_one_batch_arrive_as_repair_datagrams(udp_pair, gro):
    """``SendBatch.send_repairs`` over loopback: each datagram carries the repair flags with
    its window's count, its own number, and its payload byte for byte."""
    d, k, first, count = 500, 6, 3 * STRIDE + 40, 45
    payloads = np.random.default_rng(4).integers(0, 256, (k, d), dtype=np.uint8)
    rx, tx = udp_pair(gro)
    sent = SendBatch(tx, 16, d).send_repairs(payloads, first, count, (7, 9, 0))
    assert sent == k * (DGRAM_HEADER_BYTES + d)
    reads = np.empty(RECEIVE_BYTES, dtype=np.uint8)
    got = []
    while len(got) < k:
        nbytes, ancdata, _, _ = rx.recvmsg_into([memoryview(reads)], GRO_CMSG_BYTES)
        segment = segment_size(ancdata, nbytes)
        for at in range(0, nbytes, segment):
            got.append(reads[at : at + segment].copy())
    heads = np.stack([g[:DGRAM_HEADER_BYTES] for g in got]).view(DGRAM_HEADER).reshape(-1)
    assert heads["seq"].tolist() == list(range(first, first + k))
    assert (heads["flags"] == FLAG_PARITY | count << REPAIRS_SHIFT).all()
    assert (heads["stream"] == 9).all()
    assert np.array_equal(np.stack([g[DGRAM_HEADER_BYTES:] for g in got]), payloads)
