"""Job ``shuffle_sgd``: random-reshuffling SGD whose epoch data moves as a coded broadcast.

Rank 0 (master) holds the training set as records; every epoch it draws the assignment from
the seed, plans the delivery with the configured scheme, proves it, encodes it and moves the
symbols with the configured transport (``dist.transport``, :mod:`coded_shuffle.transports`).
Epoch 1 is the placement: every point sent once, uncoded. Workers (ranks 1..K) decode with
their own store only and report the SHA-256 of the decoded batch; the master compares every
digest with its own and fails loudly on a difference (``verified``). The workers then run
synchronous data-parallel SGD (gradient all-reduce in the workers' gloo subgroup) over their
batch; worker 0 sends the parameters to the master, which evaluates them on the test split.

The scheme changes the bytes on the link, never the batches or their order: with the same seed
every scheme yields bit-identical parameters (``final_params_sha256`` in ``summary.json``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from coded_shuffle.assignment import batches
from coded_shuffle.bounds_api import lower_bound
from coded_shuffle.delivery import Delivery, WorkerStore
from coded_shuffle.errors import UsageError, VerificationError
from coded_shuffle.schemes import Scheme, get_scheme
from coded_shuffle.transports import HostBytes, Link, Peer, Routes, build_transport
from coded_shuffle.transports import transport_class as get_transport_class
from coded_shuffle.transports.framing import (
    HEADER_BYTES,
    KIND_PLACEMENT,
    KIND_SYMBOLS,
    framed_bytes,
)

from . import data, models
from .dist import RankContext, context, die_if_asked, mark, start_liveness, tick
from .liveness import Record
from .metrics import MetricsWriter, human_bytes, saved_percent
from .schedule import (
    Chain,
    Transition,
    minibatch_order,
    outgoing_rows,
    placement_points,
    store_from_points,
    symbol_routes,
)

log = logging.getLogger("train")

COLLECTIVE_TIMEOUT = timedelta(days=7)  # collectives wait for work; the watchdog for peers
DIGEST_BYTES = 32
META_FIELDS = 5  # points, features, classes, point bytes, dropped points (int64 each)
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


def collective_timeout(cfg: Any) -> timedelta:
    """Collectives wait for long work (an epoch's training, a large delivery) without a bound:
    the liveness watchdog fails the job within ``dist.timeout_seconds`` of a lost peer."""
    del cfg
    return COLLECTIVE_TIMEOUT


def link_progress(done: int, total: int) -> None:
    tick(f"{human_bytes(done)} of {human_bytes(total)} moved")


def progress_line(records: dict[int, Record], seconds: float) -> None:
    """The master's console during a long stage: what it does, or what the workers do."""
    me = records.get(0)
    if me is None:
        return
    if me.detail:
        log.info(f"  ... {me.stage}: {me.detail} ({seconds:.0f} s)")
        return
    workers = [rec for r, rec in sorted(records.items()) if r > 0]
    if workers:
        slowest = min(workers, key=lambda rec: (rec.stage_count, rec.ticks))
        doing = slowest.detail or slowest.stage
        log.info(f"  ... {seconds:.0f} s after {me.stage!r}: the slowest worker at {doing}")


def transport_options(cfg: Any) -> dict[str, Any]:
    """The configured transport's own options (``dist.<transport>``), as plain values."""
    from omegaconf import OmegaConf

    node = cfg.dist.get(str(cfg.dist.transport))
    return dict(OmegaConf.to_container(node, resolve=True)) if node is not None else {}


def validate(cfg: Any) -> None:
    """Everything that can be checked before a process starts (raises :class:`UsageError`)."""
    workers, epochs = int(cfg.workers), int(cfg.epochs)
    if workers < 1:
        raise UsageError(f"workers={workers} out of range (must be >= 1)")
    if epochs < 1:
        raise UsageError(f"epochs={epochs} out of range (must be >= 1)")
    info = data.describe(cfg.data)
    if info.train_points < workers:
        raise UsageError(
            f"workers={workers} exceeds the {info.train_points} training points of "
            f"data.source={cfg.data.source} (valid: 1..{info.train_points})"
        )
    points = info.train_points - info.train_points % workers
    scheme = get_scheme(str(cfg.scheme.name))
    if not 1 <= float(cfg.storage) <= workers:
        raise UsageError(f"storage={cfg.storage} out of range 1..{workers} (workers)")
    scheme.check(points, workers, float(cfg.storage))
    scheme.fit_point_bytes(workers, float(cfg.storage), data.record_bytes(info.features))
    models.check(cfg.model, info.features)
    if float(cfg.optim.lr) <= 0:
        raise UsageError(f"optim.lr={cfg.optim.lr} out of range (must be > 0)")
    if int(cfg.optim.batch_size) < 1:
        raise UsageError(f"optim.batch_size={cfg.optim.batch_size} out of range (must be >= 1)")
    if int(cfg.dist.chunk_bytes) < 1:
        raise UsageError(f"dist.chunk_bytes={cfg.dist.chunk_bytes} out of range (must be >= 1)")
    for key in ("timeout_seconds", "heartbeat_seconds", "progress_seconds"):
        if float(cfg.dist[key]) <= 0:
            raise UsageError(f"dist.{key}={cfg.dist[key]} out of range (must be > 0)")
    check_transport(str(cfg.dist.transport), scheme, workers, transport_options(cfg))
    die = cfg.get("debug", {}).get("die_rank")
    if die is not None and not 0 <= int(die) <= workers:
        raise UsageError(f"debug.die_rank={die} out of range 0..{workers}")


def check_transport(name: str, scheme: Scheme, workers: int, options: dict[str, Any]) -> None:
    """A known transport, valid options, and no coded scheme on a point-to-point transport."""
    cls = get_transport_class(name)
    cls.validate(workers + 1, **options)
    if cls.routing != "broadcast" and scheme.coded:
        raise UsageError(
            f"dist.transport={name} carries uncoded deliveries only (each row to one worker); "
            f"scheme={scheme.name} is coded: use scheme=uncoded, or dist.transport=chain, "
            "multicast or tree"
        )


def run(cfg: Any) -> None:
    """Per-rank body (the process group is already set up by :mod:`train.entry`)."""
    ctx = context()
    start_liveness(cfg, progress_line if ctx.is_master else None)
    collective = ctx.collective_timeout or ctx.timeout
    peer = Peer(ctx.rank, ctx.world_size, collective)
    transport = build_transport(str(cfg.dist.transport), peer, transport_options(cfg))
    link = Link(transport, chunk_bytes=int(cfg.dist.chunk_bytes), on_progress=link_progress)
    pair = dist.new_group([0, 1], timeout=collective)  # worker 0 -> master: parameters
    try:
        if ctx.is_master:
            Master(cfg, ctx, link, pair).run()
        else:
            Worker(cfg, ctx, link, pair).run()
    finally:
        transport.close()


def _digests(reports: np.ndarray) -> list[bytes]:
    return [bytes(r) for r in reports["digest"]]


def sha256(rows: torch.Tensor) -> bytes:
    return hashlib.sha256(rows.contiguous().numpy()).digest()


def batch_digests(records: torch.Tensor, new_batches: Sequence[np.ndarray]) -> list[bytes]:
    """SHA-256 of every worker's new batch (its records in sorted point order)."""
    return [sha256(records.index_select(0, torch.from_numpy(b))) for b in new_batches]


def verify_digests(epoch: int, reported: Sequence[bytes], expected: Sequence[bytes]) -> bool:
    """True when every worker's batch digest equals the master's; else VerificationError.

    The comparison behind ``verified``: a worker that decoded a wrong batch, or skipped its
    decode, reports a digest that differs from the master's.
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
    """An epoch the master made ready while the workers trained the one before."""

    tr: Transition
    delivery: Delivery
    symbols: list[torch.Tensor]
    expected: list[bytes]  # SHA-256 of every worker's new batch
    bound: tuple[float, bool]
    plan_seconds: float
    encode_seconds: float


class _Rank:
    """State shared by master and workers: config, scheme, model, optimiser settings."""

    def __init__(self, cfg: Any, ctx: RankContext, link: Link, pair: Any) -> None:
        self.cfg, self.ctx, self.link, self.pair = cfg, ctx, link, pair
        self.workers, self.epochs, self.seed = int(cfg.workers), int(cfg.epochs), int(cfg.seed)
        self.storage = float(cfg.storage)
        self.scheme: Scheme = get_scheme(str(cfg.scheme.name))
        self.chunk = int(cfg.dist.chunk_bytes)
        self.routing = link.transport.routing

    def build_model(self, features: int, classes: int) -> torch.nn.Module:
        torch.manual_seed(self.seed)
        return models.build(self.cfg.model, features, classes)

    def begin(self, epoch: int) -> None:
        die_if_asked(self.cfg, self.ctx.rank, epoch)
        mark(f"epoch {epoch} start")

    def gather_reports(self, epoch: int, mine: np.ndarray) -> np.ndarray | None:
        """Every worker's :data:`REPORT` at the master (``None`` elsewhere)."""
        buf = torch.from_numpy(np.frombuffer(mine.tobytes(), dtype=np.uint8).copy())
        if self.ctx.is_master:
            out = [torch.zeros_like(buf) for _ in range(self.ctx.world_size)]
            dist.gather(buf, gather_list=out, dst=0)
        else:
            dist.gather(buf, dst=0)
        mark(f"epoch {epoch} delivered")
        if not self.ctx.is_master:
            return None
        raw = b"".join(t.numpy().tobytes() for t in out[1:])
        return np.frombuffer(raw, dtype=REPORT)

    def meta(self, values: list[int] | None = None) -> list[int]:
        """The data set's shape, from the master to every rank (control, not shuffle bytes)."""
        t = torch.tensor(values if values is not None else [0] * META_FIELDS, dtype=torch.int64)
        dist.broadcast(t, src=0)
        return t.tolist()


class Master(_Rank):
    """Rank 0: holds the records, plans, proves, encodes, sends, verifies, evaluates, records."""

    def run(self) -> None:
        t_start = time.perf_counter()
        ds = data.load(self.cfg.data, self.workers, self.seed)
        if ds.dropped:
            log.info(
                f"data: dropped {ds.dropped} training points so that {self.workers} workers "
                f"divide N = {ds.num_points}"
            )
        self.records = data.to_records(ds.x_train, ds.y_train)
        self.n, self.b = self.records.shape
        self.dropped = ds.dropped
        self.meta([self.n, ds.features, ds.classes, self.b, ds.dropped])
        self.scheme.fit_point_bytes(self.workers, self.storage, self.b)
        self.chain = Chain(self.scheme, self.n, self.workers, self.storage, self.seed)
        self.model = self.build_model(ds.features, ds.classes)
        self.x_test, self.y_test = torch.from_numpy(ds.x_test), torch.from_numpy(ds.y_test)
        del ds  # the records hold the training split: its arrays can go
        self.writer = MetricsWriter(self.ctx.run_dir, self.epochs, bool(self.cfg.tensorboard))
        q = self.n // self.workers
        self.steps = math.ceil(q / int(self.cfg.optim.batch_size))
        log.info(
            f"shuffle_sgd: scheme {self.scheme.name}, transport {self.link.transport.name}, "
            f"{self.workers} workers, storage {self.storage:g}, N = {self.n} records of "
            f"{self.b} bytes, {self.epochs} epochs"
        )
        self.begin(1)
        row = self.placement()
        for tr in self.chain.transitions(self.epochs):
            ready = self.prepare(tr)  # while the workers train the previous epoch
            self.finish_epoch(row)
            self.begin(tr.epoch)
            row = self.deliver(ready)
        self.finish_epoch(row)
        self.finish(time.perf_counter() - t_start)

    def placement(self) -> dict[str, Any]:
        """Epoch 1: every point sent uncoded; each worker gets (or keeps) what it stores."""
        firsts = batches(self.chain.first, self.workers)
        needs = tuple(
            placement_points(self.scheme, self.chain.initial, k) for k in range(self.workers)
        )
        expected = batch_digests(self.records, firsts)
        t0 = time.perf_counter()
        self.link.deliver(
            epoch=1, part=0, kind=KIND_PLACEMENT, num_rows=self.n, row_bytes=self.b,
            routes=Routes(needs), rows=self.records,
        )  # fmt: skip
        reports = self.gather_reports(1, np.zeros(1, dtype=REPORT))
        verified = verify_digests(1, _digests(reports), expected)
        seconds = time.perf_counter() - t0
        link_bytes = framed_bytes(self.n, self.b, self.chunk)
        return self.delivery_row(
            epoch=1,
            phase="placement",
            reports=reports,
            verified=verified,
            link_bytes=(link_bytes, self.n * self.b),
            uncoded_bytes=link_bytes,
            load_points=float(self.n),
            uncoded_points=float(self.n),
            bound=(float(self.n), True),
            seconds={"delivery": seconds, "plan": 0.0, "encode": 0.0},
            stored=self.scheme.stored_points_max(self.chain.initial),
            breakdown={"placement": float(self.n)},
        )

    def prepare(self, tr: Transition) -> Prepared:
        """Everything an epoch's delivery needs before its first byte: the proved delivery,
        the bound, the encoded symbols and the digests every worker's batch must have."""
        t0 = time.perf_counter()
        delivery = Delivery.prepare(tr.plan, self.b)
        plan_seconds = tr.plan_seconds + time.perf_counter() - t0
        bound = lower_bound(tr.state, tr.new_assignment)
        t1 = time.perf_counter()
        symbols = delivery.encode(self.records)
        encode_seconds = time.perf_counter() - t1
        self.corrupt_if_asked(tr.epoch, symbols)
        expected = batch_digests(self.records, delivery.plans[0].new_batches)
        return Prepared(tr, delivery, symbols, expected, bound, plan_seconds, encode_seconds)

    def deliver(self, ready: Prepared) -> dict[str, Any]:
        """A coded epoch: send every part's symbols, compare the workers' batch digests."""
        tr, delivery, symbols = ready.tr, ready.delivery, ready.symbols
        sizes = delivery.symbol_bytes()
        t0 = time.perf_counter()
        for part, plan in enumerate(delivery.plans):
            known = {k: delivery.programs[part][k].symbol_ids for k in range(self.workers)}
            self.link.deliver(
                epoch=tr.epoch, part=part, kind=KIND_SYMBOLS, num_rows=plan.num_symbols,
                row_bytes=sizes[part], routes=symbol_routes(self.routing, plan, known),
                rows=symbols[part],
            )  # fmt: skip
        reports = self.gather_reports(tr.epoch, np.zeros(1, dtype=REPORT))
        verified = verify_digests(tr.epoch, _digests(reports), ready.expected)
        seconds = time.perf_counter() - t0
        payload = sum(p.num_symbols * b for p, b in zip(delivery.plans, sizes, strict=True))
        return self.delivery_row(
            epoch=tr.epoch,
            phase="coded",
            reports=reports,
            verified=verified,
            link_bytes=(delivery.link_bytes(self.chunk), payload),
            uncoded_bytes=delivery.uncoded_link_bytes(self.chunk),
            load_points=delivery.load_points,
            uncoded_points=delivery.uncoded_points,
            bound=ready.bound,
            seconds={
                "delivery": seconds,
                "plan": ready.plan_seconds,
                "encode": ready.encode_seconds,
            },
            stored=self.scheme.stored_points_max(tr.next_state),
            breakdown=delivery.breakdown(),
        )

    def corrupt_if_asked(self, epoch: int, symbols: list[torch.Tensor]) -> None:
        """Debug knob ``debug.corrupt_epoch``: flips a byte of the first symbol before sending.

        The message digests still match (they cover what is sent), so only the comparison of
        the workers' batch digests with the master's can catch it: the test that a wrong
        decode fails loudly.
        """
        target = (self.cfg.get("debug") or {}).get("corrupt_epoch")
        if target is None or int(target) != epoch or not symbols or not symbols[0].numel():
            return
        symbols[0][0, 0] ^= 0xFF
        log.warning(f"debug: epoch {epoch}: flipped byte 0 of symbol 0 (debug.corrupt_epoch)")

    def delivery_row(
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
        """The epoch's metrics object (losses are added once the parameters arrive)."""
        counts, link_seconds = self.link.take_counts()
        shared, payload = link_bytes
        messages = (shared - payload) // HEADER_BYTES
        return {
            "epoch": epoch,
            "phase": phase,
            "scheme": self.scheme.name,
            "workers": self.workers,
            "storage": self.storage,
            "points": self.n,
            "point_bytes": self.b,
            "dropped_points": self.dropped,
            "broadcast_bytes": shared,
            "payload_bytes": payload,
            "header_bytes": shared - payload,
            "messages": messages,
            "uncoded_bytes": int(uncoded_bytes),
            "lower_bound_points": bound[0],
            "lower_bound_exact": bound[1],
            "lower_bound_bytes": round(bound[0] * self.b),
            "load_points": float(load_points),
            "uncoded_points": float(uncoded_points),
            "saved_percent": saved_percent(shared, uncoded_bytes),
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

    def finish_epoch(self, row: dict[str, Any]) -> None:
        """Waits for the workers' parameters, evaluates them, writes the epoch's record."""
        t0 = time.perf_counter()
        flat = models.flat_params(self.model).clone()
        dist.broadcast(flat, src=1, group=self.pair)
        loss = torch.zeros(2, dtype=torch.float64)
        dist.broadcast(loss, src=1, group=self.pair)
        row["train_seconds"] = time.perf_counter() - t0
        mark(f"epoch {row['epoch']} trained")
        models.load_flat(self.model, flat)
        self.model.eval()
        with torch.no_grad():
            logits = self.model(self.x_test)
            row["test_loss"] = float(F.cross_entropy(logits, self.y_test))
            row["test_accuracy"] = float((logits.argmax(1) == self.y_test).double().mean())
        row["train_loss"] = float(loss[0] / loss[1])
        row["param_bytes"] = flat.numel() * flat.element_size() + loss.numel() * 8
        row["allreduce_payload_bytes"] = self.steps * flat.numel() * flat.element_size()
        self.writer.epoch(row)

    def finish(self, wall: float) -> None:
        final = models.params_sha256(self.model)
        theirs = self.gather_digest(bytes.fromhex(final))
        agree = all(t == final for t in theirs)
        summary = self.writer.summary(
            {
                "scheme": self.scheme.name,
                "workers": self.workers,
                "storage": self.storage,
                "seed": self.seed,
                "points": self.n,
                "point_bytes": self.b,
                "dropped_points": self.dropped,
                "model": str(self.cfg.model.name),
                "data": str(self.cfg.data.source),
                "workers_params_agree": agree,
                "final_params_sha256": final,
                "wall_seconds": wall,
            }
        )
        if not agree:
            raise VerificationError(f"workers' final parameters differ: {theirs} vs {final}")
        log.info(
            f"done: test accuracy {summary['final_test_accuracy']:.3f}, coded epochs "
            f"{summary['coded_epochs_broadcast_bytes']} B vs uncoded "
            f"{summary['coded_epochs_uncoded_bytes']} B "
            f"({summary['coded_epochs_saved_percent']:.1f}% saved), all verified: "
            f"{summary['all_verified']}, params sha256 {final[:16]}"
        )

    def gather_digest(self, mine: bytes) -> list[str]:
        out = [torch.zeros(DIGEST_BYTES, dtype=torch.uint8) for _ in range(self.ctx.world_size)]
        dist.gather(torch.frombuffer(bytearray(mine), dtype=torch.uint8), gather_list=out, dst=0)
        return [bytes(t.tolist()).hex() for t in out[1:]]


class Worker(_Rank):
    """Ranks 1..K: receive, decode with the own store only, report the batch digest, train."""

    def run(self) -> None:
        k = self.ctx.worker
        self.n, self.d, classes, self.b, _ = self.meta()
        self.k, self.q = k, self.n // self.workers
        self.scheme.fit_point_bytes(self.workers, self.storage, self.b)
        self.chain = Chain(self.scheme, self.n, self.workers, self.storage, self.seed)
        self.model = self.build_model(self.d, classes)
        o = self.cfg.optim
        self.opt = torch.optim.SGD(
            self.model.parameters(),
            lr=float(o.lr),
            momentum=float(o.get("momentum", 0.0)),
            weight_decay=float(o.get("weight_decay", 0.0)),
        )
        transitions = self.chain.transitions(self.epochs)
        upcoming = next(transitions, None)
        delivery = None if upcoming is None else Delivery.prepare_worker(upcoming.plan, self.b, k)
        self.begin(1)
        batch, epoch = self.placement(delivery), 1
        while upcoming is not None:
            self.train(epoch, batch)
            self.begin(upcoming.epoch)
            assert delivery is not None
            batch, epoch = self.deliver(upcoming, delivery), upcoming.epoch
            upcoming = next(transitions, None)  # the next plan before training: it is ready
            delivery = (  # when the master sends
                None if upcoming is None else Delivery.prepare_worker(upcoming.plan, self.b, k)
            )
        self.train(epoch, batch)
        self.gather_digest()

    def mine(self, keep: np.ndarray) -> Routes:
        """Routes that name only this worker's needs (what it knows without the others')."""
        return Routes(tuple(keep if i == self.k else None for i in range(self.workers)))

    def placement(self, delivery: Delivery | None) -> torch.Tensor:
        """Receives the points the placement gives it (its first batch and what it caches)."""
        first = batches(self.chain.first, self.workers)[self.k]
        keep = placement_points(self.scheme, self.chain.initial, self.k)
        rows = self.link.deliver(
            epoch=1, part=0, kind=KIND_PLACEMENT, num_rows=self.n, row_bytes=self.b,
            routes=self.mine(keep),
        )  # fmt: skip
        assert rows is not None
        t0 = time.perf_counter()
        batch = rows.index_select(0, torch.from_numpy(np.searchsorted(keep, first)))
        self.store = None if delivery is None else store_from_points(delivery, self.k, keep, rows)
        seconds = time.perf_counter() - t0
        stored = batch.numel() if self.store is None else self.store.stored_bytes()
        self.report(1, batch, seconds, stored)
        return batch

    def deliver(self, tr: Transition, delivery: Delivery) -> torch.Tensor:
        """Receives the epoch's symbols, decodes with its own store only, reports, updates."""
        store: WorkerStore = self.store  # type: ignore[assignment]
        symbols = []
        for part, (plan, sub) in enumerate(
            zip(delivery.plans, delivery.symbol_bytes(), strict=True)
        ):
            keep = delivery.programs[part][self.k].symbol_ids
            routes = symbol_routes(self.routing, plan, {self.k: keep})
            rows = row_ids = None
            if self.routing == "peers":
                if not np.array_equal(routes.needs[self.k], keep):
                    raise VerificationError(f"worker {self.k}: routes differ from its decoder")
                row_ids, rows = outgoing_rows(routes, plan, self.k, store.caches[part])
            got = self.link.deliver(
                epoch=tr.epoch, part=part, kind=KIND_SYMBOLS, num_rows=plan.num_symbols,
                row_bytes=sub, routes=routes, rows=rows, row_ids=row_ids,
            )  # fmt: skip
            symbols.append(got)
        t0 = time.perf_counter()
        batch, workspaces = delivery.decode(self.k, symbols, store)
        next_caches = self.scheme.part_caches(tr.next_state, self.k)
        self.store = store.updated(delivery, self.k, workspaces, next_caches)
        self.report(tr.epoch, batch, time.perf_counter() - t0, self.store.stored_bytes())
        return batch

    def report(
        self, epoch: int, batch: torch.Tensor, decode_seconds: float, stored_bytes: int
    ) -> None:
        """The batch digest, timings and this host's transport bytes, gathered at the master."""
        counts, _ = self.link.take_counts()
        mine = np.zeros(1, dtype=REPORT)
        mine["digest"][0] = np.frombuffer(sha256(batch), dtype=np.uint8)
        mine["decode_seconds"] = decode_seconds
        mine["stored_bytes"] = stored_bytes
        for key, value in zip(
            ("egress", "ingress", "repairs", "control"), counts.as_list(), strict=True
        ):
            mine[key] = value
        self.gather_reports(epoch, mine)

    def train(self, epoch: int, batch: torch.Tensor) -> None:
        """One epoch of synchronous SGD over the own batch; worker 0 sends the result."""
        x, y = data.from_records(batch, self.d)
        order = torch.from_numpy(minibatch_order(self.seed, epoch, self.k, self.q))
        size = int(self.cfg.optim.batch_size)
        params = list(self.model.parameters())
        self.model.train()
        loss_sum, count = 0.0, 0
        steps = math.ceil(self.q / size)
        delay = float((self.cfg.get("debug") or {}).get("step_delay") or 0.0)
        for step, a in enumerate(range(0, self.q, size)):
            tick(f"epoch {epoch} step {step + 1}/{steps}")
            if delay:  # debug: a slow model (long epochs without changing the data)
                time.sleep(delay)
            idx = order[a : a + size]
            loss = F.cross_entropy(self.model(x[idx]), y[idx])
            self.opt.zero_grad(set_to_none=False)
            loss.backward()
            self.all_reduce_grads(params)
            self.opt.step()
            loss_sum += float(loss.detach()) * idx.numel()
            count += idx.numel()
        totals = torch.tensor([loss_sum, count], dtype=torch.float64)
        dist.all_reduce(totals, group=self.ctx.workers_group)
        if self.k == 0:
            dist.broadcast(models.flat_params(self.model), src=1, group=self.pair)
            dist.broadcast(totals, src=1, group=self.pair)
        mark(f"epoch {epoch} trained")

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Averages the gradients over the workers (one flat all-reduce per step)."""
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=self.ctx.workers_group)
        flat /= self.workers
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def gather_digest(self) -> None:
        mine = bytes.fromhex(models.params_sha256(self.model))
        dist.gather(torch.frombuffer(bytearray(mine), dtype=torch.uint8), dst=0)
