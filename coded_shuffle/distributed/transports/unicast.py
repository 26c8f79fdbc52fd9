"""``unicast``: the master sends each worker exactly the rows it needs, nothing else.

The honest uncoded baseline when only the master holds the data: every worker's stream goes
straight to it (gloo ``isend``/``irecv``), all streams in flight at once so that the master's
NIC is never idle. The master's egress is the sum of what the workers need (the placement
included); a row that two workers need travels twice. Coded symbols are meant for several
workers at once, so a coded scheme on this transport is a configuration error.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import zip_longest

import torch
import torch.distributed as dist

from coded_shuffle.distributed.transports.base import OnMessage, Stream, Transport, empty_messages

TAG = 0x7563  # gloo tag of direct point-to-point messages
IN_FLIGHT = 8  # messages in flight per destination at a sender


class Unicast(Transport):
    """Point-to-point streams, each to one worker; the master is the only sender."""

    name = "unicast"
    summary = "uncoded only: the master sends each worker its own rows (placement included)"
    routing = "master"

    def exchange(
        self,
        streams: Sequence[Stream],
        outgoing: Mapping[int, Iterable[torch.Tensor]],
        on_message: OnMessage,
    ) -> None:
        self.check_streams(streams)
        me, group = self.peer.rank, self.peer.group
        inbound = []  # (stream, message index, buffer, work), in posting order
        for i, stream in enumerate(streams):
            if me in stream.dsts:
                for j, buf in enumerate(empty_messages(stream.sizes)):
                    inbound.append((i, j, buf, dist.irecv(buf, stream.src, group=group, tag=TAG)))
                self.counts.ingress += stream.total
        sends: deque = deque()
        mine = [_addressed(s.dsts[0], outgoing[i]) for i, s in enumerate(streams) if s.src == me]
        # round robin over the destinations: every stream makes progress together
        for batch in zip_longest(*mine):
            for item in batch:
                if item is not None:
                    dst, m = item
                    sends.append((m, dist.isend(m, dst, group=group, tag=TAG)))
                    self.counts.egress += m.numel()
            while len(sends) > IN_FLIGHT * len(mine):  # bounded memory at the sender
                sends.popleft()[1].wait()
        for i, j, buf, work in _arrival_order(inbound):
            work.wait()
            on_message(i, j, buf)
        for _, w in sends:
            w.wait()


def _addressed(dst: int, messages: Iterable[torch.Tensor]) -> Iterator[tuple[int, torch.Tensor]]:
    for m in messages:
        yield dst, m


def _arrival_order(inbound: list) -> list:
    """Messages of several streams interleaved, each stream in order (round robin)."""
    by_stream: dict[int, list] = {}
    for item in inbound:
        by_stream.setdefault(item[0], []).append(item)
    out = []
    for batch in zip_longest(*by_stream.values()):
        out.extend(item for item in batch if item is not None)
    return out
