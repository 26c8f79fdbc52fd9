"""The master's side of an epoch (rank 0): the placement, then per epoch the proved delivery,
its encoded symbols sent through the link, and the workers' batch digests checked."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from coded_shuffle.codec.encode import Encoder, GatherEncoder
from coded_shuffle.codec.records import Records
from coded_shuffle.costs.wire import framed_bytes
from coded_shuffle.distributed.context import EpochContext
from coded_shuffle.distributed.delivery import Delivery
from coded_shuffle.distributed.delivery_report import DeliveryReport, HostTraffic
from coded_shuffle.distributed.epochs import Transition, placement_points, symbol_routes
from coded_shuffle.distributed.reports import (
    REPORT,
    HostCpu,
    gather_reports,
    peers_seconds,
    verify_digests,
)
from coded_shuffle.distributed.resize import exchange_held, still_needed
from coded_shuffle.distributed.transports import Routes
from coded_shuffle.distributed.transports.framing import (
    HEADER_BYTES,
    KIND_PLACEMENT,
    KIND_SYMBOLS,
)
from coded_shuffle.math.assignment import batches
from coded_shuffle.math.state import CacheState
from coded_shuffle.math.transition_bounds import lower_bound

ENCODE_AHEAD_MAX_BYTES = 256 << 20  # an epoch's symbols encoded ahead up to this; else streamed

Symbols = list[torch.Tensor] | list[Encoder | GatherEncoder]


@dataclass
class ReadyEpoch:
    """An epoch the master made ready before its first byte (while the workers trained)."""

    tr: Transition
    delivery: Delivery
    symbols: Symbols  # encoders: encoded as they are sent
    expected: Future[list[bytes]]  # SHA-256 of every worker's new batch, hashed meanwhile
    bound: tuple[float, bool]
    plan_seconds: float
    encode_seconds: float


class MasterSide:
    """Rank 0's epochs: holds the records, prepares each epoch ahead, delivers and verifies."""

    def __init__(self, ctx: EpochContext, records: Records, stream: bool) -> None:
        self.ctx, self.records, self.stream = ctx, records, stream
        # the batches' digests, hashed beside the rest (hashlib lets go of the interpreter)
        self.hasher = ThreadPoolExecutor(1, thread_name_prefix="batch-digests")
        self.ready: ReadyEpoch | None = None
        self.assignment = ctx.chain.first  # the last delivered epoch's

    def close(self) -> None:
        """The digest thread told to stop: a digest it hashes now ends, none queued starts."""
        self.hasher.shutdown(wait=False, cancel_futures=True)

    def epoch(self, epoch: int) -> DeliveryReport:
        """Delivers ``epoch`` and returns its report; then prepares the next one (if known)."""
        if epoch == self.ctx.chain.first_epoch:
            row = self.placement(epoch)
            self.assignment = self.ctx.chain.first
        else:
            ready = self.ready or self.prepare(next(self.ctx.transitions), stream=self.stream)
            self.ready = None
            row = self.deliver(ready)
            self.assignment = ready.tr.new_assignment
            del ready  # its plan and programs go before the next epoch's are made
        if self.ctx.settings.epochs is not None and epoch < self.ctx.settings.epochs:
            self.ready = self.prepare(next(self.ctx.transitions))  # while the workers train
            if epoch == self.ctx.chain.first_epoch:
                self.prime(self.ready)
        return row

    def prime(self, ready: ReadyEpoch) -> None:
        """The rows the transport takes from its buffers in the first coded delivery, every
        page touched (:meth:`Buffers.prime`) while the workers train: that delivery then
        runs as a later one does."""
        link, delivery = self.ctx.link, ready.delivery
        shapes = [
            shape
            for plan, sub in zip(delivery.plans, delivery.symbol_bytes(), strict=True)
            for shape in link.scratch_shapes(KIND_SYMBOLS, plan.num_symbols, sub)
        ]
        link.carrier(KIND_SYMBOLS).buffers.prime(shapes)

    def placement(self, epoch: int) -> DeliveryReport:
        """The first epoch: every point sent uncoded; each worker gets (or keeps) what it
        stores. After a change in the number of workers, only what each worker does not hold
        yet: the stream is those points; the record's ``reused_points`` says what was held,
        its ``uncoded_bytes`` what a fresh placement sends."""
        ctx = self.ctx
        n, b, chunk = ctx.shape.num_points, ctx.shape.layout.record_bytes, ctx.link.chunk_bytes
        keeps = [
            placement_points(ctx.scheme, ctx.chain.initial, k) for k in range(ctx.shape.workers)
        ]
        held = exchange_held(None, ctx.link.peer) if ctx.settings.previous_workers else None
        expected = [self.records.digest(p) for p in batches(ctx.chain.first, ctx.shape.workers)]
        sent, bound = n, (float(n), True)
        t0, cpu = time.perf_counter(), HostCpu.start()
        if held is None:
            rows = self.records if self.records.array is None else self.records.array
            ctx.link.deliver(
                epoch=epoch,
                part=0,
                kind=KIND_PLACEMENT,
                num_rows=n,
                row_bytes=b,
                routes=Routes(tuple(keeps)),
                rows=rows,
            )
        else:  # what each worker lacks, as a restore re-places a broken store
            needs = still_needed(keeps, held)
            union = np.unique(np.concatenate(needs))
            if union.size:
                self.replace(epoch, dict(enumerate(needs)), union)
            sent = union.size
            bound = (float(max(need.size for need in needs)), False)  # what one worker lacks
            reused = int(sum(k.size for k in keeps) - sum(need.size for need in needs))
        reports, cpu = self.reports(), cpu.stop()
        verified = verify_digests(epoch, [bytes(r) for r in reports["digest"]], expected)
        fresh = framed_bytes(n, b, chunk)
        return self.epoch_metrics(
            epoch=epoch,
            phase="placement",
            reports=reports,
            verified=verified,
            link_bytes=(framed_bytes(sent, b, chunk), sent * b),
            uncoded_bytes=fresh,
            load_points=float(sent),
            uncoded_points=float(n),
            bound=bound,
            seconds={"delivery": time.perf_counter() - t0, "plan": 0.0, "encode": 0.0},
            stored=self.ctx.scheme.stored_points_max(ctx.chain.initial),
            breakdown={"placement": float(n)},
            cpu=cpu,
            reused_points=None if held is None else reused,
            placement_transport=ctx.link.carrier(KIND_PLACEMENT).name,
        )

    def prepare(self, tr: Transition, stream: bool = False) -> ReadyEpoch:
        """Everything an epoch's delivery needs before its first byte: the proved delivery,
        the bound, the encoded symbols and the digests every worker's batch must have.

        ``stream``: the symbols are encoded message by message while earlier ones are on the
        link (an epoch that was not made ready while the workers trained, or whose symbols
        would not fit :data:`ENCODE_AHEAD_MAX_BYTES`, or whose records are not one array in
        memory: the master never holds an epoch of a large data set)."""
        t0 = time.perf_counter()
        delivery = Delivery.prove(tr.plan, self.ctx.shape.layout.record_bytes)
        plan_seconds = tr.plan_seconds + time.perf_counter() - t0
        bound = lower_bound(tr.state, tr.new_assignment)
        t1 = time.perf_counter()
        large = delivery.payload_bytes() > ENCODE_AHEAD_MAX_BYTES or self.records.array is None
        symbols: Symbols
        if stream or large:
            symbols = delivery.encoders(self.records)
        else:
            symbols = delivery.encode(self.records)
        encode_seconds = time.perf_counter() - t1
        expected = self.hasher.submit(self.digests, tr.plans[0].new_batches)
        return ReadyEpoch(tr, delivery, symbols, expected, bound, plan_seconds, encode_seconds)

    def digests(self, batches: tuple[np.ndarray, ...]) -> list[bytes]:
        """The SHA-256 every worker's new batch must have: all ``N`` records read and hashed,
        in a thread of its own from :meth:`prepare` until the workers' reports are in (while
        the workers train, and while the epoch's bytes move), not before the delivery."""
        return [self.records.digest(p) for p in batches]

    def deliver(self, ready: ReadyEpoch) -> DeliveryReport:
        """A coded epoch: send every part's symbols, compare the workers' batch digests."""
        tr, delivery, symbols, link = ready.tr, ready.delivery, ready.symbols, self.ctx.link
        sizes = delivery.symbol_bytes()
        chunk, routing = link.chunk_bytes, link.transport.routing
        t0, cpu = time.perf_counter(), HostCpu.start()
        for part, plan in enumerate(delivery.plans):
            known = {k: delivery.keeps(part, k) for k in range(self.ctx.shape.workers)}
            link.deliver(
                epoch=tr.epoch,
                part=part,
                kind=KIND_SYMBOLS,
                num_rows=plan.num_symbols,
                row_bytes=sizes[part],
                routes=symbol_routes(routing, plan, known),
                rows=symbols[part],
            )
        reports, cpu = self.reports(), cpu.stop()
        seconds = time.perf_counter() - t0
        if routing == "peers":  # the bytes move between the workers: timed by their clocks
            seconds = peers_seconds(reports)
        expected = ready.expected.result()
        verified = verify_digests(tr.epoch, [bytes(r) for r in reports["digest"]], expected)
        return self.epoch_metrics(
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
                "delivery": seconds,
                "plan": ready.plan_seconds,
                "encode": ready.encode_seconds
                + sum(x.seconds for x in symbols if not isinstance(x, torch.Tensor)),
            },
            stored=self.ctx.scheme.stored_points_max(tr.next_state),
            breakdown=delivery.breakdown(),
            cpu=cpu,
        )

    def reports(self) -> np.ndarray:
        reports = gather_reports(np.zeros(1, dtype=REPORT), self.ctx.link.peer)
        assert reports is not None
        return reports

    def epoch_metrics(
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
        cpu: HostCpu,
        reused_points: int | None = None,
        placement_transport: str | None = None,
    ) -> DeliveryReport:
        """The epoch's :class:`~.delivery_report.DeliveryReport` (docs/training.md, "Outputs")."""
        ctx = self.ctx
        counts, link_seconds = ctx.link.take_counts()
        shared, payload = link_bytes
        b = ctx.shape.layout.record_bytes
        return DeliveryReport(
            epoch=epoch,
            phase=phase,
            scheme=self.ctx.scheme.name,
            workers=ctx.shape.workers,
            storage=ctx.settings.storage,
            storage_used=ctx.storage_used,
            shuffle=ctx.chain.policy.name,
            fraction=ctx.chain.policy.fraction,
            points=ctx.shape.num_points,
            point_bytes=b,
            dropped_points=ctx.shape.dropped,
            broadcast_bytes=shared,
            payload_bytes=payload,
            header_bytes=shared - payload,
            messages=(shared - payload) // HEADER_BYTES,
            uncoded_bytes=int(uncoded_bytes),
            lower_bound_points=bound[0],
            lower_bound_exact=bound[1],
            lower_bound_bytes=round(bound[0] * b),
            load_points=float(load_points),
            uncoded_points=float(uncoded_points),
            saved_percent=100.0 * (1 - shared / uncoded_bytes) if uncoded_bytes else 0.0,
            hosts=HostTraffic.of(ctx.link.transport.name, counts, reports, cpu),
            network_bytes_model=ctx.link.take_modelled(),
            transport_settings=ctx.link.transport.settings(),
            link_seconds=link_seconds,
            delivery_seconds=seconds["delivery"],
            plan_seconds=seconds["plan"],
            encode_seconds=seconds["encode"],
            decode_seconds=float(reports["decode_seconds"].max()),
            verified=verified,
            stored_points_max=float(stored),
            worker_stored_bytes_max=int(reports["stored_bytes"].max()),
            breakdown=breakdown,
            reused_points=reused_points,
            placement_transport=placement_transport,
        )

    # -- resuming ------------------------------------------------------------------------------

    def advance(self, completed: int) -> CacheState:
        """The chain moved on to the state after epoch ``completed`` (plans replayed, nothing
        proved, encoded or sent)."""
        state = self.ctx.chain.initial
        for _ in range(completed - self.ctx.chain.first_epoch):
            state = next(self.ctx.transitions).next_state
        return state

    def replace(self, completed: int, needs: dict[int, np.ndarray], union: np.ndarray) -> None:
        """The points of every broken worker's store (``needs``; ``union``: all of them,
        sorted), uncoded, to that worker."""
        empty = np.zeros(0, dtype=np.int64)
        routes = Routes(
            tuple(
                np.searchsorted(union, needs[k]) if k in needs else empty
                for k in range(self.ctx.shape.workers)
            )
        )
        self.ctx.link.deliver(
            epoch=completed,
            part=0,
            kind=KIND_PLACEMENT,
            num_rows=union.size,
            row_bytes=self.ctx.shape.layout.record_bytes,
            routes=routes,
            rows=self.records.pick(union),
        )
