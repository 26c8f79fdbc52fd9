"""The receiver-aware multicast's groups and schedule (:mod:`~coded_shuffle.distributed.
transports.multicast.lanes`), without a network: which datagrams a slow worker hears, and how
the master interleaves the groups."""

from __future__ import annotations

import ipaddress
import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.distributed.transports.multicast.lanes import (
    SLOW_LANES,
    Lanes,
    datagram_groups,
    datagram_keeps,
    group_address,
    lane_cuts,
    memberships,
    slow_lanes,
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


@st.composite
def lanes_of(draw, workers: int) -> tuple[tuple[int, ...], ...]:
    """Some of ``workers`` workers, in at most :data:`SLOW_LANES` lanes."""
    slow = draw(st.permutations(range(1, workers + 1)))[: draw(st.integers(0, workers))]
    count = min(len(slow), draw(st.integers(1, SLOW_LANES)))
    inner = st.integers(1, len(slow) - 1)
    cuts = sorted(draw(st.sets(inner, max_size=count - 1))) if len(slow) > 1 else []
    bounds = [0, *cuts, len(slow)]
    return tuple(tuple(slow[a:b]) for a, b in itertools.pairwise(bounds) if b > a)


@given(streams(), st.data())
@settings(max_examples=100, deadline=None)
def test_a_slow_worker_joins_exactly_the_groups_of_what_its_lane_keeps(stream, data):
    sizes, keeps, d = stream
    workers = keeps.shape[0]
    lanes = data.draw(lanes_of(workers))
    groups = datagram_groups(keeps, sizes, d, lanes)
    kept = datagram_keeps(keeps, sizes, d)
    for w in range(1, workers + 1):
        joined = np.isin(groups, memberships(w, lanes))
        lane = [ln for ln in lanes if w in ln]
        want = kept[[v - 1 for v in lane[0]]].any(axis=0) if lane else np.ones_like(joined)
        assert np.array_equal(joined, want)


def test_slow_workers_are_those_below_the_rate_slowest_first_a_lane_each():
    assert slow_lanes(400, [400, 200, 400, 100]) == ((4,), (2,))
    assert slow_lanes(400, [400] * 4) == ()
    assert slow_lanes(400, [100] * 4) == ((1,), (2,), (3,), (4,))


def test_more_slow_workers_than_lanes_share_them_by_rate():
    assert slow_lanes(400, [200] * 5 + [400]) == ((1,), (2,), (3,), (4, 5))
    assert slow_lanes(400, [300, 100, 100, 50, 400], 2) == ((4,), (2, 3, 1))
    assert slow_lanes(400, [100, 50, 400], 1) == ((2, 1),)
    assert slow_lanes(400, [100, 50, 400], 0) == ()  # none: the stream at the slowest's pace


@given(st.lists(st.integers(1, 8), min_size=1, max_size=9), st.integers(1, SLOW_LANES))
@settings(max_examples=200, deadline=None)
def test_lane_cuts_are_the_least_worst_lane_of_every_way_to_cut(rates, lanes):
    """Against every cut of the sorted rates into at most ``lanes`` runs: the worst lane's
    ``len / its slowest's rate`` is the least there is."""
    rates = sorted(rates)
    lanes = min(lanes, len(rates))
    cuts = lane_cuts(rates, lanes)
    assert cuts[0] == 0 and cuts[-1] == len(rates) and len(cuts) == lanes + 1
    assert all(a < b for a, b in itertools.pairwise(cuts))

    def worst(bounds):
        return max((b - a) / rates[a] for a, b in itertools.pairwise(bounds))

    inner = range(1, len(rates))
    best = min(
        worst([0, *c, len(rates)]) for k in range(lanes) for c in itertools.combinations(inner, k)
    )
    assert worst(cuts) == best


def test_group_addresses_are_distinct_multicast_addresses_beside_the_base():
    for base in ("239.255.1.1", "239.255.255.254", "224.0.0.250"):
        got = [group_address(base, g) for g in range(2**SLOW_LANES)]
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
