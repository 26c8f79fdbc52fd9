"""``job=elastic_gd job.elastic.fully_distributed=true``: no master in the loop (Yang et al. 2018,
sec. 3.3).

Rank 0 places the coded blocks (as in the master mode) and sends every worker the generator
and the targets (``PEERS``); from then on the workers run every step among themselves: an
all-gather of their round-1 results, decoding at every worker, an all-reduce of their
round-2 products (:mod:`coded_shuffle.elastic.peers`). Every rank knows the schedule of
departures, and all of them create the group of the workers present at every event (torch
needs every rank for ``new_group``). Rank 0 only watches: each step the first worker sends it
the ``w`` it used and the reduced sum, and rank 0 writes the record (gradient error against
its exact gradient, losses). Joins are refused in this mode (a joiner's block would need the
master); a worker that dies fails the job.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from coded_shuffle.elastic.cyclic import CyclicUsage, worker_backward, worker_forward
from coded_shuffle.elastic.encoding import encode, split_blocks
from coded_shuffle.elastic.generator import systematic_generator
from coded_shuffle.elastic.membership import Event, Membership
from coded_shuffle.elastic.peers import peer_code, peer_gradient, ring_bytes
from coded_shuffle.elastic.problem import Problem
from coded_shuffle.elastic.protocol import Message, Op, WorkerNode
from coded_shuffle.elastic.settings import CODED, Settings
from coded_shuffle.errors import UsageError

REPORT = 3  # floats after w and the sum in the leader's report: step, compute, decode (ns)


def check(settings: Settings) -> None:
    """What the mode cannot do, in one line each."""
    if list(settings.methods) != ["coded"]:
        raise UsageError(
            f"job.elastic.fully_distributed runs the coded method only; job.elastic.methods="
            f"{list(settings.methods)} must be [coded]"
        )
    joins = [e.step for e in settings.events if e.join_ids or e.join_count]
    if joins:
        raise UsageError(
            f"job.elastic.fully_distributed takes departures only; the events at steps {joins} "
            "join (a joiner's block needs the master)"
        )


def _groups(members: Membership, events: list[Event], step: int) -> Any:
    """Applies the step's events; every rank creates the present workers' group at step 0
    and after every event (``None`` when nothing changed)."""
    for event in events:
        members.apply(event)
    return dist.new_group(list(members.available)) if step == 0 or events else None


def master(settings: Settings, problem: Problem, transport: Any, sink: Any) -> None:
    """Rank 0: placement, the ``PEERS`` message, then one record per step from the leader."""
    p, size = settings.workers, settings.recovery_threshold
    gen = systematic_generator(p, size, settings.generator, settings.seed, settings.max_condition)
    blocks = encode(split_blocks(problem.X, size), gen.rows)
    targets = split_blocks(problem.y, size)
    placement = 0
    for i in range(1, p + 1):
        store = Message.make(Op.STORE, [CODED, *blocks[i - 1].shape, i - 1, 0], blocks[i - 1])
        placement += store.nbytes + sum(r.nbytes for r in transport.exchange({i: store}).values())
    lr = problem.step_size(settings.lr)
    ints = [settings.steps, size, blocks.shape[1], problem.num_points]
    floats = np.concatenate([[lr, problem.ridge], gen.rows.ravel(), targets.ravel()])
    peers = Message.make(Op.PEERS, ints, floats)
    transport.send_all(peers)
    placement += p * peers.nbytes
    members, d = Membership.initial(p, size), problem.features
    report = torch.empty(2 * d + REPORT, dtype=torch.float64)
    for step in range(settings.steps):
        events = [e for e in settings.events if e.step == step]
        _groups(members, events, step)
        dist.recv(report, members.available[0])
        values = report.numpy()
        w, total = values[:d], values[d : 2 * d]
        grad = peer_gradient(total, w, problem.num_points, problem.ridge)
        exact = problem.gradient(w)
        seconds = values[2 * d :] * 1e-9
        used = int(CyclicUsage(members.size, size, blocks.shape[1]).rows_used().max())
        sink.write(
            {
                "method": "coded",
                "mode": "fully_distributed",
                "step": step,
                "workers_available": members.size,
                "train_loss": problem.loss(w),
                "test_loss": problem.test_loss(w),
                "grad_rel_error": float(
                    np.linalg.norm(grad - exact) / max(np.linalg.norm(exact), 1e-300)
                ),
                "rows_used_max": used,
                "moved_bytes": 0,
                "placement_bytes": placement if step == 0 else 0,
                "comm_bytes": ring_bytes(members.size, used, d),
                "step_seconds": float(seconds[0]),
                "compute_seconds": float(seconds[1]),
                "decode_seconds": float(seconds[2]),
                "comm_seconds": float(max(seconds[0] - seconds[1] - seconds[2], 0.0)),
                "events": [e.describe() for e in events],
                "restarts": 0,
                "lr": lr,
            }
        )
        transport.keep_alive()


def worker(rank: int, node: WorkerNode, msg: Message, settings: Settings) -> None:
    """One worker's master-free loop (:mod:`coded_shuffle.elastic.peers`)."""
    steps, size, b, points = (int(v) for v in msg.ints)
    p = settings.workers
    lr, ridge = float(msg.floats[0]), float(msg.floats[1])
    rows = msg.floats[2 : 2 + p * size].reshape(p, size)
    targets = msg.floats[2 + p * size :].reshape(size, b)
    block = node.store.load("coded")
    if block is None:
        raise RuntimeError(f"worker {rank}: no coded block in its store")
    members = Membership.initial(p, size)
    w = np.zeros(block.shape[1])
    group, code, pos, used = None, None, 0, block[:0]
    for step in range(steps):
        events = [e for e in settings.events if e.step == step]
        created = _groups(members, events, step)
        if rank not in members.row_of:
            continue  # departed: idle, but it still takes part in creating groups
        if created is not None:  # the rows this worker uses, gathered once per membership
            group, code = created, peer_code(members, rows, b)
            pos = members.available.index(rank)
            used = block[code.usage.rows(pos)]
        assert code is not None
        start = time.perf_counter_ns()
        u = worker_forward(used, w)
        compute = time.perf_counter_ns() - start
        gathered = _all_gather(u, code.usage.rows_used(), group)
        t0 = time.perf_counter_ns()
        mine = code.reencode(code.decode(gathered) - targets)[pos]
        t1 = time.perf_counter_ns()
        partial = torch.from_numpy(worker_backward(used, mine))
        compute += time.perf_counter_ns() - t1
        dist.all_reduce(partial, group=group)
        total = partial.numpy()
        if pos == 0:
            took = [time.perf_counter_ns() - start, compute, t1 - t0]
            dist.send(torch.from_numpy(np.concatenate([w, total, took])), 0)
        w = w - lr * peer_gradient(total, w, points, ridge)


def _all_gather(u: np.ndarray, sizes: np.ndarray, group: Any) -> list[np.ndarray]:
    """Every worker's round-1 result at every worker (padded to the longest, then cut)."""
    width = int(sizes.max())
    mine = torch.zeros(width, dtype=torch.float64)
    mine[: u.size] = torch.from_numpy(u)
    out = [torch.empty(width, dtype=torch.float64) for _ in sizes]
    dist.all_gather(out, mine, group=group)
    return [t.numpy()[:n] for t, n in zip(out, sizes, strict=True)]
