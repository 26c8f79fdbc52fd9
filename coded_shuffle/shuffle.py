"""``CodedShuffle``: every epoch's data moved to the workers by a coded delivery, in any loop.

Created on every rank of a ``torch.distributed`` job (rank 0 = master, holding the data set;
ranks ``1..K`` = workers), told the epoch like ``DistributedSampler``. Epoch 1 is the placement
(every point sent once, uncoded); every later epoch plans the transition with the scheme,
proves it decodable (:mod:`~coded_shuffle.decoder`), encodes, moves the symbols through the
transport registry (:mod:`~coded_shuffle.transports`), decodes at every worker with its own
store only, and verifies: the master compares every worker's batch digest with its own and
raises :class:`~coded_shuffle.errors.VerificationError` on a difference. Nothing but bytes,
one header per message and one report per worker per epoch crosses the network: every rank
derives the assignments and plans from the seed (:mod:`~coded_shuffle.epochs`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from . import kernel
from .assignment import batches
from .blockstore import BlockStore
from .bounds_api import lower_bound
from .codec import Encoder, digest
from .delivery import Delivery, WorkerStore
from .epochs import (
    EpochChain,
    Transition,
    outgoing_rows,
    placement_points,
    store_from_points,
    symbol_routes,
)
from .errors import UsageError, VerificationError
from .records import LocalBatch, RecordLayout
from .schemes import Scheme, get_scheme
from .schemes.memory_sharing import storage_used
from .transports import HostBytes, Link, Peer, Routes, build_transport, transport_class
from .transports.framing import (
    DEFAULT_CHUNK_BYTES,
    HEADER_BYTES,
    KIND_PLACEMENT,
    KIND_SYMBOLS,
    framed_bytes,
)

DIGEST_BYTES = 32
# what every worker tells the master after each delivery
REPORT = np.dtype(
    [
        ("digest", "u1", DIGEST_BYTES),  # SHA-256 of the decoded batch
        ("decode_seconds", "<f8"),
        ("stored_bytes", "<i8"),
        ("egress", "<i8"),  # this host's bytes on the transport (HostBytes)
        ("ingress", "<i8"),
        ("repairs", "<i8"),
        ("control", "<i8"),
    ]
)


def check_transport(
    name: str,
    scheme: Scheme,
    workers: int,
    options: Mapping[str, Any],
    keys: tuple[str, str] = ("transport", "scheme"),
) -> None:
    """A known transport, valid options, and no coded scheme on a point-to-point transport
    (``keys``: how the caller names the two settings in its errors)."""
    cls = transport_class(name)
    cls.validate(workers + 1, **options)
    if cls.routing != "broadcast" and scheme.coded:
        t, s = keys
        raise UsageError(
            f"{t}={name} carries uncoded deliveries only (each row to one worker); "
            f"{s}={scheme.name} is coded: use {s}=uncoded, or {t}=chain, multicast or tree"
        )


def batch_digests(records: torch.Tensor, new_batches: Sequence[np.ndarray]) -> list[bytes]:
    """SHA-256 of every worker's new batch (its records in sorted point order)."""
    return [digest(records.index_select(0, torch.from_numpy(b))) for b in new_batches]


def verify_digests(epoch: int, reported: Sequence[bytes], expected: Sequence[bytes]) -> bool:
    """True when every worker's batch digest equals the master's; else VerificationError.

    A worker that decoded a wrong batch, or skipped its decode, reports a digest that differs
    from the master's.
    """
    if len(reported) != len(expected):
        raise VerificationError(
            f"epoch {epoch}: {len(reported)} reports for {len(expected)} workers"
        )
    for k, (mine, theirs) in enumerate(zip(reported, expected, strict=True)):
        if mine != theirs:
            raise VerificationError(
                f"epoch {epoch}: worker {k} decoded a batch with SHA-256 {mine.hex()[:16]}, "
                f"the master's is {theirs.hex()[:16]}"
            )
    return True


def host_metrics(name: str, master: HostBytes, reports: np.ndarray) -> dict[str, Any]:
    """Per-host byte counts of one epoch (rank 0 first) and their summaries."""
    egress = [master.egress, *(int(v) for v in reports["egress"])]
    ingress = [master.ingress, *(int(v) for v in reports["ingress"])]
    row = {
        "transport": name,
        "master_egress_bytes": egress[0],
        "host_egress_bytes_max": max(egress),
        "host_ingress_bytes_max": max(ingress),
        "network_bytes": sum(egress),
        "repair_bytes": master.repairs + int(reports["repairs"].sum()),
        "control_bytes": master.control + int(reports["control"].sum()),
        "host_egress_bytes": egress,
        "host_ingress_bytes": ingress,
    }
    if name == "tree":  # deprecated name of the same figure (README: Metrics)
        row["gloo_tree_bytes"] = row["network_bytes"]
    return row


@dataclass
class Prepared:
    """An epoch the master made ready before its first byte (while the workers trained)."""

    tr: Transition
    delivery: Delivery
    symbols: list[torch.Tensor] | list[Encoder]  # encoders: encoded as they are sent
    expected: list[bytes]  # SHA-256 of every worker's new batch
    bound: tuple[float, bool]
    plan_seconds: float
    encode_seconds: float


@dataclass(frozen=True)
class Setup:
    """What every rank knows once the master has described its data set."""

    layout: RecordLayout
    num_points: int
    dropped: int
    workers: int
    storage: float
    seed: int


class CodedShuffle:
    """Coded delivery of every epoch's data (interfaces: "Library API for an own training loop").

    Parameters
    ----------
    dataset : map-style data set on rank 0 (items: tensors or tuples of tensors of fixed shapes
        and dtypes, e.g. ``TensorDataset``); ``None`` on every other rank.
    scheme : a registered scheme (``coded-shuffle schemes``); ``"uncoded"`` for the baseline.
    storage : ``T``, what every worker stores, in batches (``1 <= T <= K``).
    seed : every epoch's assignment is drawn from ``(seed, epoch)`` on every rank.
    transport : a registered transport (``coded-shuffle transports``); ``transport_options``
        its own settings.
    chunk_bytes : the largest message payload on the link.
    epochs : the number of epochs, if known: the master then encodes epoch ``e + 1`` right
        after delivering ``e`` (while the workers train) and stops at the last.
    drop_last : drop the last ``N mod K`` items so that ``K`` workers divide ``N``
        (``False``: such an ``N`` is an error).
    timeout : how long the delivery's collectives wait (default: the default group's).
    on_progress : ``(bytes moved, bytes to move)`` after every message (progress lines).
    store_dir : where every worker persists its store after each epoch (atomically, with a
        digest), so that :meth:`restore` can resume a restarted job; ``None``: in memory only.
    stream : an epoch the master did not make ready ahead (``epochs`` unknown) is encoded
        message by message while earlier messages are on the link (``False``: the whole
        epoch is encoded before the first byte is sent). Workers always decode as symbols
        arrive.

    Attributes
    ----------
    report : this epoch's delivery metrics (the ``metrics.jsonl`` keys of a delivery; on a
        worker: its own digest, decode time, stored bytes and host bytes).
    indices : (worker) the data set indices of the last batch, in order.
    workers_group : the workers' process group (gradient all-reduce, DDP).
    before_send : optional ``(epoch, symbols)`` hook on the master, called before an epoch's
        symbols are sent (fault injection in tests).
    """

    def __init__(
        self,
        dataset: Any | None,
        *,
        scheme: str = "cycles",
        storage: float = 1.0,
        seed: int = 0,
        transport: str = "chain",
        transport_options: Mapping[str, Any] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        epochs: int | None = None,
        drop_last: bool = True,
        timeout: timedelta | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        store_dir: str | os.PathLike[str] | None = None,
        stream: bool = True,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise UsageError("CodedShuffle needs torch.distributed: call init_process_group first")
        self.rank, world = dist.get_rank(), dist.get_world_size()
        if world < 2:
            raise UsageError(f"world size {world}: CodedShuffle needs a master and >= 1 worker")
        self.workers, self.epochs, self.stream = world - 1, epochs, stream
        if epochs is not None and epochs < 1:
            raise UsageError(f"epochs={epochs} out of range (must be >= 1)")
        options = dict(transport_options or {})
        described = self._describe(dataset, drop_last)
        self.setup = Setup(described[0], described[1], described[2], self.workers, storage, seed)
        b = self.setup.layout.record_bytes
        self.scheme = get_scheme(scheme, b)
        if not 1 <= storage <= self.workers:
            raise UsageError(f"storage={storage} out of range 1..{self.workers} (workers)")
        self.scheme.check(self.setup.num_points, self.workers, storage)
        self.scheme.check_point_bytes(self.workers, storage)
        self.storage_used = storage_used(self.scheme, self.workers, storage)
        check_transport(transport, self.scheme, self.workers, options)
        kernel.warm()  # the codec's kernel loaded before the first deadline
        wait = timeout or timedelta(minutes=30)
        self.workers_group = dist.new_group(list(range(1, world)), timeout=wait)
        dist.barrier()  # every worker joined its group before any rank can fail and leave
        peer = Peer(self.rank, world, wait)
        self.link = Link(build_transport(transport, peer, options), chunk_bytes, on_progress)
        self.chain = EpochChain(self.scheme, self.setup.num_points, self.workers, storage, seed)
        self._transitions = self.chain.transitions(epochs if epochs is not None else sys.maxsize)
        self.before_send: Callable[[int, list[torch.Tensor]], None] | None = None
        self.report: dict[str, Any] = {}
        self.indices = np.zeros(0, dtype=np.int64)
        self._next = 1
        if self.rank == 0:
            self._records: torch.Tensor = self._pack(dataset)
            self._ready: Prepared | None = None
        else:
            self._upcoming = next(self._transitions, None)
            self._plan_ahead()
            self._store: WorkerStore | None = None
            self._disk = None
            if store_dir is not None:
                self._disk = BlockStore(Path(store_dir) / f"worker-{self._k}", dtype=None)

    # -- the data set, from the master to every rank -----------------------------------------

    def _describe(self, dataset: Any | None, drop_last: bool) -> tuple[RecordLayout, int, int]:
        """The master checks its data set and tells every rank its layout and size (or the
        error, so that every rank fails with the same line)."""
        message: list[Any] = [None]
        if self.rank == 0:
            try:
                message[0] = self._check_dataset(dataset, drop_last)
            except UsageError as exc:
                message[0] = str(exc)
        elif dataset is not None:
            raise UsageError(f"rank {self.rank} passed a dataset: only rank 0 (the master) does")
        dist.broadcast_object_list(message, src=0)
        if isinstance(message[0], str):
            raise UsageError(message[0])
        layout, n, dropped = message[0]
        return RecordLayout.from_json(layout), int(n), int(dropped)

    def _check_dataset(self, dataset: Any | None, drop_last: bool) -> tuple[str, int, int]:
        if dataset is None:
            raise UsageError("rank 0 (the master) must pass the dataset to CodedShuffle")
        size = len(dataset)
        dropped = size % self.workers
        if dropped and not drop_last:
            raise UsageError(
                f"{size} items do not divide among {self.workers} workers: pass drop_last=True "
                f"or {size - dropped} items"
            )
        if size - dropped < self.workers:
            raise UsageError(
                f"{size} items for {self.workers} workers: every worker needs at least one"
            )
        return RecordLayout.of(dataset).to_json(), size - dropped, dropped

    def _pack(self, dataset: Any) -> torch.Tensor:
        return self.setup.layout.pack(dataset, self.setup.num_points)

    # -- the epoch ---------------------------------------------------------------------------

    def epoch(self, epoch: int) -> LocalBatch | None:
        """Delivers epoch ``epoch`` (1 = placement; epochs in order 1, 2, ...).

        Returns the worker's new batch as a data set (``None`` on the master); ``report``
        then holds the epoch's metrics.
        """
        if epoch != self._next:
            raise UsageError(f"epoch({epoch}): epochs are delivered in order, next is {self._next}")
        if self.epochs is not None and epoch > self.epochs:
            raise UsageError(f"epoch({epoch}) out of range 1..{self.epochs} (epochs=)")
        self._next += 1
        if self.rank == 0:
            self.report = self._master_epoch(epoch)
            return None
        rows = self._worker_epoch(epoch)
        self.indices = batches(self._assignment(epoch), self.workers)[self.rank - 1]
        return LocalBatch(self.setup.layout.unpack(rows), self.setup.layout.single, self.indices)

    def close(self) -> None:
        """Releases the transport's sockets and threads."""
        self.link.transport.close()

    # -- resuming a restarted job ------------------------------------------------------------

    def restore(self, completed: int) -> dict[str, Any]:
        """Resumes after epoch ``completed`` (call on every rank, before any :meth:`epoch`).

        Every worker reloads its store of that epoch from ``store_dir`` and checks its digest;
        a worker whose store is missing or damaged gets the points its store holds again,
        uncoded (only those rows cross the link). Returns (and puts in ``report``)
        ``resumed_after_epoch``, ``replaced_workers`` and ``replacement_bytes`` (bytes the
        master sent, headers included), so a restart's cost is counted.
        """
        if self._next != 1:
            raise UsageError(f"restore({completed}) after epoch {self._next - 1}: call it first")
        if completed < 1 or (self.epochs is not None and completed > self.epochs):
            raise UsageError(f"restore({completed}) out of range 1..{self.epochs or 'epochs'}")
        state = self._advance(completed)
        intact = torch.tensor([1 if self.rank == 0 else int(self._load(completed))])
        every = [torch.zeros_like(intact) for _ in range(self.workers + 1)]
        dist.all_gather(every, intact)
        broken = [k for k in range(self.workers) if not int(every[k + 1])]
        if broken and self._pending(completed):
            self._replace(completed, state, broken)
        counts, _ = self.link.take_counts()
        self._next = completed + 1
        self.report = {
            "resumed_after_epoch": completed,
            "replaced_workers": broken,
            "replacement_bytes": counts.egress if self.rank == 0 else 0,
        }
        return self.report

    def _pending(self, epoch: int) -> bool:
        """Whether an epoch follows ``epoch`` (a store is needed after it)."""
        return self.epochs is None or epoch < self.epochs

    def _advance(self, completed: int):
        """The chain moved on to the state after epoch ``completed`` (plans replayed, nothing
        proved, encoded or sent)."""
        state = self.chain.initial
        if self.rank == 0:
            for _ in range(completed - 1):
                state = next(self._transitions).next_state
            return state
        while self._upcoming is not None and self._upcoming.epoch <= completed:
            state = self._upcoming.next_state
            self._upcoming = next(self._transitions, None)
        self._plan_ahead()
        return state

    def _replace(self, completed: int, state: Any, broken: list[int]) -> None:
        """The points of every broken worker's store, uncoded, to that worker only."""
        needs = {k: placement_points(self.scheme, state, k) for k in broken}
        union = np.unique(np.concatenate(list(needs.values())))
        empty = np.zeros(0, dtype=np.int64)
        b = self.setup.layout.record_bytes
        if self.rank == 0:
            routes = Routes(
                tuple(
                    np.searchsorted(union, needs[k]) if k in needs else empty
                    for k in range(self.workers)
                )
            )
            self.link.deliver(
                epoch=completed, part=0, kind=KIND_PLACEMENT, num_rows=union.size, row_bytes=b,
                routes=routes, rows=self._records.index_select(0, torch.from_numpy(union)),
            )  # fmt: skip
            return
        k = self._k
        mine = np.searchsorted(union, needs[k]) if k in needs else empty
        rows = self.link.deliver(
            epoch=completed, part=0, kind=KIND_PLACEMENT, num_rows=union.size, row_bytes=b,
            routes=self._mine(mine),
        )  # fmt: skip
        if k in needs and self._delivery is not None:
            assert rows is not None
            self._store = store_from_points(self._delivery, k, needs[k], rows)
            self._persist(completed)

    def _persist(self, epoch: int) -> None:
        """The worker's store after ``epoch`` on its disk (the one before it is dropped)."""
        if self._disk is None or self._store is None:
            return
        for part, cache in enumerate(self._store.caches):
            self._disk.save(f"e{epoch}-part{part}", cache.numpy(), self._identity(epoch))
            self._disk.remove(f"e{epoch - 2}-part{part}")

    def _identity(self, epoch: int) -> dict[str, Any]:
        """What a stored store must match to be reused: the same job, the same epoch."""
        s = self.setup
        return {
            "epoch": epoch,
            "scheme": self.scheme.name,
            "seed": s.seed,
            "storage": s.storage,
            "points": s.num_points,
            "record_bytes": s.layout.record_bytes,
            "workers": self.workers,
        }

    def _load(self, epoch: int) -> bool:
        """The store after ``epoch`` from disk, if every part is present and intact."""
        if not self._pending(epoch):
            return True  # nothing left to decode: no store needed
        if self._disk is None or self._delivery is None:
            return False
        caches = []
        for part in range(len(self._delivery.plans)):
            slot = f"e{epoch}-part{part}"
            meta = {k: v for k, v in self._disk.meta(slot).items() if k != "digest"}
            array = self._disk.load(slot) if meta == self._identity(epoch) else None
            if array is None:
                return False
            caches.append(torch.from_numpy(array))
        self._store = WorkerStore(caches)
        return True

    def _assignment(self, epoch: int) -> np.ndarray:
        if epoch == 1:
            return self.chain.first
        return self._current.new_assignment

    # -- master --------------------------------------------------------------------------------

    def _master_epoch(self, epoch: int) -> dict[str, Any]:
        if epoch == 1:
            row = self._placement()
        else:
            ready = self._ready or self._prepare(next(self._transitions), stream=self.stream)
            self._ready = None
            row = self._deliver(ready)
        if self.epochs is not None and epoch < self.epochs:
            self._ready = self._prepare(next(self._transitions))  # while the workers train
        return row

    def _placement(self) -> dict[str, Any]:
        """Epoch 1: every point sent uncoded; each worker gets (or keeps) what it stores."""
        n, b, chunk = self.setup.num_points, self.setup.layout.record_bytes, self.link.chunk_bytes
        needs = tuple(
            placement_points(self.scheme, self.chain.initial, k) for k in range(self.workers)
        )
        expected = batch_digests(self._records, batches(self.chain.first, self.workers))
        t0 = time.perf_counter()
        self.link.deliver(
            epoch=1, part=0, kind=KIND_PLACEMENT, num_rows=n, row_bytes=b,
            routes=Routes(needs), rows=self._records,
        )  # fmt: skip
        reports = self._gather(np.zeros(1, dtype=REPORT))
        assert reports is not None
        verified = verify_digests(1, [bytes(r) for r in reports["digest"]], expected)
        link_bytes = framed_bytes(n, b, chunk)
        return self._row(
            epoch=1,
            phase="placement",
            reports=reports,
            verified=verified,
            link_bytes=(link_bytes, n * b),
            uncoded_bytes=link_bytes,
            load_points=float(n),
            uncoded_points=float(n),
            bound=(float(n), True),
            seconds={"delivery": time.perf_counter() - t0, "plan": 0.0, "encode": 0.0},
            stored=self.scheme.stored_points_max(self.chain.initial),
            breakdown={"placement": float(n)},
        )

    def _prepare(self, tr: Transition, stream: bool = False) -> Prepared:
        """Everything an epoch's delivery needs before its first byte: the proved delivery,
        the bound, the encoded symbols and the digests every worker's batch must have.

        ``stream``: the symbols are encoded message by message while earlier ones are on the
        link (an epoch that was not made ready while the workers trained)."""
        t0 = time.perf_counter()
        delivery = Delivery.prepare(tr.plan, self.setup.layout.record_bytes)
        plan_seconds = tr.plan_seconds + time.perf_counter() - t0
        bound = lower_bound(tr.state, tr.new_assignment)
        t1 = time.perf_counter()
        symbols: list[torch.Tensor] | list[Encoder]
        if stream and self.before_send is None:
            symbols = delivery.encoders(self._records)
        else:
            symbols = delivery.encode(self._records)
        encode_seconds = time.perf_counter() - t1
        expected = batch_digests(self._records, tr.plans[0].new_batches)
        return Prepared(tr, delivery, symbols, expected, bound, plan_seconds, encode_seconds)

    def _deliver(self, ready: Prepared) -> dict[str, Any]:
        """A coded epoch: send every part's symbols, compare the workers' batch digests."""
        tr, delivery, symbols = ready.tr, ready.delivery, ready.symbols
        self._current = tr
        if self.before_send is not None:
            assert all(isinstance(x, torch.Tensor) for x in symbols)
            self.before_send(tr.epoch, symbols)  # type: ignore[arg-type]
        sizes = delivery.symbol_bytes()
        chunk, routing = self.link.chunk_bytes, self.link.transport.routing
        t0 = time.perf_counter()
        for part, plan in enumerate(delivery.plans):
            known = {k: delivery.programs[part][k].symbol_ids for k in range(self.workers)}
            self.link.deliver(
                epoch=tr.epoch, part=part, kind=KIND_SYMBOLS, num_rows=plan.num_symbols,
                row_bytes=sizes[part], routes=symbol_routes(routing, plan, known),
                rows=symbols[part],
            )  # fmt: skip
        reports = self._gather(np.zeros(1, dtype=REPORT))
        assert reports is not None
        verified = verify_digests(tr.epoch, [bytes(r) for r in reports["digest"]], ready.expected)
        return self._row(
            epoch=tr.epoch,
            phase="coded",
            reports=reports,
            verified=verified,
            link_bytes=(delivery.link_bytes(chunk), delivery.payload_bytes()),
            uncoded_bytes=delivery.uncoded_link_bytes(chunk),
            load_points=delivery.load_points,
            uncoded_points=delivery.uncoded_points,
            bound=ready.bound,
            seconds={
                "delivery": time.perf_counter() - t0,
                "plan": ready.plan_seconds,
                "encode": ready.encode_seconds
                + sum(x.seconds for x in symbols if isinstance(x, Encoder)),
            },
            stored=self.scheme.stored_points_max(tr.next_state),
            breakdown=delivery.breakdown(),
        )

    def _row(
        self,
        *,
        epoch: int,
        phase: str,
        reports: np.ndarray,
        verified: bool,
        link_bytes: tuple[int, int],
        uncoded_bytes: int,
        load_points: float,
        uncoded_points: float,
        bound: tuple[float, bool],
        seconds: dict[str, float],
        stored: float,
        breakdown: dict[str, float],
    ) -> dict[str, Any]:
        """The epoch's delivery metrics (README: Metrics)."""
        counts, link_seconds = self.link.take_counts()
        shared, payload = link_bytes
        b = self.setup.layout.record_bytes
        return {
            "epoch": epoch,
            "phase": phase,
            "scheme": self.scheme.name,
            "workers": self.workers,
            "storage": self.setup.storage,
            "storage_used": self.storage_used,
            "points": self.setup.num_points,
            "point_bytes": b,
            "dropped_points": self.setup.dropped,
            "broadcast_bytes": shared,
            "payload_bytes": payload,
            "header_bytes": shared - payload,
            "messages": (shared - payload) // HEADER_BYTES,
            "uncoded_bytes": int(uncoded_bytes),
            "lower_bound_points": bound[0],
            "lower_bound_exact": bound[1],
            "lower_bound_bytes": round(bound[0] * b),
            "load_points": float(load_points),
            "uncoded_points": float(uncoded_points),
            "saved_percent": 100.0 * (1 - shared / uncoded_bytes) if uncoded_bytes else 0.0,
            **host_metrics(self.link.transport.name, counts, reports),
            "transport_settings": self.link.transport.settings(),
            "link_seconds": link_seconds,
            "delivery_seconds": seconds["delivery"],
            "plan_seconds": seconds["plan"],
            "encode_seconds": seconds["encode"],
            "decode_seconds": float(reports["decode_seconds"].max()),
            "verified": verified,
            "stored_points_max": float(stored),
            "worker_stored_bytes_max": int(reports["stored_bytes"].max()),
            "breakdown": breakdown,
        }

    # -- workers -------------------------------------------------------------------------------

    @property
    def _k(self) -> int:
        return self.rank - 1

    def _plan_ahead(self) -> None:
        """The next epoch's worker program, derived before the master sends (it is ready)."""
        up = self._upcoming
        b = self.setup.layout.record_bytes
        self._delivery = None if up is None else Delivery.prepare_worker(up.plan, b, self._k)

    def _worker_epoch(self, epoch: int) -> torch.Tensor:
        if epoch == 1:
            return self._worker_placement()
        if self._upcoming is None or self._delivery is None:
            raise UsageError(f"epoch({epoch}) out of range 1..{self.epochs} (epochs=)")
        tr, delivery = self._upcoming, self._delivery
        self._current = tr
        batch = self._worker_deliver(tr, delivery)
        self._upcoming = next(self._transitions, None)
        self._plan_ahead()
        return batch

    def _mine(self, keep: np.ndarray) -> Routes:
        """Routes that name only this worker's needs (what it knows without the others')."""
        return Routes(tuple(keep if i == self._k else None for i in range(self.workers)))

    def _worker_placement(self) -> torch.Tensor:
        """Receives the points the placement gives it (its first batch and what it caches)."""
        k, n, b = self._k, self.setup.num_points, self.setup.layout.record_bytes
        first = batches(self.chain.first, self.workers)[k]
        keep = placement_points(self.scheme, self.chain.initial, k)
        rows = self.link.deliver(
            epoch=1, part=0, kind=KIND_PLACEMENT, num_rows=n, row_bytes=b, routes=self._mine(keep),
        )  # fmt: skip
        assert rows is not None
        t0 = time.perf_counter()
        batch = rows.index_select(0, torch.from_numpy(np.searchsorted(keep, first)))
        if self._delivery is not None:
            self._store = store_from_points(self._delivery, k, keep, rows)
            self._persist(1)
        seconds = time.perf_counter() - t0
        stored = batch.numel() if self._store is None else self._store.stored_bytes()
        self._report(batch, seconds, stored)
        return batch

    def _worker_deliver(self, tr: Transition, delivery: Delivery) -> torch.Tensor:
        """Receives the epoch's symbols, decodes with its own store only, reports, updates."""
        store = self._store
        assert store is not None
        routing, k = self.link.transport.routing, self._k
        buffers = [
            torch.empty((delivery.programs[part][k].symbol_ids.size, sub), dtype=torch.uint8)
            for part, sub in enumerate(delivery.symbol_bytes())
        ]
        decoders = delivery.decoders(k, buffers, store)  # decode as the symbols arrive
        for part, plan in enumerate(delivery.plans):
            keep = delivery.programs[part][k].symbol_ids
            routes = symbol_routes(routing, plan, {k: keep})
            rows = row_ids = None
            if routing == "peers":
                if not np.array_equal(routes.needs[k], keep):
                    raise VerificationError(f"worker {k}: routes differ from its decoder")
                row_ids, rows = outgoing_rows(routes, plan, k, store.caches[part])
            decoders[part].advance(0)  # what needs no symbol: while the first ones travel
            self.link.deliver(
                epoch=tr.epoch, part=part, kind=KIND_SYMBOLS, num_rows=plan.num_symbols,
                row_bytes=buffers[part].shape[1], routes=routes, rows=rows, row_ids=row_ids,
                out=buffers[part], on_rows=decoders[part].advance,
            )  # fmt: skip
        workspaces = [d.finish() for d in decoders]
        t0 = time.perf_counter()
        batch = delivery.batch(k, workspaces)
        next_caches = self.scheme.part_caches(tr.next_state, k)
        self._store = store.updated(delivery, k, workspaces, next_caches)
        seconds = time.perf_counter() - t0 + sum(d.seconds for d in decoders)
        if self._pending(tr.epoch):
            self._persist(tr.epoch)
        self._report(batch, seconds, self._store.stored_bytes())
        return batch

    def _report(self, batch: torch.Tensor, decode_seconds: float, stored_bytes: int) -> None:
        """The batch digest, timings and this host's transport bytes, gathered at the master."""
        counts, link_seconds = self.link.take_counts()
        mine = np.zeros(1, dtype=REPORT)
        mine["digest"][0] = np.frombuffer(digest(batch), dtype=np.uint8)
        mine["decode_seconds"] = decode_seconds
        mine["stored_bytes"] = stored_bytes
        for key, value in zip(
            ("egress", "ingress", "repairs", "control"), counts.as_list(), strict=True
        ):
            mine[key] = value
        self._gather(mine)
        self.report = {
            "batch_sha256": bytes(mine["digest"][0]).hex(),
            "decode_seconds": decode_seconds,
            "stored_bytes": stored_bytes,
            "link_seconds": link_seconds,
            **dict(zip(("egress", "ingress", "repairs", "control"), counts.as_list(), strict=True)),
        }

    def _gather(self, mine: np.ndarray) -> np.ndarray | None:
        """Every worker's :data:`REPORT` at the master (``None`` elsewhere)."""
        buf = torch.from_numpy(np.frombuffer(mine.tobytes(), dtype=np.uint8).copy())
        if self.rank != 0:
            dist.gather(buf, dst=0)
            return None
        out = [torch.zeros_like(buf) for _ in range(self.workers + 1)]
        dist.gather(buf, gather_list=out, dst=0)
        return np.frombuffer(b"".join(t.numpy().tobytes() for t in out[1:]), dtype=REPORT)
