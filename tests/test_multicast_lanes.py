"""The receiver-aware multicast's groups and schedule (:mod:`~coded_shuffle.distributed.
transports.multicast.lanes`), without a network: which datagrams a slow worker hears, and how
the master interleaves the groups."""

from __future__ import annotations

import ipaddress

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.distributed.transports.multicast.lanes import (
    SLOW_MAX,
    Lanes,
    datagram_groups,
    datagram_keeps,
    group_address,
    memberships,
    slow_workers,
)
from coded_shuffle.distributed.transports.multicast.pacing import Pacer

FRAME = 1500


@st.composite
def streams(draw):
    """Message sizes (some empty), who keeps which (``K`` workers) and a datagram size."""
    workers = draw(st.integers(1, 5))
    sizes = draw(st.lists(st.integers(0, 3000), min_size=1, max_size=30))
    keeps = np.array(
        draw(
            st.lists(
                st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)),
                min_size=workers,
                max_size=workers,
            )
        )
    )
    return sizes, keeps, draw(st.integers(64, 2048))


@given(streams())
@settings(max_examples=100, deadline=None)
def test_a_datagram_is_kept_where_a_kept_message_has_a_byte_in_it(stream):
    sizes, keeps, d = stream
    total = sum(sizes)
    got = datagram_keeps(keeps, sizes, d)
    edges = np.concatenate([[0], np.cumsum(sizes)])
    want = np.zeros((keeps.shape[0], -(-total // d)), dtype=bool)
    for w, row in enumerate(keeps):
        for j in np.flatnonzero(row):
            for byte in range(edges[j], edges[j + 1]):
                want[w, byte // d] = True
    assert np.array_equal(got, want)


@given(streams(), st.data())
@settings(max_examples=100, deadline=None)
def test_a_slow_worker_joins_exactly_the_groups_of_the_datagrams_it_keeps(stream, data):
    sizes, keeps, d = stream
    workers = keeps.shape[0]
    slow = tuple(data.draw(st.permutations(range(1, workers + 1)))[: min(workers, SLOW_MAX)])
    groups = datagram_groups(keeps, sizes, d, slow)
    kept = datagram_keeps(keeps, sizes, d)
    for w in range(1, workers + 1):
        joined = np.isin(groups, memberships(w, slow))
        assert np.array_equal(joined, kept[w - 1]) if w in slow else joined.all()


def test_slow_workers_are_those_below_the_rate_slowest_first_and_at_most_four():
    assert slow_workers(400, [400, 200, 400, 100]) == (4, 2)
    assert slow_workers(400, [400] * 4) == ()
    assert slow_workers(400, [100] * (SLOW_MAX + 1)) == ()  # too many: one group, slowest pace


def test_group_addresses_are_distinct_multicast_addresses_beside_the_base():
    for base in ("239.255.1.1", "239.255.255.254", "224.0.0.250"):
        got = [group_address(base, g) for g in range(2**SLOW_MAX)]
        assert got[0] == base and len(set(got)) == len(got)
        assert all(ipaddress.ip_address(a).is_multicast for a in got)


def _schedule(groups: np.ndarray, slow_share: float, capacity: int) -> tuple[list, Lanes]:
    """Every batch of one round as :class:`Lanes` picks it, without sleeping: its paces
    move on as if each batch went when it was due."""
    rate = 400e6
    master = Pacer(rate, FRAME)
    slow = [Pacer(rate * slow_share, FRAME)]
    lanes = Lanes(groups, master, slow, capacity)
    lanes.add(np.arange(groups.size))
    batches = []
    while (ahead := lanes.next()) is not None:
        g, _ = ahead
        batch = lanes.take(g)
        batches.append((g, batch))
        lanes.sent(g, batch.size)
    return batches, lanes


def test_lanes_send_every_datagram_once_in_runs_of_one_group():
    rng = np.random.default_rng(1)
    groups = np.repeat(rng.integers(0, 2, 80), rng.integers(1, 40, 80))
    batches, lanes = _schedule(groups, 0.5, 16)
    sent = np.concatenate([b for _, b in batches])
    assert np.array_equal(np.sort(sent), np.arange(groups.size))
    for g, b in batches:
        assert b.size <= 16 and (groups[b] == g).all() and (np.diff(b) == 1).all()
    assert lanes.next() is None  # nothing left queued


def test_lanes_fill_the_masters_link_beside_a_slow_worker():
    """Half the datagrams for a worker at half the master's rate, laid out in the worst
    order (all of them first): interleaved, the round lasts as long as the master's link
    needs (its datagrams at its rate), not the slow part at half rate and then the rest."""
    n = 4000
    groups = np.repeat([1, 0], n // 2)
    _, lanes = _schedule(groups, 0.5, 8)
    interval = FRAME * 8 / 400e6
    start = lanes.master.due - n * interval  # the master's pace moved n datagrams on
    slow_end = lanes.ways[1][0].due - start
    assert slow_end <= (n + 16) * interval  # the slow worker's half at its rate: n intervals
    blocking = (n // 2) * interval * 2 + (n // 2) * interval  # one group after the other
    assert slow_end < 0.7 * blocking
