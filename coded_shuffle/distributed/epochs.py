"""What master and workers derive from the shared seed: every epoch's assignment and plan.

No index metadata crosses the link: every rank draws epoch ``e``'s assignment from
``(seed, e)``, runs the same deterministic scheme on the same state, and so knows every plan.
Only bytes (symbols, placement points, digests) and one header per message are sent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from coded_shuffle.codec.buffers import IN_MEMORY, Buffers
from coded_shuffle.codec.encode import subpoints_of
from coded_shuffle.distributed.delivery import Delivery, WorkerStore
from coded_shuffle.distributed.transports import Routes
from coded_shuffle.distributed.transports.framing import PickedRows
from coded_shuffle.errors import VerificationError
from coded_shuffle.math.index_decoder import peer_routes
from coded_shuffle.math.plan import (
    DeliveryPlan,
    Plan,
    direct_routes,
    held_at,
    subpoint_bytes,
)
from coded_shuffle.math.policies import ShufflePolicy, full_assignment
from coded_shuffle.math.schemes import Scheme
from coded_shuffle.math.state import CacheState, part_states


def assignment(seed: int, epoch: int, num_points: int, num_workers: int) -> np.ndarray:
    """Epoch ``epoch``'s uniformly random balanced assignment (random reshuffling; the first
    assignment under every policy)."""
    return full_assignment(seed, epoch, num_points, num_workers)


@dataclass(frozen=True)
class Transition:
    """Epoch ``epoch``'s delivery: ``state`` (placement before) to ``new_assignment``."""

    epoch: int
    state: CacheState
    new_assignment: np.ndarray
    plan: Plan
    next_state: CacheState
    plan_seconds: float

    @property
    def plans(self) -> tuple[DeliveryPlan, ...]:
        return self.plan.plans


class EpochChain:
    """The placement (epoch 1, or ``first_epoch`` after a change in the number of workers),
    then one :class:`Transition` per later epoch, from the seed."""

    def __init__(
        self,
        scheme: Scheme,
        num_points: int,
        num_workers: int,
        storage: float,
        seed: int,
        policy: ShufflePolicy | None = None,
        first: np.ndarray | None = None,
        first_epoch: int = 1,
    ) -> None:
        self.scheme, self.num_points, self.num_workers = scheme, num_points, num_workers
        self.seed, self.policy, self.first_epoch = seed, policy or ShufflePolicy(), first_epoch
        if first is None:
            first = assignment(seed, first_epoch, num_points, num_workers)
        self.first = first
        self.initial = scheme.initial_state(self.first, num_workers, storage)

    def transitions(self, epochs: int) -> Iterator[Transition]:
        """Transitions of the epochs after the placement up to ``epochs`` (lazily; each plan
        from the previous state)."""
        state, current = self.initial, self.first
        for epoch in range(self.first_epoch + 1, epochs + 1):
            new = self.policy.next_assignment(current, self.seed, epoch, self.num_workers)
            current = new
            t0 = time.perf_counter()
            plan = self.scheme.plan(state, new)
            next_state = self.scheme.next_state(state, plan, new)
            yield Transition(epoch, state, new, plan, next_state, time.perf_counter() - t0)
            state = next_state
            del plan, next_state  # not alive while the next plan is made


def placement_points(scheme: Scheme, state: CacheState, worker: int) -> np.ndarray:
    """Points the placement gives ``worker`` (sorted): its batch and every point of which it
    caches a sub-point. The master sends them in epoch 1; the worker keeps exactly these."""
    batch = np.flatnonzero(state.assignment == worker)
    parts = part_states(state)[0]
    caches = scheme.part_caches(state, worker)
    held = [c // p.splits for c, p in zip(caches, parts, strict=True)]
    return np.union1d(batch, np.concatenate(held)) if held else batch


def symbol_routes(routing: str, plan: DeliveryPlan, known: dict[int, np.ndarray]) -> Routes:
    """Routes of one part's symbols: ``known`` holds the needs this rank knows (by worker).

    Under ``peers`` routing every rank derives every worker's needs (decoding the workers it
    does not know: :func:`~coded_shuffle.math.index_decoder.peer_routes`) and the holder that
    sends each row (:func:`~coded_shuffle.math.plan.direct_routes`); otherwise only the master
    sends.
    """
    if routing == "peers":
        needs, holders = peer_routes(plan, known) if plan.senders else direct_routes(plan)
        return Routes(needs, tuple(h + 1 for h in holders))
    return Routes(tuple(known.get(k) for k in range(plan.num_workers)))


def outgoing_rows(
    routes: Routes, plan: DeliveryPlan, worker: int, cache: torch.Tensor
) -> tuple[np.ndarray, PickedRows]:
    """The symbol rows ``worker`` sends under ``peers`` routing, cut from its own cache.

    Returns ``(row ids, rows)``: every row whose sender is this worker, in id order; uncoded
    rows are read from the cache as they are sent, coded symbols (a plan with senders) XORed
    from it here (:func:`own_symbols`).
    """
    ids = routes.rows_from(worker + 1)
    if plan.senders:
        return ids, own_symbols(plan, ids, worker, cache)
    subs = np.concatenate([b[:, 0] for b in plan.symbols] or [np.zeros(0, np.int64)])[ids]
    return ids, PickedRows(cache, np.searchsorted(plan.caches[worker], subs))


def own_symbols(
    plan: DeliveryPlan, ids: np.ndarray, worker: int, cache: torch.Tensor
) -> torch.Tensor:
    """Symbols ``ids`` (sorted) XORed from ``worker``'s cache, one row each: a decentralized
    plan's symbols, every one of whose terms the sender stores (checked: a term it lacks is a
    :class:`~coded_shuffle.errors.VerificationError`, never a wrong row)."""
    held = plan.caches[worker]
    out, start = [], 0
    for block in plan.symbols:
        sel = ids[(ids >= start) & (ids < start + block.shape[0])] - start
        start += block.shape[0]
        if sel.size == 0:
            continue
        pos = held_at(held, block[sel])
        if pos is None:
            raise VerificationError(f"worker {worker}: asked to send a symbol it cannot form")
        rows = cache.index_select(0, torch.from_numpy(pos.reshape(-1)))
        rows = rows.view(sel.size, block.shape[1], cache.shape[1])
        xored = rows[:, 0].clone()
        for c in range(1, block.shape[1]):
            xored.bitwise_xor_(rows[:, c])
        out.append(xored)
    if not out:
        return cache.new_empty((0, cache.shape[1]))
    return torch.cat(out)


def store_from_points(
    delivery: Delivery,
    worker: int,
    points: np.ndarray,
    rows: torch.Tensor,
    buffers: Buffers = IN_MEMORY,
    slots: list[str | None] | None = None,
    rows_slot: str | None = None,
) -> WorkerStore:
    """The worker's store before ``delivery``, cut from whole points it received at placement.

    ``rows[i]`` holds the bytes of point ``points[i]`` (sorted); only the sub-points that the
    placement gives ``worker`` are kept, in ``buffers`` as ``slots[part]`` (the rows
    themselves where the store is exactly them, whole points in one part, and ``rows`` are
    in that slot already: ``rows_slot``).
    """
    slots = slots or [None] * len(delivery.plans)
    caches = []
    for plan, cols, slot in zip(delivery.plans, delivery.column_slices(), slots, strict=True):
        ids = plan.caches[worker]
        local = np.searchsorted(points, ids // plan.splits)
        if ids.size and (local.max() >= points.size or np.any(points[local] != ids // plan.splits)):
            raise ValueError(f"worker {worker}: placement lacks points of its cache")
        whole = plan.splits == 1 and cols == slice(0, rows.shape[1])
        if whole and slot == rows_slot and np.array_equal(local, np.arange(points.size)):
            caches.append(rows)
            continue
        out = buffers.empty(ids.size, subpoint_bytes(cols.stop - cols.start, plan.splits), slot)
        caches.append(
            subpoints_of(rows, cols, plan.splits, local * plan.splits + ids % plan.splits, out)
        )
    return WorkerStore(caches, list(slots))
