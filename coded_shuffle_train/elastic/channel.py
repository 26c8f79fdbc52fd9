"""Point-to-point messages between the elastic jobs' master and their workers over gloo
(ranks = worker ids): a lost worker is named by the connection that fails."""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from coded_shuffle.elastic.protocol import HEADER_INTS, Message, Op, WorkerLost


def send_message(msg: Message, dst: int) -> list[tuple[dist.Work, torch.Tensor]]:
    header = torch.tensor([msg.op, msg.ints.size, msg.floats.size], dtype=torch.int64)
    tensors = [header]
    if msg.ints.size:
        tensors.append(torch.from_numpy(msg.ints))
    if msg.floats.size:
        tensors.append(torch.from_numpy(msg.floats))
    return [(dist.isend(t, dst), t) for t in tensors]


def receive_message(src: int) -> Message:
    header = torch.empty(HEADER_INTS, dtype=torch.int64)
    dist.recv(header, src)
    op, n_ints, n_floats = (int(v) for v in header)
    ints = torch.empty(n_ints, dtype=torch.int64)
    floats = torch.empty(n_floats, dtype=torch.float64)
    if n_ints:
        dist.recv(ints, src)
    if n_floats:
        dist.recv(floats, src)
    return Message(op, ints.numpy(), floats.numpy())


def request(msg: Message, rank: int) -> Message:
    works = send_message(msg, rank)
    reply = receive_message(rank)
    for work, _ in works:
        work.wait()
    return reply


class DistChannel:
    """Point-to-point gloo messages between the master and the workers (ranks = worker ids).

    Idle ranks (departed workers, a killed rank after the restart) get a 24-byte keep-alive
    header whenever they have not heard from the master for a quarter of the timeout, so their
    blocking receive never times out; those bytes are counted in ``overhead_bytes``.
    """

    def __init__(self, world: int, timeout: timedelta) -> None:
        self.ranks = list(range(1, world))
        self.keepalive = timeout.total_seconds() / 4
        self.last = {r: time.monotonic() for r in self.ranks}
        self.overhead_bytes = 0

    def exchange(self, requests: dict[int, Message]) -> dict[int, Message]:
        pending = []
        for rank, msg in requests.items():
            try:
                pending += [(rank, w, t) for w, t in send_message(msg, rank)]
            except RuntimeError:
                raise WorkerLost([rank]) from None
        replies = {}
        for rank in requests:
            try:
                replies[rank] = receive_message(rank)
            except RuntimeError:
                raise WorkerLost([rank]) from None
            self.last[rank] = time.monotonic()
        for rank, work, _ in pending:
            try:
                work.wait()
            except RuntimeError:
                raise WorkerLost([rank]) from None
        self._keep_alive(set(requests))
        return replies

    def send_all(self, msg: Message) -> None:
        """One message to every worker rank, no reply expected."""
        pending = [w for rank in self.ranks for w in send_message(msg, rank)]
        for work, _ in pending:
            work.wait()
        now = time.monotonic()
        self.last = {r: now for r in self.ranks}

    def keep_alive(self) -> None:
        """Keep-alive headers to every rank not heard from for a quarter of the timeout."""
        self._keep_alive(set())

    def _keep_alive(self, contacted: set[int]) -> None:
        now = time.monotonic()
        for rank in self.ranks:
            if rank not in contacted and now - self.last[rank] > self.keepalive:
                noop = Message.make(Op.NOOP)
                try:
                    for work, _ in send_message(noop, rank):
                        work.wait()
                except RuntimeError:
                    continue  # an idle rank that is gone: nothing depends on it
                self.overhead_bytes += noop.nbytes
                self.last[rank] = now

    def killed_ranks(self) -> list[int]:
        """Ranks whose previous incarnation died without an exit record (SIGKILL), by HELLO."""
        replies = {r: request(Message.make(Op.HELLO), r) for r in self.ranks}
        hello = Message.make(Op.HELLO).nbytes
        self.overhead_bytes += sum(hello + m.nbytes for m in replies.values())
        return [r for r, m in replies.items() if int(m.ints[0]) == 0]

    def stop(self) -> None:
        """Tells every worker rank to finish (ranks that are gone are skipped)."""
        for rank in self.ranks:
            try:
                for work, _ in send_message(Message.make(Op.STOP), rank):
                    work.wait()
            except RuntimeError:
                continue
