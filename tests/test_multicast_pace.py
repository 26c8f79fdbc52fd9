"""The multicast pace (:class:`Pace`): it backs off from congestion, the loss that a lower
pace removes, and holds its rate under random loss, which no pace removes."""

from __future__ import annotations

import numpy as np
import pytest

from coded_shuffle.distributed.transports.multicast.pacing import PACE_FLOOR, Pace

RATE, DATAGRAMS = 400e6, 10_000


def rounds(pace: Pace, capacity: float, random: float, n: int, seed: int = 0) -> list[float]:
    """``n`` rounds of ``DATAGRAMS`` over a link of ``capacity`` bits/s with a share
    ``random`` lost at random: what the pace sends above the capacity is lost too."""
    rng = np.random.default_rng(seed)
    paces = []
    for _ in range(n):
        over = max(0.0, 1 - capacity / pace.bits)
        lost = rng.binomial(DATAGRAMS, 1 - (1 - over) * (1 - random))
        paces.append(pace.adapt(int(lost), DATAGRAMS))
    return paces


@pytest.mark.parametrize("random", [0.0, 0.001, 0.01, 0.05])
def test_random_loss_alone_keeps_the_pace_near_its_rate(random):
    paces = rounds(Pace(RATE), capacity=RATE, random=random, n=40)
    assert min(paces[5:]) >= 0.75 * RATE and np.median(paces) >= 0.9 * RATE


@pytest.mark.parametrize("random", [0.0, 0.01, 0.05])
def test_a_link_slower_than_the_pace_brings_it_down_to_the_link(random):
    capacity = 0.4 * RATE
    paces = rounds(Pace(RATE), capacity=capacity, random=random, n=60)
    assert 0.5 * capacity <= np.median(paces[20:]) <= 1.15 * capacity


def test_repair_rounds_never_slow_it_and_it_stays_within_its_range():
    pace = Pace(RATE)
    assert pace.adapt(DATAGRAMS // 2, DATAGRAMS, first=False) == RATE  # a repair round
    assert pace.floor == 0.0
    for _ in range(100):
        pace.adapt(DATAGRAMS, DATAGRAMS)  # every datagram lost
    assert pace.bits == RATE * PACE_FLOOR
    for _ in range(100):
        pace.adapt(0, DATAGRAMS)
    assert pace.bits == RATE


def test_a_cut_that_removed_no_loss_is_undone_on_the_next_first_round():
    """1% random loss at each of four receivers (3.9% of the datagrams lost at some receiver):
    the first lossy round cuts the pace, the next one, losing as much, brings it back; a link
    that a cut relieves keeps the cut."""
    pace = Pace(RATE)
    union = 1 - 0.99**4
    assert pace.adapt(round(union * DATAGRAMS), DATAGRAMS) == 0.75 * RATE
    assert pace.adapt(DATAGRAMS // 10, DATAGRAMS, first=False) == 0.75 * RATE  # a repair round
    assert pace.adapt(round(union * DATAGRAMS), DATAGRAMS) == RATE
    congested = Pace(RATE)
    congested.adapt(DATAGRAMS // 10, DATAGRAMS)  # 10% over a link at 0.9 of the rate
    assert congested.adapt(0, DATAGRAMS) == pytest.approx(0.75 * 1.1 * RATE)
