"""Runs a scheme epoch after epoch on random bytes and checks every worker's decode.

This is the engine of ``coded-shuffle evaluate``: it plans each transition, proves it with the
index decoder, encodes real bytes, decodes at every worker from that worker's own store only,
compares with the master's bytes and carries the stores to the next epoch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from coded_shuffle.codec import kernel
from coded_shuffle.costs.wire import DEFAULT_CHUNK_BYTES
from coded_shuffle.distributed.delivery import Delivery, WorkerStore
from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import (
    batch_size,
    random_assignment,
    shuffle_matrix,
)
from coded_shuffle.math.plan import plan_load
from coded_shuffle.math.schemes import Scheme, get_scheme
from coded_shuffle.math.schemes.decentralized import sender_holds
from coded_shuffle.math.schemes.memory_sharing import exact_point_bytes, storage_used
from coded_shuffle.math.shuffles import cyclic_shuffle, worst_case
from coded_shuffle.math.transition_bounds import is_batch_placement
from coded_shuffle.math.warm import counting_compiles, warm_planner

SHUFFLES = ("random", "cyclic", "worst")  # docs/model.md, "Which shuffles"


@dataclass
class EpochReport:
    """One epoch transition, as the command prints it."""

    scheme: str
    workers: int
    points: int
    storage: float
    epoch: int
    load_points: float
    uncoded_points: float
    lower_bound_points: float
    lower_bound_exact: bool
    broadcast_bytes: int
    verified: bool
    plan_scheme: str = ""
    pairs_only_points: float | None = None  # sum_{i<j} max(S_ij, S_ji): pairs, leftovers uncoded
    stored_points_max: float = 0.0
    stored_bytes_max: int = 0  # the most any worker's store holds after the delivery, measured
    breakdown: dict[str, float] = field(default_factory=dict)
    plan_seconds: float = 0.0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    point_bytes: int = 0
    storage_used: float = 0.0  # what the byte-exact parts store, in batches (T if exact)
    storage_shifted: bool = False  # the point size moved bytes to another corner
    bound_label: str = "lower bound"  # the scheme's: a per-transition bound or a worst case
    worst_shuffle: str | None = None  # --shuffle worst: the candidate shuffle that attained it


@dataclass
class Evaluation:
    """Parameters of one ``evaluate`` run."""

    scheme: str
    workers: int
    points: int
    storage: float = 1.0
    epochs: int = 1
    seed: int = 0
    point_bytes: int | None = None  # None: the smallest size >= 64 at which T is exact
    shuffle: str = "random"
    old: np.ndarray | None = None
    new: np.ndarray | None = None

    def validate(self) -> Scheme:
        if self.point_bytes is None:
            batch_size(self.points, self.workers)
            plain = get_scheme(self.scheme)
            self.point_bytes = exact_point_bytes(plain, self.workers, self.storage)
        if self.point_bytes < 1:
            raise UsageError(f"point bytes must be >= 1, got {self.point_bytes}")
        if self.epochs < 1:
            raise UsageError(f"epochs must be >= 1, got {self.epochs}")
        if self.shuffle not in SHUFFLES:
            raise UsageError(f"shuffle {self.shuffle!r} unknown; valid: {', '.join(SHUFFLES)}")
        batch_size(self.points, self.workers)
        if not 1 <= self.storage <= self.workers:
            raise UsageError(f"storage T={self.storage} out of range 1..{self.workers} (workers)")
        scheme = get_scheme(self.scheme, self.point_bytes)
        scheme.check(self.points, self.workers, self.storage)
        scheme.check_point_bytes(self.workers, self.storage)
        return scheme

    def initial(self, rng: np.random.Generator) -> np.ndarray:
        """The placement's assignment."""
        if self.old is not None:
            return self.old
        return random_assignment(self.points, self.workers, rng)

    def transitions(self) -> int:
        return 1 if self.old is not None else self.epochs

    def next_assignment(
        self,
        current: np.ndarray,
        load_of: Callable[[np.ndarray], float] | None,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, str | None]:
        """The next epoch's assignment; for ``worst``, the candidate shuffle of ``current``
        with the largest ``load_of`` (:func:`~coded_shuffle.math.shuffles.worst_case`) and
        its name."""
        if self.new is not None:
            return self.new, None
        if self.shuffle == "cyclic":
            return cyclic_shuffle(current, self.workers), None
        if self.shuffle == "worst":
            assert load_of is not None
            found, _ = worst_case(load_of, current, self.workers, rng)
            return found.new, found.name
        return random_assignment(self.points, self.workers, rng), None

    def assignments(self, rng: np.random.Generator) -> Iterator[np.ndarray]:
        """The initial assignment, then one per transition (``random`` and ``cyclic``: the
        shuffles of ``worst`` depend on the scheme's state, :func:`run` finds them)."""
        if self.shuffle == "worst" and self.new is None:
            raise UsageError("assignments(): the worst shuffles depend on the plans; use run()")
        current = self.initial(rng)
        yield current
        for _ in range(self.transitions()):
            current, _ = self.next_assignment(current, None, rng)
            yield current


def run(ev: Evaluation, on_compile: Callable[[float], None] | None = None) -> Iterator[EpochReport]:
    """Yields one verified :class:`EpochReport` per epoch transition. The codec's kernel and
    the scheme's planner are compiled (or loaded from numba's cache) before anything is
    timed; ``on_compile(seconds)`` hears of it when numba compiled something."""
    scheme = ev.validate()
    assert ev.point_bytes is not None
    used = storage_used(scheme, ev.workers, ev.storage)
    t0 = time.perf_counter()
    with counting_compiles() as compiles:
        kernel.warm()  # loaded before the first encode is timed
        warm_planner(scheme, ev.storage, ev.workers)  # and the planner before the first plan
    if on_compile is not None and compiles:
        on_compile(time.perf_counter() - t0)
    rng = np.random.default_rng(ev.seed)
    gen = torch.Generator().manual_seed(ev.seed)
    data = torch.randint(0, 256, (ev.points, ev.point_bytes), dtype=torch.uint8, generator=gen)
    current = ev.initial(rng)
    state = scheme.initial_state(current, ev.workers, ev.storage)
    stores: list[WorkerStore] | None = None
    for epoch in range(1, ev.transitions() + 1):
        new, attained = ev.next_assignment(
            current, lambda a, s=state: plan_load(scheme.plan(s, a)), rng
        )
        t0 = time.perf_counter()
        plan = scheme.plan(state, new)
        delivery = Delivery.prepare(plan, ev.point_bytes)
        t1 = time.perf_counter()
        symbols = delivery.encode(data)
        t2 = time.perf_counter()
        if stores is None:  # the initial placement is delivered uncoded, outside this count
            stores = [WorkerStore.from_master(data, delivery, k) for k in range(ev.workers)]
        next_state = scheme.next_state(state, plan, new)
        verified, stores, decode_seconds = _decode_all(
            delivery, symbols, stores, data, scheme, next_state
        )
        verified &= all(sender_holds(p) for p in plan.plans if p.senders)
        bound, exact = scheme.transition_bound(state, new)
        pairs_only = pairs_only_load(state, new)
        yield EpochReport(
            scheme=ev.scheme,
            workers=ev.workers,
            points=ev.points,
            storage=ev.storage,
            epoch=epoch,
            load_points=delivery.load_points,
            uncoded_points=delivery.uncoded_points,
            lower_bound_points=bound,
            lower_bound_exact=exact,
            broadcast_bytes=delivery.link_bytes(DEFAULT_CHUNK_BYTES),
            verified=verified,
            plan_scheme=",".join(sorted({p.scheme for p in delivery.plans})),
            pairs_only_points=pairs_only,
            stored_points_max=scheme.stored_points_max(next_state),
            stored_bytes_max=max(s.stored_bytes() for s in stores),
            breakdown=delivery.breakdown(),
            plan_seconds=t1 - t0,
            encode_seconds=t2 - t1,
            decode_seconds=decode_seconds,
            point_bytes=ev.point_bytes,
            storage_used=used,
            storage_shifted=abs(used - ev.storage) > 1e-9,
            bound_label=scheme.bound_label,
            worst_shuffle=attained,
        )
        state, current = next_state, new


def pairs_only_load(state, new: np.ndarray) -> float | None:
    """Attia & Tandon 2016's first stage alone: pairs coded, leftovers sent
    uncoded (batch placements)."""
    if not is_batch_placement(state):
        return None
    s = shuffle_matrix(state.assignment, new, state.num_workers)
    return float(np.maximum(s, s.T)[np.triu_indices_from(s, k=1)].sum())


def _decode_all(
    delivery: Delivery,
    symbols: list[torch.Tensor],
    stores: list[WorkerStore],
    data: torch.Tensor,
    scheme: Scheme,
    next_state,
) -> tuple[bool, list[WorkerStore], float]:
    """Decodes at every worker from its own store; compares with the master's bytes."""
    verified, new_stores, seconds = True, [], 0.0
    for k, store in enumerate(stores):
        t0 = time.perf_counter()
        batch, workspaces = delivery.decode(k, symbols, store)
        seconds += time.perf_counter() - t0
        expected = data.index_select(0, torch.from_numpy(delivery.plans[0].new_batches[k]))
        verified &= bool(torch.equal(batch, expected))
        new_stores.append(store.updated(workspaces, scheme.part_caches(next_state, k)))
    return verified, new_stores, seconds
