"""Multicast's parity at a receiver (:mod:`~coded_shuffle.distributed.transports.multicast.
parity`): block parity and column parity over squares of blocks, in any order of arrival,
rebuild exactly what a peeling decoder can, byte for byte."""

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
    FLAG_COLUMN,
    FLAG_PARITY,
    Parity,
    square_columns,
)


def _master(total: int, d: int, block: int, depth: int, seed: int) -> tuple:
    """The stream (zero padded), its block parities and its column parities, as the master
    computes them (:func:`square_columns`, one square at a time)."""
    n = -(-total // d)
    data = np.zeros(n * d, dtype=np.uint8)
    data[:total] = np.random.default_rng(seed).integers(0, 256, total, dtype=np.uint8)
    rows = data.reshape(n, d)
    blocks = [np.bitwise_xor.reduce(rows[b : b + block], axis=0) for b in range(0, n, block)]
    size = depth * block
    columns = []
    for lo in range(0, n, size) if depth else ():
        square = rows[lo : lo + size]
        columns += list(square_columns(square, block)[: square.shape[0]])
    return data, blocks, columns


def _column(c: int, n: int, block: int, depth: int) -> range:
    """The datagrams (of ``n``) that column ``c`` covers: position ``c % block`` of each
    block of square ``c // block`` (``depth`` blocks)."""
    square, position = divmod(c, block)
    lo = square * depth * block
    return range(lo + position, min(n, lo + depth * block), block)


def _peeled(lost: set, n: int, block: int, depth: int, got_rows: set, got_columns: set) -> set:
    """What a peeling decoder leaves missing: while a block or a column whose parity came
    lacks exactly one datagram, that one is rebuilt."""
    groups = [range(b * block, min(n, (b + 1) * block)) for b in sorted(got_rows)]
    groups += [_column(c, n, block, depth) for c in sorted(got_columns)]
    missing = set(lost)
    while True:
        single = [set(g) & missing for g in groups if len(set(g) & missing) == 1]
        if not single:
            return missing
        missing -= set.union(*single)


@st.composite
def losses(draw):
    d = draw(st.integers(4, 16))
    block, depth = draw(st.integers(2, 6)), draw(st.sampled_from([0, 2, 3, 4]))
    total = draw(st.integers(1, 40 * d))
    n = -(-total // d)
    lost = draw(st.sets(st.integers(0, n - 1), max_size=n))
    late = draw(st.booleans())  # parity first, the data after it (a late datagram)
    return d, block, depth, total, lost, late, draw(st.randoms(use_true_random=False))


@given(losses())
@settings(max_examples=300, deadline=None)
def test_parity_rebuilds_exactly_what_peeling_can_in_any_order(case):
    d, block, depth, total, lost, late, rnd = case
    data, blocks, columns = _master(total, d, block, depth, seed=len(lost))
    n = data.size // d
    parity = Parity(total, d, block, depth)
    out, have = np.zeros_like(data), np.zeros(n, dtype=bool)
    arrivals = [(False, b) for b in range(len(blocks))] + [(True, c) for c in range(len(columns))]
    arrivals = [a for a in arrivals if rnd.random() < 0.9]  # some parity is lost too
    rnd.shuffle(arrivals)
    kept = [j for j in range(n) if j not in lost]

    def data_in():
        out.reshape(n, d)[kept] = data.reshape(n, d)[kept]
        have[kept] = True

    if not late:
        data_in()
    for column, b in arrivals:
        parity.receive(b, (columns if column else blocks)[b], out, have, column)
    if late:
        data_in()
        parity.rebuild_all(out, have)
    got_rows = {b for c, b in arrivals if not c}
    got_columns = {b for c, b in arrivals if c and depth}
    want = _peeled(lost, n, block, depth, got_rows, got_columns)
    assert set(np.flatnonzero(~have).tolist()) == want
    assert np.array_equal(out.reshape(n, d)[have], data.reshape(n, d)[have])


@pytest.mark.parametrize("with_columns", [True, False])
def test_columns_rebuild_a_block_that_lost_two(with_columns):
    """Squares of 4 blocks of 4: block 1 lost datagrams 4 and 5; column 0 rebuilds 4, then
    block 1's parity rebuilds 5. Without column parity both stay lost."""
    d, block, depth, total = 8, 4, 4, 16 * 8
    data, blocks, columns = _master(total, d, block, depth, seed=3)
    parity = Parity(total, d, block, depth if with_columns else 0)
    out, have = data.copy(), np.ones(16, dtype=bool)
    out[4 * d : 6 * d], have[[4, 5]] = 0, False
    assert parity.receive(1, blocks[1], out, have) == 0  # lacks two
    rebuilt = parity.receive(0, columns[0], out, have, column=True)
    assert rebuilt == (2 if with_columns else 0)
    assert have.all() == with_columns and np.array_equal(out, data) == with_columns


@pytest.mark.parametrize("gro", [True, False])
def test_column_parity_sent_in_one_batch_arrives_as_column_datagrams(udp_pair, gro):
    """``SendBatch.send_columns`` over loopback: each datagram carries the column parity
    flags and its column's number, and its payload byte for byte."""
    d, k, first = 500, 6, 40
    columns = np.random.default_rng(4).integers(0, 256, (k, d), dtype=np.uint8)
    rx, tx = udp_pair(gro)
    sent = SendBatch(tx, 16, d).send_columns(columns, first, (7, 9, 0))
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
    assert (heads["flags"] == FLAG_PARITY | FLAG_COLUMN).all() and (heads["stream"] == 9).all()
    assert np.array_equal(np.stack([g[DGRAM_HEADER_BYTES:] for g in got]), columns)
