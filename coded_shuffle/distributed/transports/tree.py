"""``tree``: gloo's ``broadcast``, an unpipelined binomial tree (kept for comparison).

gloo (``gloo/broadcast.cc``) broadcasts every message whole along a binomial tree rooted at
the master: in round ``i`` every rank ``r < 2^i`` that holds the message sends it to
``r + 2^i``. So the master sends ``ceil(log2 P)`` copies of every message and rank ``r`` sends
one copy to each of its :func:`children`. gloo moves these bytes itself; the counts here are
derived from that algorithm (the emulated cluster's NIC counters check them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch
import torch.distributed as dist

from coded_shuffle.costs.model import BroadcastCost, Network, Reach, Traffic
from coded_shuffle.distributed.transports.base import OnMessage, Stream, Transport


def children(rank: int, world_size: int) -> list[int]:
    """The ranks that ``rank`` forwards every message to in gloo's binomial tree (root 0; with
    another root ``s``, rank ``r`` sits where ``(r - s) mod P`` sits under root 0)."""
    out, step = [], 1
    while step < world_size:
        if rank < step and rank + step < world_size:
            out.append(rank + step)
        step *= 2
    return out


class TreeCost(BroadcastCost):
    """``ceil(log2 P)`` rounds, in each of which the master (and others) send the whole stream
    once, as fast as the slowest NIC a round reaches (taken as the slowest worker's); on a
    shared medium every one of the ``K`` copies crosses it."""

    def busy(self, stream: float, traffic: Traffic, net: Network, reach: Reach | None) -> float:
        del reach
        k, r = traffic.workers, net.rate / 8
        rounds, first = self.rounds(k), min(r, net.master_rate / 8, net.slowest(k))
        if net.topology == "shared":
            return rounds * net.tcp(stream) / first + (k - rounds) * net.tcp(stream) / r
        return rounds * net.tcp(stream) / first

    def master_bytes(self, stream: float, workers: int) -> float:
        return self.rounds(workers) * stream

    @staticmethod
    def rounds(workers: int) -> int:
        """gloo's rounds over the master and ``workers`` workers: ``ceil(log2 P)``."""
        return math.ceil(math.log2(workers + 1))


class Tree(Transport):
    """Every message through ``dist.broadcast`` (gloo's binomial tree), one after the other."""

    name = "tree"
    summary = "gloo broadcast: binomial tree, the master sends ceil(log2 P) copies"
    routing = "broadcast"
    cost = TreeCost()

    def exchange(
        self,
        streams: Sequence[Stream],
        outgoing: Mapping[int, Iterable[torch.Tensor]],
        on_message: OnMessage,
    ) -> None:
        self.check_streams(streams)
        world, root = self.peer.world_size, self.peer.at(0)
        fanout = len(children((self.peer.at(self.peer.rank) - root) % world, world))
        for i, stream in enumerate(streams):
            if self.peer.rank == 0:
                for buf in outgoing[i]:
                    dist.broadcast(buf, src=root, group=self.peer.group)
            else:
                for j, size in enumerate(stream.sizes):
                    buf = torch.empty(size, dtype=torch.uint8)
                    dist.broadcast(buf, src=root, group=self.peer.group)
                    on_message(i, j, buf)
                self.counts.ingress += stream.total
            self.counts.egress += fanout * stream.total
