"""A multicast receiver's compiled loop (:class:`Drain`) over a loopback socket: it takes the
common reads exactly as :class:`Round` would, and leaves every other read to it."""

from __future__ import annotations

import select
import socket
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coded_shuffle.costs.wire import DGRAM_HEADER, DGRAM_HEADER_BYTES
from coded_shuffle.distributed.transports.base import HostBytes
from coded_shuffle.distributed.transports.multicast.batches import (
    RECEIVE_BYTES,
    SendBatch,
)
from coded_shuffle.distributed.transports.multicast.drain import (
    DONE,
    EMPTY,
    OTHER,
    STATUS,
    Drain,
    _drain,
    header_layout,
)
from coded_shuffle.distributed.transports.multicast.parity import (
    STRIDE,
    Parity,
    encode,
    repairs,
)
from coded_shuffle.distributed.transports.multicast.receive import Debug, Round
from tests.helpers import stream_bytes

JOB, STREAM, D = 0x0BAD_F00D_1234_5678, 3, 1000


class Loopback:
    """A sender and a receiver (coalescing where asked) on 127.0.0.1, and a drain on it."""

    def __init__(self, rx: socket.socket, tx: socket.socket) -> None:
        self.rx, self.tx = rx, tx
        self.reads = np.zeros(RECEIVE_BYTES + D, dtype=np.uint8)
        self.drain = Drain(self.rx, self.reads)
        self.drain.expect(self.tx.getsockname())
        self.poller = select.poll()
        self.poller.register(self.rx, select.POLLIN)
        self.taken = 0  # datagrams the drain took (the rest: the round's)
        self.handed = 0  # reads of the sender's that the drain left to the round

    def send(self, data: np.ndarray, seqs: list[int], total: int, rnd: int = 0) -> int:
        """Datagrams ``seqs`` of round ``rnd`` in one batch; the bytes sent."""
        batch = SendBatch(self.tx, max(len(seqs), 1), D)
        return batch.send(data, np.asarray(seqs), (JOB, STREAM, rnd), total)

    def send_repairs(self, data: np.ndarray, window: int, w: int, which: range) -> int:
        """Repairs ``which`` of window ``w`` (of ``window`` datagrams; as many as a loss of 1%
        calls for), in one batch, as the master sends them; the bytes sent."""
        rows = data.reshape(-1, D)[w * window : (w + 1) * window]
        payloads = np.empty((repairs(rows.shape[0], 0.01), D), dtype=np.uint8)
        encode(rows, payloads)
        batch = SendBatch(self.tx, len(which), D)
        head = (JOB, STREAM, 0)
        return batch.send_repairs(payloads[which], w * STRIDE + which[0], len(payloads), head)

    def receive(self, now: Round, sent: int, others: list[tuple[str, int]] | None = None) -> None:
        """Reads until ``sent`` bytes of the sender's are counted: the drain's, and the rest
        taken by ``now`` (a stranger's reads are noted in ``others``)."""
        while now.counts.ingress < sent:
            status = self.drain.run(now)
            self.taken += self.drain.taken
            if status == OTHER and self.drain.sender() == self.tx.getsockname():
                now.take(self.reads, self.drain.nbytes, self.drain.segment)
                self.handed += 1
            elif status == OTHER and others is not None:
                others.append(self.drain.sender())
            elif status == EMPTY and not self.drain.taken:
                assert self.poller.poll(2000), "nothing arrived"
            elif status == DONE:
                break  # the round holds every datagram: what is left is read no more


@pytest.fixture
def loopbacks(udp_pair) -> Callable[[bool], Loopback]:
    """Makes fresh loopback pairs (coalescing or not: ``udp_pair``), closed after the test."""
    return lambda gro=True: Loopback(*udp_pair(gro))


def new_round(total: int, rnd: int = 0, window: int = 0) -> Round:
    n = -(-total // D)
    out, have = np.zeros(n * D, dtype=np.uint8), np.zeros(n, dtype=bool)
    debug = Debug(0.0, 0.0, np.random.default_rng(0))
    return Round(JOB, STREAM, rnd, out, have, Parity(total, D, window), HostBytes(), debug)


@pytest.mark.parametrize("gro", [True, False])
def test_the_loop_takes_a_whole_stream_byte_for_byte(loopbacks, gro):
    """Runs of 16 (coalesced where asked, one datagram per read where not), the stream's
    last datagram short: every byte in its slot, every datagram and byte counted once, and
    the drain says the round is complete."""
    loopback = loopbacks(gro)
    total = 40 * D - 321
    data = stream_bytes(total, D)
    sent = sum(loopback.send(data, list(range(i, min(40, i + 16))), total) for i in (0, 16, 32))
    now = new_round(total)
    loopback.receive(now, sent)
    assert np.array_equal(now.out[:total], data[:total])
    assert now.have.all() and now.count == now.received == 40
    assert loopback.taken >= 16  # the full runs in the compiled loop (the short last: Round)
    assert now.counts.ingress == sent == total + 40 * DGRAM_HEADER_BYTES


@pytest.mark.parametrize("gro", [True, False])
def test_a_rounds_end_ends_it_and_an_earlier_rounds_end_is_neither_late_nor_counted(loopbacks, gro):
    """Round 1 of 20 datagrams with datagram 10 lost, then round 0's end (read late) and
    round 1's: the round holds the other 19, has read its end (the receiver reports at once),
    counts nothing late, and counts the bytes of its own end only."""
    loopback = loopbacks(gro)
    total = 20 * D
    data = stream_bytes(total, D)
    sent = loopback.send(data, list(range(10)), total, rnd=1)
    sent += loopback.send(data, list(range(11, 20)), total, rnd=1)
    batch = SendBatch(loopback.tx, 1, D)
    batch.send_end((JOB, STREAM, 0))
    sent += batch.send_end((JOB, STREAM, 1))
    now = new_round(total, rnd=1)
    assert not now.ended
    loopback.receive(now, sent)
    assert now.ended and now.late == 0 and now.count == 19 and not now.have[10]
    assert now.counts.ingress == sent == 19 * (D + DGRAM_HEADER_BYTES) + DGRAM_HEADER_BYTES


def test_a_stranger_another_round_and_held_datagrams_are_left_to_the_round(loopbacks):
    """A stranger's read, a read of another round and runs with held datagrams come back as
    OTHER and take nothing: the round counts them as it always did (datagram 19 never comes,
    so the round stays open)."""
    loopback = loopbacks()
    total = 20 * D
    data = stream_bytes(total, D, seed=1)
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        stranger.connect(loopback.rx.getsockname())
        stranger.send(b"x" * 64)
        address = stranger.getsockname()
        now = new_round(total, rnd=1)
        others: list[tuple[str, int]] = []
        sent = loopback.send(data, list(range(10)), total, rnd=0)  # late: an earlier round's
        sent += loopback.send(data, list(range(5, 16)), total, rnd=1)  # 5-9 held by now
        sent += loopback.send(data, [7, 8, 9], total, rnd=1)
        sent += loopback.send(data, [16, 17, 18], total, rnd=1)  # the common case
        loopback.receive(now, sent, others)
    finally:
        stranger.close()
    assert others == [address]
    assert now.have[:19].all() and not now.have[19]
    assert np.array_equal(now.out[: 19 * D], data[: 19 * D])
    assert now.received == 19 and now.late == 10


@pytest.mark.parametrize("gro", [True, False])
@pytest.mark.parametrize("last_lost", [False, True])
def test_repairs_are_taken_in_the_loop_and_rebuild_what_their_window_lacks(
    loopbacks, gro, last_lost
):
    """Windows of 16 datagrams, each followed by its 12 repairs in one batch (as the master
    sends a stream's first round): the loop keeps every repair, counting its bytes, and the
    first window, which lacks datagrams 3 and 9, is solved there at its last repair, or
    (that one lost) at the second window's first (the second window's other repairs come
    after the round is complete: they are not read). Nothing is left to the round."""
    loopback = loopbacks(gro)
    total, window = 32 * D, 16
    data = stream_bytes(total, D, seed=4)
    now = new_round(total, window=window)
    sent = sum(loopback.send(data, list(run), total) for run in (range(3), range(4, 9)))
    sent += loopback.send(data, list(range(10, 16)), total)
    sent += loopback.send_repairs(data, window, 0, range(11 if last_lost else 12))
    sent += loopback.send(data, list(range(16, 32)), total)
    sent += loopback.send_repairs(data, window, 1, range(1)) if last_lost else 0
    loopback.receive(now, sent)
    assert np.array_equal(now.out, data) and now.have.all()
    assert now.rebuilt == 2 and now.count == 32 and now.received == 30
    assert loopback.taken == 30 and loopback.handed == 0
    assert now.counts.ingress == sent


def test_a_loop_on_a_complete_round_reads_nothing(loopbacks):
    """A round that holds every datagram: DONE at once, the socket left as it was."""
    loopback = loopbacks()
    total = 4 * D
    data = stream_bytes(total, D, seed=2)
    now = new_round(total)
    now.have[:] = True
    now.count = 4
    loopback.send(data, [0, 1], total)
    assert loopback.drain.run(now) == DONE and loopback.drain.taken == 0
    assert loopback.poller.poll(2000)  # still queued


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    runs=st.lists(
        st.tuples(st.integers(0, 28), st.integers(1, 12), st.integers(0, 1)), min_size=1, max_size=8
    )
)
def test_any_runs_end_as_the_round_alone_would_take_them(loopbacks, runs):
    """Runs of any start, length and round (some repeated, some late), sent in turn: the slots,
    the datagrams held and the counts are those of the datagrams sent (the last datagram never
    comes: the round stays open until every read is in)."""
    loopback = loopbacks()
    total = 30 * D - 17
    data = stream_bytes(total, D, seed=3)
    now = new_round(total, rnd=1)
    sent, held, late = 0, set(), 0
    for start, length, rnd in runs:
        seqs = list(range(start, min(29, start + length)))
        sent += loopback.send(data, seqs, total, rnd=rnd)
        held |= set(seqs)
        late += len(seqs) * (rnd == 0)
    loopback.receive(now, sent)
    mine = np.zeros(30, dtype=bool)
    mine[sorted(held)] = True
    assert np.array_equal(now.have, mine) and now.received == len(held)
    slots, want = now.out.reshape(30, D)[mine], data.reshape(30, D)[mine]
    assert np.array_equal(slots, want) and now.late == late
    assert now.counts.ingress == sent


# the same fields at other offsets: what a changed definition of the header would be
MOVED = np.dtype(
    {
        "names": ["job", "stream", "seq", "round", "flags"],
        "formats": ["<u8", "<u4", "<u4", "<u2", "<u2"],
        "offsets": [12, 8, 0, 6, 4],
        "itemsize": 20,
    }
)


@pytest.mark.parametrize("header", [DGRAM_HEADER, MOVED], ids=["defined", "moved"])
def test_the_compiled_loop_reads_the_header_where_its_definition_puts_it(loopbacks, header):
    """Datagrams framed with a header laid out otherwise: the loop, given that layout (as
    :func:`header_layout` derives it from the one definition), takes them all; with the
    other layout it takes none (every header differs from the round's)."""
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (5, D), dtype=np.uint8)
    wrong = MOVED if header is DGRAM_HEADER else DGRAM_HEADER
    for layout, takes in ((header_layout(header), True), (header_layout(wrong), False)):
        net = loopbacks(False)
        net.drain.layout = layout
        for seq, row in enumerate(data):
            head = np.array([(JOB, STREAM, seq, 2, 0)], dtype=header).view(np.uint8)
            net.tx.sendmsg([head, row])
        assert net.poller.poll(2000)
        round_head = np.array([(JOB, STREAM, 0, 2, 0)], dtype=header).view(np.uint8)
        have, out = np.zeros(5, dtype=bool), np.zeros(5 * D, dtype=np.uint8)
        parity = Parity(5 * D, D, 0).arrays
        for _ in range(50):
            _drain(net.rx.fileno(), net.drain._io(), round_head, have, out, 5, parity, layout)
            if have.all() or net.drain.state[STATUS] == OTHER:
                break
            net.poller.poll(100)
        assert have.all() == takes
        if takes:
            assert out.tobytes() == data.tobytes()


def test_a_header_the_loop_cannot_read_is_refused_when_its_layout_is_derived():
    wide = np.dtype([("job", "<u8"), ("stream", "<u4"), ("seq", "<u8"), ("flags", "<u2")])
    with pytest.raises(ValueError, match="reads seq as <u4, the header has it as <u8"):
        header_layout(wide)
