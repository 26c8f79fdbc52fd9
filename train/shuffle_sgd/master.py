"""The job's rank 0: holds the data set (handed to the coded shuffle), evaluates the workers'
parameters after every epoch, checkpoints, and writes the metrics."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from coded_shuffle.distributed import faults
from coded_shuffle.distributed.liveness import Heartbeat
from coded_shuffle.errors import VerificationError

from .. import checkpoint, data, models
from ..agent_env import attempt
from ..device import to_device
from ..dist import mark
from ..metrics import MetricsWriter, human_bytes
from .rank import Rank
from .steps import averaging_steps, model_inputs

log = logging.getLogger("train")

DIGEST_BYTES = 32


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


class Master(Rank):
    """Rank 0: holds the data set, evaluates the workers' parameters, writes the metrics."""

    def run(self) -> None:
        t_start = time.perf_counter()
        saved = self.setup()
        done = int(saved["epoch"]) if saved else 0
        inside = self.step_every and self.before is None
        record = checkpoint.load_delivery(self.ctx.run_dir, done + 1) if inside else None
        at = self.agree_inside(done, set(), ready=record is not None)
        if at:
            assert record is not None
            restart = self.resume_inside(saved, done + 1, at, record)
        elif saved:
            restart = self.resize(saved) if self.before is not None else self.resume(saved)
        else:
            restart = {}
        clock = (time.perf_counter(), self.elapsed_before(saved))
        try:
            for epoch in range(done + 1, self.epochs + 1):
                self.epoch(epoch, clock, restart)
                restart = {}
        finally:
            self.cs.close()
        self.finish(time.perf_counter() - t_start)

    def setup(self) -> dict[str, Any] | None:
        """The data set loaded and handed to the coded shuffle, the model, the metrics; the
        checkpoint to resume from (None: a fresh run)."""
        ds = data.load(self.cfg.data, self.workers, self.seed)
        if ds.dropped:
            log.info(
                f"data: dropped {ds.dropped} training points so that {self.workers} workers "
                f"divide N = {ds.num_points}"
            )
        self.dropped = ds.dropped
        saved = checkpoint.load(self.ctx.run_dir, self.cfg) if self.checkpointing else None
        done = int(saved["epoch"]) if saved else 0
        before = int(saved.get("workers", self.workers)) if saved else self.workers
        self.before = before if before != self.workers else None  # a change in their number
        # the chain of assignments starts at the run's last placement
        first = done + 1 if self.before else int(saved.get("first_epoch", 1)) if saved else 1
        self.meta([ds.features, ds.classes, ds.dropped, done, first, self.before or 0])
        # records of the inputs' and labels' own bytes (the array sources: float32 features
        # and an int32 label, 4 d + 4 bytes; data=dataset: the items' dtypes), read where
        # they are (a packed directory: memory-mapped)
        self.cs = self.coded_shuffle(ds.train, first, self.before)
        if self.cfg.debug.corrupt_epoch is not None:
            faults.set_before_send(self.corrupt_if_asked)
        self.n, self.b = self.cs.shape.num_points, self.cs.record_bytes
        self.model = self.build_model(ds.input_shape, ds.classes)
        self.data = ds  # its test split, evaluated a block at a time
        self.writer = MetricsWriter(self.ctx.run_dir, self.epochs, bool(self.cfg.tensorboard))
        self.steps = math.ceil(self.n // self.workers / int(self.cfg.optim.batch_size))
        self.momentum_flat = torch.zeros(0)
        self.announce()
        return saved

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
    def elapsed_before(saved: dict[str, Any] | None) -> float:
        """Seconds since the first epoch began, before this attempt: the last record's, and
        the time between it and now (the restart)."""
        if not saved:
            return 0.0
        last = saved["rows"][-1]
        since = time.time() - float(last["time"])
        return float(last["elapsed_seconds"]) + max(0.0, since)

    def epoch(self, epoch: int, clock: tuple[float, float], restart: dict[str, Any]) -> None:
        """Delivers ``epoch``, waits for the trained model, checkpoints, records."""
        began = time.perf_counter()
        self.begin(epoch)
        if "resumed_at_step" in restart:  # delivered before the restart
            delivery = restart.pop("delivery")
        else:
            self.cs.epoch(epoch)  # then prepares the next while the workers train
            delivery = self.cs.report
            if self.step_every:  # the delivery's record, for a restart inside the epoch
                checkpoint.save_delivery(self.ctx.run_dir, epoch, delivery)
            if "workers_before" in restart:  # the placement after a change in their number
                restart["resize_bytes"] = delivery["broadcast_bytes"]
                restart["fresh_placement_bytes"] = delivery["uncoded_bytes"]
        mark(f"epoch {epoch} delivered")
        report = {**delivery, "dropped_points": self.dropped, "attempt": attempt()}
        row = self.finish_epoch({**report, **restart}, (began, *clock))
        if self.checkpointing:  # before the record: a recorded epoch is a resumable one
            flat = self.host_params()
            rows = [*self.writer.rows, row]
            checkpoint.save(self.ctx.run_dir, self.cfg, epoch, flat, self.momentum_flat, rows,
                            first_epoch=self.cs.settings.first_epoch)  # fmt: skip
        self.writer.epoch(row)

    def resume(self, saved: dict[str, Any]) -> dict[str, Any]:
        """After a restart: the stores restored (damaged ones re-placed), the checkpointed
        model and momentum to every rank, the metrics so far rewritten. The first resumed
        epoch's record says what the restart cost."""
        done = int(saved["epoch"])
        report = self.cs.restore(done)
        self.checkpointed_model(saved)
        replaced = report["replaced_workers"]
        log.info(
            f"resumed after epoch {done} (attempt {attempt()}): stores of "
            f"{self.workers - len(replaced)} of {self.workers} workers intact"
            + (f", workers {replaced} re-placed ({human_bytes(report['replacement_bytes'])})"
               if replaced else "")
        )  # fmt: skip
        return {**report, "attempt": attempt()}

    def checkpointed_model(self, saved: dict[str, Any]) -> None:
        """The checkpoint's parameters and momentum, here and to every rank; its metrics so
        far rewritten."""
        params, momentum = saved["params"].clone(), saved["momentum"].clone()
        self.resumed_state(params, momentum)
        self.load_params(params)
        self.momentum_flat = momentum
        self.writer.resume(saved["rows"])

    def resize(self, saved: dict[str, Any]) -> dict[str, Any]:
        """After a restart with another number of workers: the checkpointed model and
        momentum to every rank, the new workers' among them, and the metrics so far
        rewritten; the next epoch is a placement for the new number that reuses what the
        workers that remain hold. Minibatches differ from there on (not bit-identical to
        any unbroken run)."""
        done = int(saved["epoch"])
        self.checkpointed_model(saved)
        log.info(
            f"resumed after epoch {done} (attempt {attempt()}) with {self.workers} workers "
            f"instead of {self.before}: epoch {done + 1} places the data anew, reusing what "
            "the workers that remain hold; the minibatches differ from an unbroken run's"
        )
        return {
            "resumed_after_epoch": done,
            "workers_before": self.before,
            "workers_after": self.workers,
            "attempt": attempt(),
        }

    def resume_inside(
        self, saved: dict[str, Any] | None, epoch: int, step: int, delivery: dict[str, Any]
    ) -> dict[str, Any]:
        """After a restart inside ``epoch``, once every worker has trained ``step`` steps of
        it: the stores and the workers' batches restored (no new delivery; the workers load
        their own training state), the metrics so far rewritten. The epoch's record is its
        delivery's (the attempt before) with what the restart cost."""
        self.cs.resume_inside(epoch)
        report = self.cs.report
        if saved:
            self.writer.resume(saved["rows"])
        again = report["replaced_workers"] + report["rebatched_workers"]
        log.info(
            f"resumed inside epoch {epoch} at step {step} of {self.steps} (attempt "
            f"{attempt()}): no new delivery"
            + (f"; sent again: workers {sorted(set(again))}" if again else "")
        )  # fmt: skip
        return {**report, "resumed_at_step": step, "attempt": attempt(), "delivery": delivery}

    def corrupt_if_asked(self, epoch: int, symbols: list[torch.Tensor]) -> None:
        """Debug knob ``debug.corrupt_epoch``: flips a byte of the first symbol before sending.

        The message digests still match (they cover what is sent), so only the comparison of
        the workers' batch digests with the master's can catch it: the test that a wrong
        decode fails loudly.
        """
        target = self.cfg.debug.corrupt_epoch
        if target is None or int(target) != epoch or not symbols or not symbols[0].numel():
            return
        symbols[0][0, 0] ^= 0xFF
        log.warning(f"debug: epoch {epoch}: flipped byte 0 of symbol 0 (debug.corrupt_epoch)")

    def finish_epoch(
        self, row: dict[str, Any], clock: tuple[float, float, float]
    ) -> dict[str, Any]:
        """Waits for the workers' parameters, evaluates them, completes the epoch's record.

        ``clock``: when this epoch and the first epoch of this attempt began (perf_counter),
        and the seconds elapsed before this attempt (``elapsed_seconds`` of the last record).
        """
        t0 = time.perf_counter()
        flat = self.host_params().clone()
        dist.broadcast(flat, src=1, group=self.pair)
        loss = torch.zeros(2, dtype=torch.float64)
        dist.broadcast(loss, src=1, group=self.pair)
        row["train_seconds"] = time.perf_counter() - t0
        mark(f"epoch {row['epoch']} trained")
        self.load_params(flat)
        self.model.eval()
        row["test_loss"], row["test_accuracy"] = self.evaluate()
        if self.checkpointing and self.momentum:
            self.momentum_flat = torch.zeros_like(flat)
            dist.broadcast(self.momentum_flat, src=1, group=self.pair)
        row["train_loss"] = float(loss[0] / loss[1])
        row["param_bytes"] = flat.numel() * flat.element_size() + loss.numel() * 8
        row["allreduce_payload_bytes"] = self.allreduce_bytes(flat.numel() * flat.element_size())
        now = time.perf_counter()
        began, first, before = clock
        row["epoch_seconds"] = now - began  # delivery, training, evaluation: the wall clock
        row["elapsed_seconds"] = before + now - first
        row["time"] = time.time()  # when the record was written (Unix time)
        return row

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
        dist.gather(torch.frombuffer(bytearray(mine), dtype=torch.uint8), gather_list=out, dst=0)
        return [bytes(t.tolist()).hex() for t in out[1:]]
