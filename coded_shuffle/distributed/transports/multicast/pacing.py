"""How ``multicast`` spaces its datagrams: a pace in bits/s that a held-up sender catches up
with (:class:`Pacer`), adapted round after round to the receivers' losses (:class:`Pace`:
additive increase, multiplicative decrease, within ``[rate / 16, rate]``, on the loss above
what no pace avoids)."""

from __future__ import annotations

import time
from collections import deque

CATCH_UP_BYTES = 2 << 20  # how far a held-up sender may burst to regain its pace
CATCH_UP_SECONDS = 0.05  # ... and no more than this at its rate (the emulated NIC queues 0.1 s)
LOSS_HIGH = 0.02  # share of a round's datagrams lost or late above the floor: slow down
LOSS_CLEAN = 1.2  # a round at most this many times the floor's loss counts as clean
FLOOR_ROUNDS = 8  # the first rounds (of a stream) the floor remembers
RANDOM_MAX = 0.2  # the most loss the floor takes for random: more is a link that fails
LOSS_SAME = 0.7  # a cut after which a first round loses this share of the loss before or more
PACE_DOWN, PACE_UP, PACE_FLOOR = 0.75, 1.10, 1 / 16
SLEEP_AHEAD_SECONDS = 0.002  # a send due this soon goes now: bursts stay this small


class Pacer:
    """Spaces datagrams so that their wire bytes leave at ``rate`` bits/s on average.

    A sender that was held up (descheduled, or framing a message) sends what fell due
    meanwhile at once, up to :func:`catch_up_bytes` of wire bytes: a short burst that the
    NIC's queue absorbs, where skipping it would lose the time for good (measured: up to 40 ms
    of a 0.75 s stream with a CPU-bound process beside the cluster). A longer hold-up is
    forgotten beyond that, not made up by a longer burst. The burst reaches the NIC's queue
    only where the socket's send buffer holds it (:func:`send_buffer_bytes`).
    """

    def __init__(self, rate: float, full_wire_bytes: int) -> None:
        self.interval = full_wire_bytes * 8.0 / rate  # seconds per full datagram
        self.slack = catch_up_bytes(rate) * 8.0 / rate
        self.due = time.perf_counter()

    def wait(self) -> None:
        sleep_until(self.ready_at())

    def ready_at(self) -> float:
        """When the next datagram may go (``perf_counter`` seconds): its due time, or the
        slack before now where the sender was held up for long (no longer burst)."""
        self.due = max(self.due, time.perf_counter() - self.slack)
        return self.due

    def sent(self, share: float) -> None:
        self.due += self.interval * share


def sleep_until(at: float) -> None:
    """Sleeps until about ``at`` (``perf_counter`` seconds), in steps of about a millisecond
    (bursts stay small); not at all where it is at most :data:`SLEEP_AHEAD_SECONDS` away."""
    ahead = at - time.perf_counter()
    if ahead > SLEEP_AHEAD_SECONDS:
        time.sleep(ahead - 0.001)


def catch_up_bytes(rate: float) -> int:
    """The longest burst a held-up sender at ``rate`` bits/s sends at once: ``CATCH_UP_BYTES``,
    or ``CATCH_UP_SECONDS`` of its rate where that is less (a slow NIC's queue is short)."""
    return int(min(CATCH_UP_BYTES, rate / 8 * CATCH_UP_SECONDS))


def send_buffer_bytes(rate: float, batch_bytes: int) -> int:
    """The sending socket's buffer: the catch-up burst and two batches beside it.

    A sender paced close to its NIC's rate is behind its pace most of the time (each hold-up
    is made up only at the NIC's rate, a percent above the pace), so its sends are held by the
    socket's buffer, not by the pacer: with the kernel's default (208 KiB, 4 ms at 400 Mbit/s)
    the NIC idled whenever the sender was descheduled longer, and coded deliveries on the
    emulated cluster ran at 0.85 of the pace (0.97-0.99 with this buffer; K = 4, 400 Mbit/s).
    """
    return catch_up_bytes(rate) + 2 * batch_bytes


class Pace:
    """The pace in bits/s, adapted after every round to the share of its datagrams that some
    receiver lost or got late: down by a quarter where that share is ``LOSS_HIGH`` above the
    *floor*, up by a tenth where it is at the floor (at most ``LOSS_CLEAN`` times it), within
    ``[rate / 16, rate]``. The floor is the lowest share among the last ``FLOOR_ROUNDS``
    first rounds of a stream (at most ``RANDOM_MAX``): loss that slowing down did not remove,
    random loss rather than congestion (at 5% random loss at every receiver, a pace cut on
    every round's loss slowed the deliveries epoch after epoch, 0.56 to 1.51 s, though the
    link was never full). Only a first round tells: in it every datagram is new to every
    receiver; a repair round's are new to some only (its share of them is not the link's
    loss): a repair round may only speed it up. A cut that the next first round shows
    removed no loss is undone (:func:`removed_nothing`)."""

    def __init__(self, rate: float) -> None:
        self.rate = float(rate)
        self.bits = float(rate)
        self.shares: deque[float] = deque(maxlen=FLOOR_ROUNDS)  # the last first rounds' loss
        self.cut: tuple[float, float] | None = None  # the last first round's cut: (pace, loss)

    @property
    def floor(self) -> float:
        return min(min(self.shares, default=0.0), RANDOM_MAX)

    def adapt(self, lost: int, sent: int, first: bool = True) -> float:
        """The pace after a round that sent ``sent`` datagrams, of which some receiver lost or
        got late ``lost`` (``first``: the stream's first round, or a repair round)."""
        share, floor = lost / max(sent, 1), self.floor
        cut = self.cut
        if first:
            self.cut = None
        if first and cut is not None and removed_nothing(cut[1], share):
            self.bits = max(self.bits, cut[0])
        elif first and share > floor + LOSS_HIGH:
            self.cut = (self.bits, share)
            self.bits = max(self.rate * PACE_FLOOR, self.bits * PACE_DOWN)
        elif lost == 0 or share <= floor * LOSS_CLEAN:
            self.bits = min(self.rate, self.bits * PACE_UP)
        if first:
            self.shares.append(share)
        return self.bits


def removed_nothing(before: float, after: float) -> bool:
    """Whether a pace cut after a first round that lost the share ``before`` removed nothing:
    the next first round, a quarter slower, lost ``LOSS_SAME`` of it or more, and at most
    ``RANDOM_MAX``. Then the loss is random and the pace before the cut comes back at once.
    Congestion could not do that: loss from a pace ``P`` above a link's ``C`` is ``1 - C / P``,
    at most ``RANDOM_MAX`` only where ``C >= 0.8 P``, and then the cut pace is below ``C``
    (measured before this rule, at 1% random loss at each of four receivers: a first round
    lost 3.9% of its datagrams at some receiver, the pace was cut to 0.75 and took three
    epochs to come back)."""
    return after <= RANDOM_MAX and after >= LOSS_SAME * before
