"""A worker's side of an epoch (ranks ``1..K``): its program derived ahead from the seed, the
symbols received and decoded with its own store only as they arrive, its report to the
master, and its store for the next epoch. With ``store_dir`` the store, the batch and every
large buffer live in memory-mapped files there (the store persisted after every epoch is the
file the worker decoded into), so that its own memory does not grow with the data set."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from coded_shuffle.codec.buffers import IN_MEMORY
from coded_shuffle.codec.decode import StreamDecoder, is_batch
from coded_shuffle.codec.digest import digest
from coded_shuffle.codec.ops import gather_rows
from coded_shuffle.distributed.context import EpochContext
from coded_shuffle.distributed.delivery import Delivery, WorkerStore
from coded_shuffle.distributed.delivery_report import WorkerReport
from coded_shuffle.distributed.epochs import (
    Transition,
    outgoing_rows,
    placement_points,
    store_from_points,
    symbol_routes,
)
from coded_shuffle.distributed.persistence import StorePersistence
from coded_shuffle.distributed.reports import HostCpu, gather_reports, worker_report
from coded_shuffle.distributed.resize import (
    EMPTY,
    exchange_held,
    still_needed,
    whole_store_points,
)
from coded_shuffle.distributed.transports import Routes
from coded_shuffle.distributed.transports.framing import KIND_PLACEMENT, KIND_SYMBOLS
from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import batches
from coded_shuffle.math.state import CacheState

log = logging.getLogger("coded_shuffle")


class WorkerSide:
    """Worker ``worker`` (0-based; rank ``worker + 1``): receives, decodes, reports."""

    def __init__(self, ctx: EpochContext, persistence: StorePersistence | None) -> None:
        self.ctx, self.persistence = ctx, persistence
        self.buffers = IN_MEMORY if persistence is None else persistence.buffers
        self.worker = ctx.rank - 1
        self.upcoming: Transition | None = next(ctx.transitions, None)
        self.delivery: Delivery | None = None
        self.store: WorkerStore | None = None
        self.report: WorkerReport | None = None  # the last delivery's
        # the next epoch's routes and the rows this worker sends, per part, made ready while
        # it trains (peers routing), with the store they were cut from
        self.sends: tuple[WorkerStore, list[tuple[Routes, Any, Any]]] | None = None
        self.plan_ahead()

    def plan_ahead(self) -> None:
        """The next epoch's worker program, derived before the master sends (it is ready)."""
        up = self.upcoming
        b = self.ctx.shape.layout.record_bytes
        self.delivery = None if up is None else Delivery.prepare_worker(up.plan, b, self.worker)
        self.send_ahead()

    def send_ahead(self) -> None:
        """Under ``peers`` routing: the next epoch's routes, and the rows this worker sends
        cut (or, for its own coded symbols, XORed) from its store now, not while the
        others wait for them."""
        self.sends = None
        if self.store is None or self.delivery is None:
            return
        self.sends = (
            self.store,
            [self.peer_part(part) for part in range(len(self.delivery.plans))],
        )

    def peer_part(self, part: int) -> tuple[Routes, Any, Any]:
        """``(routes, row ids, rows)`` of one part of the next delivery (rows None unless the
        routing is ``peers``)."""
        assert self.delivery is not None and self.store is not None
        k, plan = self.worker, self.delivery.plans[part]
        keep = self.delivery.programs[part][k].symbol_ids
        routing = self.ctx.link.transport.routing
        routes = symbol_routes(routing, plan, {k: keep})
        if routing != "peers":
            return routes, None, None
        row_ids, rows = outgoing_rows(routes, plan, k, self.store.caches[part])
        return routes, row_ids, rows

    def epoch(self, epoch: int) -> tuple[torch.Tensor, np.ndarray]:
        """This worker's new batch (records) and its assignment of the epoch."""
        if epoch == self.ctx.chain.first_epoch:
            return self.placement(epoch), self.ctx.chain.first
        if self.upcoming is None or self.delivery is None:
            raise UsageError(f"epoch({epoch}) out of range 1..{self.ctx.settings.epochs} (epochs=)")
        tr = self.upcoming
        batch = self.deliver(tr, self.delivery)
        assignment = tr.new_assignment
        del tr  # this epoch's plan and program go before the next epoch's are made
        self.upcoming = self.delivery = None
        self.upcoming = next(self.ctx.transitions, None)
        self.plan_ahead()
        return batch, assignment

    def mine(self, keep: np.ndarray) -> Routes:
        """Routes that name only this worker's needs (what it knows without the others')."""
        return Routes(
            tuple(keep if i == self.worker else None for i in range(self.ctx.shape.workers))
        )

    def slots(self, epoch: int) -> list[str | None]:
        """Where the store after ``epoch`` goes, part by part (None: in memory)."""
        parts = 1 if self.delivery is None else len(self.delivery.plans)
        if self.persistence is None:
            return [None] * parts
        return self.persistence.slots(epoch, parts)

    def placement(self, epoch: int) -> torch.Tensor:
        """Receives the points the placement gives it (its first batch and what it caches);
        after a change in the number of workers, those it does not hold yet."""
        ctx, k = self.ctx, self.worker
        cpu = HostCpu.start()
        first = batches(ctx.chain.first, ctx.shape.workers)[k]
        keep = placement_points(ctx.scheme, ctx.chain.initial, k)
        if ctx.settings.previous_workers is None:
            out = self.buffers.empty(
                keep.size, ctx.shape.layout.record_bytes, self.points_slot(epoch, keep)
            )
            with self.priming():  # its slot made first: the spares primed are the next ones'
                rows = self.receive_points(epoch, keep, ctx.shape.num_points, self.mine(keep), out)
        else:
            with self.priming():
                rows = self.receive_beyond_held(epoch, keep)
        t0 = time.perf_counter()
        where = np.searchsorted(keep, first)
        batch = rows if np.array_equal(keep, first) else gather_rows(rows, where, self.buffers)
        if self.delivery is not None:
            self.store = self.store_of(epoch, keep, rows)
        seconds = time.perf_counter() - t0
        stored = batch.numel() if self.store is None else self.store.stored_bytes()
        self.send_report(digest(batch), seconds, stored, cpu)
        if self.delivery is not None:  # after the report: the disk is not the delivery's time
            self.persist(epoch, ctx.chain.initial)
        self.send_ahead()  # the next epoch's sends, while the workers train
        self.keep(epoch, batch)
        return batch

    @contextlib.contextmanager
    def priming(self) -> Iterator[None]:
        """:meth:`prime` in a thread of its own while the caller waits on the network;
        joined before the caller reports (its CPU is the placement's). A disk that refuses
        the primed files is logged, not fatal (the delivery makes its rows as before);
        anything else is raised here."""
        failed: list[BaseException] = []

        def prime() -> None:
            try:
                self.prime()
            except BaseException as exc:  # handed to the caller's thread
                failed.append(exc)

        primer = threading.Thread(target=prime, name="prime-buffers", daemon=True)
        primer.start()
        try:
            yield
        finally:
            primer.join()
        if failed and isinstance(failed[0], OSError):
            log.warning(f"worker {self.worker}: buffers not primed: {failed[0]}")
        elif failed:
            raise failed[0]

    def prime(self) -> None:
        """The rows the first coded delivery asks its buffers for (:meth:`buffer_shapes`),
        every page touched (:meth:`Buffers.prime`); on disk as many spare files again, for the
        store of the epoch after it (the store file of two epochs before is written over
        only from the third coded epoch on)."""
        if self.upcoming is None or self.delivery is None:
            return
        scratch, slots = self.buffer_shapes(self.upcoming, self.delivery)
        self.buffers.prime(scratch, slots * (2 if self.persistence is not None else 1))

    def buffer_shapes(
        self, tr: Transition, delivery: Delivery
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The ``(rows, width)`` of the scratch rows and of the store's slots that the
        delivery of ``tr`` takes from the buffers (:meth:`deliver`): per part, the kept
        symbols, the transport's own, the decoder's batch and scratch rows, the next store
        (the batch itself where it is the batch)."""
        k, link = self.worker, self.ctx.link
        next_caches = self.ctx.scheme.part_caches(tr.next_state, k)
        scratch: list[tuple[int, int]] = []
        slots: list[tuple[int, int]] = []
        for part, sub in enumerate(delivery.symbol_bytes()):
            program = delivery.programs[part][k]
            scratch.append((program.symbol_ids.size, sub))
            scratch += link.scratch_shapes(KIND_SYMBOLS, delivery.plans[part].num_symbols, sub)
            scratch.append((program.num_scratch, sub))
            batch = (program.batch_rows.size, sub)
            if is_batch(program, next_caches[part]):
                slots.append(batch)
            else:
                scratch.append(batch)
                slots.append((next_caches[part].size, sub))
        return scratch, slots

    def receive_beyond_held(self, epoch: int, keep: np.ndarray) -> torch.Tensor:
        """The rows of ``keep`` (sorted): those its store held before the change in the
        number of workers from there, the others out of the master's stream of what every
        worker lacks."""
        ctx, k = self.ctx, self.worker
        held = self.held_before(epoch - 1)
        points, rows = held if held is not None else (EMPTY, None)
        mine = np.isin(points, keep)
        every = exchange_held(points[mine], ctx.link.peer)
        keeps = [
            placement_points(ctx.scheme, ctx.chain.initial, j) for j in range(ctx.shape.workers)
        ]
        needs = still_needed(keeps, every)
        union = np.unique(np.concatenate(needs))
        out = self.buffers.empty(
            keep.size, ctx.shape.layout.record_bytes, self.points_slot(epoch, keep)
        )
        if union.size:
            got = self.receive_again(epoch, dict(enumerate(needs)), union, store=False)
            if needs[k].size:
                out[torch.from_numpy(np.searchsorted(keep, needs[k]))] = got
        if rows is not None and mine.any():
            at = torch.from_numpy(np.flatnonzero(mine))
            out[torch.from_numpy(np.searchsorted(keep, points[mine]))] = rows[at]
        return out

    def held_before(self, epoch: int) -> tuple[np.ndarray, torch.Tensor] | None:
        """The whole points its store held after ``epoch``, when it was one of the previous
        workers (and their rows), or None."""
        before = self.ctx.settings.previous_workers
        if self.persistence is None or before is None or self.worker >= before:
            return None
        return self.persistence.load_whole(epoch)

    def points_slot(self, epoch: int, points: np.ndarray) -> str | None:
        """The store's slot after ``epoch`` where whole ``points`` are the whole store."""
        whole = self.delivery is not None and self.delivery.stores_whole_points(self.worker, points)
        return self.slots(epoch)[0] if whole else None

    def receive_points(
        self,
        epoch: int,
        points: np.ndarray,
        rows: int,
        routes: Routes,
        out: torch.Tensor | None = None,
    ) -> Any:
        """Whole ``points`` (sorted) received uncoded in a stream of ``rows`` rows: straight
        into the store's slot after ``epoch`` where they are the whole store (``out``: those
        rows, made by the caller)."""
        if out is None:
            slot = self.points_slot(epoch, points)
            out = self.buffers.empty(points.size, self.ctx.shape.layout.record_bytes, slot)
        return self.ctx.link.deliver(
            epoch=epoch,
            part=0,
            kind=KIND_PLACEMENT,
            num_rows=rows,
            row_bytes=self.ctx.shape.layout.record_bytes,
            routes=routes,
            out=out,
        )

    def store_of(self, epoch: int, points: np.ndarray, rows: torch.Tensor) -> WorkerStore:
        """The store after ``epoch`` cut from the whole ``points`` received (``rows``, in the
        slot :meth:`receive_points` gave them)."""
        assert self.delivery is not None
        return store_from_points(
            self.delivery,
            self.worker,
            points,
            rows,
            self.buffers,
            self.slots(epoch),
            self.points_slot(epoch, points),
        )

    def deliver(self, tr: Transition, delivery: Delivery) -> torch.Tensor:
        """Receives the epoch's symbols, decodes with its own store only, reports, updates."""
        store, link, k = self.store, self.ctx.link, self.worker
        assert store is not None
        cpu = HostCpu.start()
        buffers = [
            self.buffers.empty(delivery.programs[part][k].symbol_ids.size, sub)
            for part, sub in enumerate(delivery.symbol_bytes())
        ]
        next_caches = self.ctx.scheme.part_caches(tr.next_state, k)
        store_slots = self.slots(tr.epoch)
        batch_slots = [  # where the next store is the new batch, decode straight into it
            slot if is_batch(delivery.programs[part][k], ids) else None
            for part, (ids, slot) in enumerate(zip(next_caches, store_slots, strict=True))
        ]
        decoders = delivery.decoders(k, buffers, store, self.buffers, batch_slots)
        check = delivery.digest_stream(k, decoders)  # and hash the batch as its points are final
        ahead = self.sends[1] if self.sends is not None and self.sends[0] is store else None
        for part, plan in enumerate(delivery.plans):
            routes, row_ids, rows = ahead[part] if ahead is not None else self.peer_part(part)

            def on_rows(lo: int, hi: int, decoder: StreamDecoder = decoders[part]) -> None:
                decoder.arrived(lo, hi)
                check.update()

            on_rows(0, 0)  # what needs no symbol: while the first ones travel
            link.deliver(
                epoch=tr.epoch,
                part=part,
                kind=KIND_SYMBOLS,
                num_rows=plan.num_symbols,
                row_bytes=buffers[part].shape[1],
                routes=routes,
                rows=rows,
                row_ids=row_ids,
                out=buffers[part],
                on_rows=on_rows,
            )
        workspaces = [d.finish() for d in decoders]
        t0 = time.perf_counter()
        batch = delivery.batch(k, workspaces, buffers=self.buffers)
        self.store = store.updated(workspaces, next_caches, self.buffers, store_slots)
        seconds = time.perf_counter() - t0 + sum(d.seconds for d in decoders)
        batch_digest = check.digest()
        self.send_report(batch_digest, seconds, self.store.stored_bytes(), cpu)
        if self.ctx.pending(tr.epoch):  # after the report: a worker lost before it persisted
            known = batch_digest if self.store_is_batch(batch_slots, batch) else None
            self.persist(tr.epoch, tr.next_state, known)  # is found broken on restore, sent again
        self.keep(tr.epoch, batch)
        return batch

    def send_report(
        self, batch_digest: bytes, decode_seconds: float, stored_bytes: int, cpu: HostCpu
    ) -> None:
        """The batch's SHA-256, timings, this host's transport bytes and the CPU it spent since
        ``cpu`` started (checks, decode and digest included), gathered at the master."""
        counts, link_seconds = self.ctx.link.take_counts()
        mine = worker_report(batch_digest, decode_seconds, stored_bytes, counts, cpu)
        gather_reports(mine, self.ctx.link.peer)
        self.report = WorkerReport.of(mine, link_seconds)

    # -- the store on disk, and resuming -------------------------------------------------------

    def store_is_batch(self, batch_slots: list[str | None], batch: torch.Tensor) -> bool:
        """Whether the new store is the new batch, byte for byte: one part, decoded straight
        into its slot (its rows the batch's, in order: ``is_batch``), whole records."""
        store = self.store
        return (
            store is not None
            and len(batch_slots) == 1
            and batch_slots[0] is not None
            and tuple(store.caches[0].shape) == tuple(batch.shape)
        )

    def persist(
        self, epoch: int, state: CacheState | None = None, known: bytes | None = None
    ) -> None:
        """The store after ``epoch`` (``state``) on this worker's disk (the one before it is
        dropped), with its point ids where it is whole points; ``known``: its bytes' SHA-256,
        where the store is the batch the worker hashed as it decoded it."""
        if self.persistence is not None and self.store is not None:
            self.persistence.save(epoch, self.store, known)
            points = (
                None if state is None else whole_store_points(self.ctx.scheme, state, self.worker)
            )
            if points is not None:
                self.persistence.save_points(epoch, points)

    def keep(self, epoch: int, batch: torch.Tensor) -> None:
        """The batch of ``epoch`` kept on disk (``keep_batch``), for a resume inside it."""
        if self.persistence is not None and self.ctx.settings.keep_batch:
            self.persistence.save_batch(epoch, batch)

    def kept_batch(self, epoch: int) -> torch.Tensor | None:
        """The kept batch of ``epoch``, if present and intact."""
        return None if self.persistence is None else self.persistence.load_batch(epoch)

    def load(self, epoch: int) -> bool:
        """The store after ``epoch`` from disk, if every part is present and intact."""
        if not self.ctx.pending(epoch):
            return True  # nothing left to decode: no store needed
        if self.persistence is None or self.delivery is None:
            return False
        store = self.persistence.load(epoch, len(self.delivery.plans))
        if store is not None:
            self.store = store
        return store is not None

    def advance(self, completed: int) -> CacheState:
        """The chain moved on to the state after epoch ``completed`` (plans replayed)."""
        state = self.ctx.chain.initial
        while self.upcoming is not None and self.upcoming.epoch <= completed:
            state = self.upcoming.next_state
            self.upcoming = next(self.ctx.transitions, None)
        self.plan_ahead()
        return state

    def replace(self, completed: int, needs: dict[int, np.ndarray], union: np.ndarray) -> None:
        """Receives its store's points again when it is among the broken (``needs``; ``union``:
        every broken store's points, sorted: the stream's rows)."""
        k = self.worker
        points = needs.get(k, np.zeros(0, dtype=np.int64))
        rows = self.receive_again(completed, needs, union)
        if k in needs and self.delivery is not None:
            self.store = self.store_of(completed, points, rows)
            self.persist(completed)

    def receive_again(
        self, epoch: int, needs: dict[int, np.ndarray], union: np.ndarray, store: bool = True
    ) -> Any:
        """Its points of ``needs`` (sorted) out of the master's uncoded stream of ``union``:
        into the store's slot after ``epoch`` where they are the whole store (``store``)."""
        points = needs.get(self.worker, np.zeros(0, dtype=np.int64))
        routes = self.mine(np.searchsorted(union, points))
        if store:
            return self.receive_points(epoch, points, union.size, routes)
        out = self.buffers.empty(points.size, self.ctx.shape.layout.record_bytes)
        return self.ctx.link.deliver(
            epoch=epoch,
            part=0,
            kind=KIND_PLACEMENT,
            num_rows=union.size,
            row_bytes=self.ctx.shape.layout.record_bytes,
            routes=routes,
            out=out,
        )
