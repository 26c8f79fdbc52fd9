"""The job's rank 0: holds the data set (handed to the coded shuffle), evaluates the workers'
parameters after every epoch, checkpoints, and writes the metrics."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from coded_shuffle.codec.records import item_labels
from coded_shuffle.distributed.launcher_env import attempt
from coded_shuffle.distributed.liveness import Heartbeat
from coded_shuffle.errors import VerificationError
from coded_shuffle.math.mixing import Mixing

from .. import checkpoint, data, models
from ..device import to_device
from ..dist import mark
from ..faults import corrupt_if_asked
from ..metrics import MetricsWriter, human_bytes
from .rank import Rank, recv
from .record import EpochRecord, Trained
from .start import (
    AfterEpoch,
    Complete,
    Fresh,
    InsideEpoch,
    Opening,
    Resized,
    RunStart,
    Saved,
    broadcast,
    decide,
    gather_held,
)
from .steps import averaging_steps, model_inputs

log = logging.getLogger("train")

DIGEST_BYTES = 32


def restored(start: AfterEpoch | Resized, report: Mapping[str, Any], workers: int) -> str:
    """What a restart after an epoch kept and sent again (the console line's tail)."""
    if isinstance(start, Resized):
        return (
            f" with {workers} workers instead of {start.workers_before}: epoch {start.done + 1} "
            "places the data anew, reusing what the workers that remain hold; the minibatches "
            "differ from an unbroken run's"
        )
    replaced = report["replaced_workers"]
    kept = f": stores of {workers - len(replaced)} of {workers} workers intact"
    if not replaced:
        return kept
    return f"{kept}, workers {replaced} re-placed ({human_bytes(report['replacement_bytes'])})"


def stage_line(records: dict[int, Heartbeat], seconds: float) -> None:
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


@dataclass(frozen=True)
class Resumed:
    """The first epoch after a restart: what its record adds, and (resumed inside it) the
    record of the delivery made before the restart, which is not made again."""

    start: RunStart
    report: Mapping[str, Any]  # the coded shuffle's report of the restore (Restored)
    delivery: Mapping[str, Any] | None = None

    def record(self, delivery: Mapping[str, Any]) -> dict[str, Any]:
        """The record's keys that say what the restart cost (``delivery``: this epoch's)."""
        extra = {**self.report, **self.start.record()}  # the attempt: every row's own
        if isinstance(self.start, Resized):  # the placement for the new number of workers
            extra["resize_bytes"] = delivery["broadcast_bytes"]
            extra["fresh_placement_bytes"] = delivery["uncoded_bytes"]
        return extra


class Master(Rank):
    """Rank 0: holds the data set, evaluates the workers' parameters, writes the metrics."""

    def run(self) -> None:
        t_start = time.perf_counter()
        saved = self.setup()
        if isinstance(self.start, Complete):
            log.info(
                f"the run is complete: its checkpoint holds epoch {self.start.done} of "
                f"{self.epochs}; nothing to do (another hydra.run.dir starts a new run)"
            )
            return
        resumed = self.resume(saved)
        clock = (time.perf_counter(), self.elapsed_before(saved))
        try:
            for epoch in range(self.start.done + 1, self.epochs + 1):
                self.epoch(epoch, clock, resumed)
                resumed = None
        finally:
            self.cs.close()
        self.finish(time.perf_counter() - t_start)

    def setup(self) -> checkpoint.Checkpoint | None:
        """The data set loaded, the run's start decided and told to every rank, the data set
        handed to the coded shuffle, the model, the metrics; returns the checkpoint to resume
        from (None: none)."""
        ds = data.load(self.cfg.data, self.workers, self.seed)
        if ds.dropped:
            log.info(
                f"data: dropped {ds.dropped} training points so that {self.workers} workers "
                f"divide N = {ds.num_points}"
            )
        self.dropped = ds.dropped
        saved = checkpoint.load(self.ctx.run_dir, self.cfg) if self.checkpointing else None
        self.start = self.decide_start(saved)
        broadcast(Opening(self.start, ds.classes))
        if isinstance(self.start, Complete):
            return saved
        # records of the inputs' and labels' own bytes (the array sources: float32 features
        # and an int32 label, 4 d + 4 bytes; data=dataset: the items' dtypes), read where
        # they are (a packed directory: memory-mapped)
        self.cs = self.coded_shuffle(ds.train, self.start)
        corrupt_if_asked(self.cfg.debug)
        self.n, self.b = self.cs.shape.num_points, self.cs.record_bytes
        self.mixing = self.mixing_from(ds, saved)
        self.model = self.build_model(ds.input_shape, ds.classes)
        self.data = ds  # its test split, evaluated a block at a time
        self.writer = MetricsWriter(self.ctx.run_dir, self.epochs, bool(self.cfg.tensorboard))
        self.steps = math.ceil(self.n // self.workers / int(self.cfg.optim.batch_size))
        self.optimizer: dict[str, Any] | None = None  # worker 0's last state_dict()
        self.announce()
        return saved

    def mixing_from(self, ds: data.DataSet, saved: checkpoint.Checkpoint | None) -> Mixing:
        """What the shuffles have mixed so far (:mod:`coded_shuffle.math.mixing`): the
        checkpoint's, where its workers are these; else from nothing (a fresh run, or the
        first placement for another number of workers)."""
        labels = item_labels(ds.train, self.n)
        seen = saved.mixing_seen if saved is not None else None
        if seen is not None and seen.shape[0] != self.workers:
            seen = None
        return Mixing(labels, self.workers, seen)

    def decide_start(self, saved: checkpoint.Checkpoint | None) -> RunStart:
        """The run's start (:func:`~coded_shuffle_train.shuffle_sgd.start.decide`) from the
        checkpoint, the
        delivery record of the epoch after it, and every worker's step checkpoints."""
        view = None
        if saved is not None:
            view = Saved(saved.epoch, saved.workers, saved.first_epoch)
        done = view.done if view is not None else 0
        self.delivered = None
        if self.step_every:
            self.delivered = checkpoint.load_delivery(self.ctx.run_dir, self.cfg, done + 1)
        held = gather_held(set())
        return decide(view, self.workers, self.delivered is not None, held, self.epochs)

    def announce(self) -> None:
        """The run's one line of settings (and the storage a point size really gives)."""
        s = self.cs.settings
        policy = s.shuffle + (f" (fraction {s.fraction:g})" if s.shuffle == "partial" else "")
        every = self.average_every
        local = f", local SGD (models averaged every {every} steps)" if every else ""
        log.info(
            f"shuffle_sgd: scheme {self.cs.scheme.name}, transport {s.transport}, placement "
            f"{s.placement}, shuffle {policy}{local}, {self.workers} workers, storage "
            f"{self.storage:g}, N = {self.n} records of {self.b} bytes, {self.epochs} epochs"
        )
        if abs(self.cs.storage_used - self.storage) > 1e-9:
            log.info(
                f"storage: {self.b}-byte records store T = {self.cs.storage_used:.6g}, not "
                f"{self.storage:g}: the point size moves bytes to another corner"
            )

    @staticmethod
    def elapsed_before(saved: checkpoint.Checkpoint | None) -> float:
        """Seconds since the first epoch began, before this attempt: the last record's, and
        the time between it and now (the restart)."""
        if not saved:
            return 0.0
        last = saved.rows[-1]
        since = time.time() - float(last["time"])
        return float(last["elapsed_seconds"]) + max(0.0, since)

    def epoch(self, epoch: int, clock: tuple[float, float], resumed: Resumed | None) -> None:
        """Delivers ``epoch`` (resumed inside it: the delivery made before the restart),
        waits for the trained model, checkpoints, records."""
        began = time.perf_counter()
        self.begin(epoch)
        if resumed is not None and resumed.delivery is not None:
            delivery = resumed.delivery
        else:
            self.cs.epoch(epoch)  # then prepares the next while the workers train
            delivery = self.cs.report
            if self.step_every:  # the delivery's record, for a restart inside the epoch
                checkpoint.save_delivery(self.ctx.run_dir, self.cfg, epoch, dict(delivery))
        mark(f"epoch {epoch} delivered")
        mixing = self.mixing.add(self.cs.assignment)
        restart = resumed.record(delivery) if resumed is not None else {}
        trained = self.finish_epoch(epoch)
        now = time.perf_counter()
        first, before = clock
        record = EpochRecord(
            delivery=delivery,
            attempt=attempt(),
            mixing=mixing,
            restart=restart,
            trained=trained,
            epoch_seconds=now - began,  # delivery, training, evaluation: the wall clock
            elapsed_seconds=before + now - first,
            time=time.time(),
        )
        row = dict(record)
        if self.checkpointing:  # before the record: a recorded epoch is a resumable one
            state = checkpoint.Checkpoint(
                shuffle=self.cs.state_dict(),
                params=self.host_params(),
                optimizer=self.optimizer,
                rows=[*self.writer.rows, row],
                mixing_seen=self.mixing.seen,
            )
            checkpoint.save(self.ctx.run_dir, self.cfg, state)
        self.writer.epoch(row)

    def resume(self, saved: checkpoint.Checkpoint | None) -> Resumed | None:
        """After a restart, as the run's start says: the stores restored (after an epoch),
        the checkpointed model and optimiser state to every rank and the metrics so far rewritten
        (after an epoch, or with another number of workers), or the stores and the workers'
        batches restored with no new delivery (inside an epoch). What the first epoch's
        record adds comes back."""
        start = self.start
        if isinstance(start, Fresh):
            return None
        if isinstance(start, InsideEpoch):
            return self.resume_inside(saved, start)
        assert saved is not None
        report: Mapping[str, Any] = {}
        if isinstance(start, AfterEpoch):
            self.cs.load_state_dict(saved.shuffle)  # its stores, after saved.epoch
            report = self.cs.report
        self.checkpointed_model(saved)
        kept = restored(start, report, self.workers)
        log.info(f"resumed after epoch {start.done} (attempt {attempt()}){kept}")
        return Resumed(start, report)

    def checkpointed_model(self, saved: checkpoint.Checkpoint) -> None:
        """The checkpoint's parameters and optimiser state, here and to every rank; its
        metrics so far rewritten."""
        params = saved.params.clone()
        self.optimizer = self.resumed_state(params, saved.optimizer)
        self.load_params(params)
        self.writer.resume(saved.rows)

    def resume_inside(self, saved: checkpoint.Checkpoint | None, start: InsideEpoch) -> Resumed:
        """After a restart inside epoch ``start.done + 1``, once every worker has trained
        ``start.step`` steps of it: the stores and the workers' batches restored (no new
        delivery; the workers load their own training state), the metrics so far rewritten.
        The epoch's record is its delivery's (the attempt before) with what the restart
        cost."""
        epoch = start.done + 1
        self.cs.resume_inside(epoch)
        report = self.cs.report
        if saved is not None:
            self.writer.resume(saved.rows)
        again = sorted(set(report["replaced_workers"] + report["rebatched_workers"]))
        sent = f"; sent again: workers {again}" if again else ""
        log.info(
            f"resumed inside epoch {epoch} at step {start.step} of {self.steps} (attempt "
            f"{attempt()}): no new delivery{sent}"
        )
        return Resumed(start, report, self.delivered)

    def finish_epoch(self, epoch: int) -> Trained:
        """Waits for the workers' parameters, evaluates them: what the training adds to the
        epoch's record."""
        flat = self.host_params().clone()
        recv(flat, self.model_sender)
        totals = torch.zeros(4, dtype=torch.float64)  # loss sum, count; steps' s, wait s
        recv(totals, self.model_sender)
        mark(f"epoch {epoch} trained")
        self.load_params(flat)
        self.model.eval()
        test_loss, test_accuracy = self.evaluate()
        if self.checkpointing:
            box: list[Any] = [None]
            dist.recv_object_list(box, src=self.model_sender)
            self.optimizer = box[0]
        model_bytes = flat.numel() * flat.element_size()
        return Trained(
            train_seconds=float(totals[2]),
            wait_seconds=float(totals[3]),
            test_loss=test_loss,
            test_accuracy=test_accuracy,
            train_loss=float(totals[0] / totals[1]),
            param_bytes=model_bytes + 2 * 8,  # the parameters, the loss's sum and count
            allreduce_payload_bytes=self.allreduce_bytes(model_bytes),
        )

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """Test loss and accuracy of the model, the test split read a block at a time."""
        losses, correct, count = [], 0.0, 0
        for inputs, labels in self.data.test_batches():
            logits = self.model(to_device(model_inputs(self.data.transform, inputs), self.device))
            labels = to_device(labels, self.device)
            losses.append((float(F.cross_entropy(logits, labels)), labels.numel()))
            correct += float((logits.argmax(1) == labels).double().sum())
            count += labels.numel()
        if len(losses) == 1:
            return losses[0][0], correct / count
        return sum(loss * n for loss, n in losses) / count, correct / count

    def allreduce_bytes(self, model_bytes: int) -> int:
        """What the workers' all-reduce carries in an epoch (payload): a gradient per step, or
        with local SGD the parameters and momentum buffers per averaging."""
        if not self.average_every:
            return self.steps * model_bytes
        copies = 2 if self.momentum else 1
        return len(averaging_steps(self.steps, self.average_every)) * copies * model_bytes

    def finish(self, wall: float) -> None:
        final = models.params_sha256(self.model)
        theirs = self.gather_digest(bytes.fromhex(final))
        agree = all(t == final for t in theirs)
        s = self.cs.settings
        summary = self.writer.summary(
            {
                "scheme": self.cs.scheme.name,
                "workers": self.workers,
                "storage": self.storage,
                "shuffle": s.shuffle,
                "fraction": s.fraction,
                "average_every": self.average_every,
                "placement": s.placement,
                "seed": self.seed,
                "points": self.n,
                "point_bytes": self.b,
                "dropped_points": self.dropped,
                "model": str(self.cfg.model.name),
                "data": str(self.cfg.data.source),
                "device": str(self.device),  # the master's (a worker's: cuda:LOCAL_RANK)
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
        dist.gather(
            torch.frombuffer(bytearray(mine), dtype=torch.uint8), gather_list=out, dst=self.master
        )
        return [bytes(t.tolist()).hex() for t in self.ctx.roles.by_role(out)[1:]]
