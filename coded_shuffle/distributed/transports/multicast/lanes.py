"""A receiver-aware ``multicast``: the datagrams a slow receiver needs at its own rate, the rest
beside them at the others'.

Where some workers' NICs are slower than the stream's pace (``receiver_rates``), a stream that
every worker hears runs at the slowest one's rate, and the coded gain is gone (docs/benchmarks.md,
"An uneven network").
A slow worker needs only the datagrams that carry rows it keeps (the messages of the coded
symbols it decodes with; ``cycles`` at ``K = 4``: 52-56% of them). So each datagram goes to one
of ``2 ** s`` groups, one per set of the ``s`` slow workers that keep a row of it (bit ``b`` of
the group's number: slow worker ``b`` keeps one); a slow worker joins the groups with its bit,
a fast one every group, and a switch that snoops IGMP (the emulated cluster's bridge, most
real ones) sends each port only the groups its host joined. The master interleaves the groups
(:class:`Lanes`): every batch waits for its own pace at the master's NIC and at each slow
worker's that it reaches, and the earliest batch goes first, so the fast workers' share fills
what the slow ones leave of the master's link.

Where more workers are slow than there may be bits (``SLOW_LANES``: ``2 ** 4`` groups, within
Linux's 20 memberships a socket), the slow workers of nearest rates share a bit, a **lane**:
it hears the datagrams any of them keeps, at its slowest's pace (:func:`slow_lanes`).
"""

from __future__ import annotations

import itertools
import socket
import struct
from collections import deque
from collections.abc import Sequence

import numpy as np

from coded_shuffle.distributed.transports.multicast.pacing import Pacer

SLOW_LANES = 4  # lanes of slow workers: 16 groups, within Linux's 20 memberships a socket
IP_MULTICAST_ALL = 49  # linux/in.h: 0 = a socket hears only the groups it joined

Lane = tuple[int, ...]  # slow workers (``1..K``) that share one bit of the group's number


def slow_lanes(
    rate: float, receiver_rates: Sequence[float], most: int = SLOW_LANES
) -> tuple[Lane, ...]:
    """The workers (``1..K``; ``receiver_rates[w - 1]``: worker ``w``'s pace) slower than
    ``rate``, slowest first (ties by number), in at most ``most`` lanes: one each where there
    are that few; else runs of that order, cut where the longest lane's time is least
    (:func:`lane_cuts`). () where none is slow or ``most`` is 0 (then the stream is paced
    for the slowest, one group: a network that floods every group to every port)."""
    slow = sorted(
        (w for w, r in enumerate(receiver_rates, start=1) if r < rate),
        key=lambda w: (receiver_rates[w - 1], w),
    )
    if not most:
        return ()
    if len(slow) <= most:
        return tuple((w,) for w in slow)
    cuts = lane_cuts([receiver_rates[w - 1] for w in slow], most)
    return tuple(tuple(slow[a:b]) for a, b in itertools.pairwise(cuts))


def lane_cuts(rates: Sequence[float], lanes: int) -> list[int]:
    """Where to cut ``rates`` (ascending) into ``lanes`` runs, ``[0, ..., len(rates)]``, so
    that the largest ``len(run) / run[0]`` is least: a lane of ``m`` workers, each keeping
    about a share ``f`` of the stream, hears up to ``m f`` of it at its slowest's rate.
    Exact (dynamic programming over the cuts, ``O(lanes n^2)``); of equal cuts, the earliest."""
    n = len(rates)
    worst = [[np.inf] * (n + 1) for _ in range(lanes + 1)]  # worst[l][j]: rates[:j] in l runs
    back = [[0] * (n + 1) for _ in range(lanes + 1)]
    worst[0][0] = 0.0
    for lane in range(1, lanes + 1):
        for j in range(lane, n + 1):
            for i in range(lane - 1, j):
                cost = max(worst[lane - 1][i], (j - i) / rates[i])
                if cost < worst[lane][j]:
                    worst[lane][j], back[lane][j] = cost, i
    cuts = [n]
    for lane in range(lanes, 0, -1):
        cuts.append(back[lane][cuts[-1]])
    return cuts[::-1]


def group_address(base: str, group: int) -> str:
    """The address of group number ``group``: ``base`` with its low bits XOR ``group`` (group 0
    is ``base``; all stay in ``base``'s /28, within the multicast range)."""
    (value,) = struct.unpack("!I", socket.inet_aton(base))
    return socket.inet_ntoa(struct.pack("!I", value ^ group))


def memberships(worker: int, lanes: Sequence[Lane]) -> list[int]:
    """The groups worker ``worker`` joins: every one for a fast worker, those with its lane's
    bit for a slow one."""
    every = range(2 ** len(lanes))
    mine = [b for b, lane in enumerate(lanes) if worker in lane]
    if not mine:
        return list(every)
    return [g for g in every if g >> mine[0] & 1]


def datagram_keeps(keeps: np.ndarray, sizes: Sequence[int], d: int) -> np.ndarray:
    """``(W, n)`` bools: a row of ``keeps`` (``(W, M)``: which of the stream's ``M`` messages
    of ``sizes`` bytes each keeper keeps) spread over the stream's ``n`` datagrams of ``d``
    bytes: a datagram is kept where any kept message has a byte in it."""
    keeps = np.atleast_2d(np.asarray(keeps, dtype=bool))
    edges = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    n = -(-int(edges[-1]) // d)
    starts, stops = edges[:-1] // d, -(-edges[1:] // d)
    full = edges[1:] > edges[:-1]  # an empty message has no byte in any datagram
    steps = np.zeros((keeps.shape[0], n + 1), dtype=np.int64)
    for row, kept in zip(steps, keeps, strict=True):  # one row per keeper (at most K)
        live = kept & full
        np.add.at(row, starts[live], 1)
        np.add.at(row, stops[live], -1)
    return np.cumsum(steps, axis=1)[:, :n] > 0


def datagram_groups(
    keeps: np.ndarray, sizes: Sequence[int], d: int, lanes: Sequence[Lane]
) -> np.ndarray:
    """Each datagram's group: bit ``b`` set where a worker of ``lanes[b]`` keeps it
    (``keeps``: ``(K, M)``, every worker's messages)."""
    keeps = np.asarray(keeps, dtype=bool)
    either = np.zeros((len(lanes), keeps.shape[1]), dtype=bool)
    for b, lane in enumerate(lanes):  # at most SLOW_LANES
        either[b] = keeps[[w - 1 for w in lane]].any(axis=0)
    kept = datagram_keeps(either, sizes, d)  # (lanes, n)
    bits = np.left_shift(1, np.arange(len(lanes), dtype=np.int64))
    return bits @ kept.astype(np.int64)


class Lanes:
    """The master's datagrams of one round, queued by group, sent batch by batch: each batch
    waits for the master's pace and for that of every lane its group reaches (``slow``: one
    pace per lane, its slowest worker's); of the groups with datagrams queued, the one that
    may go earliest goes (on a tie, the one that reaches more lanes: it has the narrower
    way)."""

    def __init__(
        self, groups: np.ndarray, master: Pacer, slow: Sequence[Pacer], capacity: int
    ) -> None:
        self.groups, self.master, self.capacity = groups, master, capacity
        count = 2 ** len(slow)
        self.ways = [[p for b, p in enumerate(slow) if g >> b & 1] for g in range(count)]
        self.queues: list[deque[np.ndarray]] = [deque() for _ in range(count)]

    def add(self, seqs: np.ndarray) -> None:
        """Datagrams ``seqs`` (ascending) to send, each in its group's queue."""
        if seqs.size == 0:
            return
        of = self.groups[seqs]
        for g in np.unique(of):
            self.queues[int(g)].append(seqs[of == g])

    def next(self) -> tuple[int, float] | None:
        """The group that may go earliest and when (``perf_counter`` seconds); None when
        nothing is queued."""
        best: tuple[float, int, int] | None = None
        for g, queue in enumerate(self.queues):
            if not queue:
                continue
            at = max([self.master.ready_at()] + [p.ready_at() for p in self.ways[g]])
            key = (at, -len(self.ways[g]), g)
            if best is None or key < best:
                best = key
        return None if best is None else (best[2], best[0])

    def take(self, g: int) -> np.ndarray:
        """The next batch of group ``g``: up to ``capacity`` datagrams numbered one after the
        other (a receiver's compiled loop takes such a run whole)."""
        queue = self.queues[g]
        head = queue[0]
        size = min(self.capacity, head.size)
        gaps = np.flatnonzero(np.diff(head[:size]) != 1)
        if gaps.size:
            size = int(gaps[0]) + 1
        batch, rest = head[:size], head[size:]
        if rest.size:
            queue[0] = rest
        else:
            queue.popleft()
        return batch

    def sent(self, g: int, share: float) -> None:
        """``share`` full datagrams of group ``g`` went: every pace it waited for moves on."""
        self.master.sent(share)
        for p in self.ways[g]:
            p.sent(share)
