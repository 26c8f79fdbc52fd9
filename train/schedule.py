"""What master and workers derive from the shared seed: assignments, plans, minibatch order.

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

from coded_shuffle import codec
from coded_shuffle.assignment import random_assignment
from coded_shuffle.delivery import Delivery, SharedPlan, WorkerStore
from coded_shuffle.plan import DeliveryPlan
from coded_shuffle.schemes import CacheState, Scheme
from coded_shuffle.transport import framed_parts_bytes


def assignment(seed: int, epoch: int, num_points: int, num_workers: int) -> np.ndarray:
    """Epoch ``epoch``'s uniformly random balanced assignment (random reshuffling)."""
    rng = np.random.default_rng([seed, 0, epoch])
    return random_assignment(num_points, num_workers, rng)


def minibatch_order(seed: int, epoch: int, worker: int, batch: int) -> np.ndarray:
    """The order in which ``worker`` visits its batch in ``epoch`` (scheme-independent)."""
    return np.random.default_rng([seed, 1, epoch, worker]).permutation(batch)


@dataclass(frozen=True)
class Transition:
    """Epoch ``epoch``'s delivery: ``state`` (placement before) to ``new_assignment``."""

    epoch: int
    state: CacheState
    new_assignment: np.ndarray
    plan: DeliveryPlan | SharedPlan
    next_state: CacheState
    plan_seconds: float

    @property
    def plans(self) -> tuple[DeliveryPlan, ...]:
        return self.plan.plans if isinstance(self.plan, SharedPlan) else (self.plan,)


class Chain:
    """Epoch 1's placement, then one :class:`Transition` per later epoch, from the seed."""

    def __init__(
        self, scheme: Scheme, num_points: int, num_workers: int, storage: float, seed: int
    ) -> None:
        self.scheme, self.num_points, self.num_workers = scheme, num_points, num_workers
        self.seed = seed
        self.first = assignment(seed, 1, num_points, num_workers)
        self.initial = scheme.initial_state(self.first, num_workers, storage)

    def transitions(self, epochs: int) -> Iterator[Transition]:
        """Transitions of epochs ``2..epochs`` (lazily; each plan from the previous state)."""
        state = self.initial
        for epoch in range(2, epochs + 1):
            new = assignment(self.seed, epoch, self.num_points, self.num_workers)
            t0 = time.perf_counter()
            plan = self.scheme.plan(state, new)
            next_state = self.scheme.next_state(state, plan, new)
            yield Transition(epoch, state, new, plan, next_state, time.perf_counter() - t0)
            state = next_state


def kept_points(delivery: Delivery, worker: int) -> np.ndarray:
    """Points of which ``worker`` caches some sub-point before ``delivery`` (sorted)."""
    held = [p.caches[worker] // p.splits for p in delivery.plans]
    return np.unique(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)


def store_from_points(
    delivery: Delivery, worker: int, points: np.ndarray, rows: torch.Tensor
) -> WorkerStore:
    """The worker's store before ``delivery``, cut from whole points it received at placement.

    ``rows[i]`` holds the bytes of point ``points[i]`` (sorted); only the sub-points that the
    placement gives ``worker`` are kept.
    """
    caches = []
    for plan, cols in zip(delivery.plans, delivery.column_slices(), strict=True):
        ids = plan.caches[worker]
        local = np.searchsorted(points, ids // plan.splits)
        if ids.size and (local.max() >= points.size or np.any(points[local] != ids // plan.splits)):
            raise ValueError(f"worker {worker}: placement lacks points of its cache")
        subs = codec.split_points(rows[:, cols].contiguous(), plan.splits)
        caches.append(
            subs.index_select(0, torch.from_numpy(local * plan.splits + ids % plan.splits))
        )
    return WorkerStore(caches)


def uncoded_link_bytes(delivery: Delivery, chunk_bytes: int) -> int:
    """Link bytes of the uncoded delivery of the same transition, framed like the coded one."""
    rows = [round(plan.uncoded_points * plan.splits) for plan in delivery.plans]
    return framed_parts_bytes(rows, delivery.symbol_bytes(), chunk_bytes)
