"""How ``multicast`` spaces its datagrams: a pace in bits/s that a held-up sender catches up
with (:class:`Pacer`), adapted round after round to the receivers' losses (:func:`adapt`:
additive increase, multiplicative decrease, within ``[rate / 16, rate]``)."""

from __future__ import annotations

import time

CATCH_UP_BYTES = 2 << 20  # how far a held-up sender may burst to regain its pace
LOSS_HIGH = 0.02  # share of a round's datagrams lost or late at some receiver: slow down
PACE_DOWN, PACE_UP, PACE_FLOOR = 0.75, 1.10, 1 / 16


class Pacer:
    """Spaces datagrams so that their wire bytes leave at ``rate`` bits/s on average.

    A sender that was held up (descheduled, or framing a message) sends what fell due
    meanwhile at once, up to ``CATCH_UP_BYTES`` of wire bytes: a short burst that the NIC's
    queue absorbs, where skipping it would lose the time for good (measured: up to 40 ms of
    a 0.75 s stream with a CPU-bound process beside the cluster). A longer hold-up is
    forgotten beyond that, not made up by a longer burst.
    """

    def __init__(self, rate: float, full_wire_bytes: int) -> None:
        self.interval = full_wire_bytes * 8.0 / rate  # seconds per full datagram
        self.slack = CATCH_UP_BYTES * 8.0 / rate
        self.due = time.perf_counter()

    def wait(self) -> None:
        now = time.perf_counter()
        ahead = self.due - now
        if ahead > 0.002:  # sleep in steps of about a millisecond: bursts stay small
            time.sleep(ahead - 0.001)
        elif ahead < -self.slack:  # held up for long: no burst longer than the slack
            self.due = now - self.slack

    def sent(self, share: float) -> None:
        self.due += self.interval * share


def adapt(pace: float, rate: float, lost: int, sent: int) -> float:
    """The pace after a round in which some receiver lost or got late ``lost`` of the
    ``sent`` datagrams (AIMD within ``[rate / 16, rate]``)."""
    if lost > LOSS_HIGH * max(sent, 1):
        return max(rate * PACE_FLOOR, pace * PACE_DOWN)
    if lost == 0:
        return min(float(rate), pace * PACE_UP)
    return pace
