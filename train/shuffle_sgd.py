"""Job ``shuffle_sgd``: random-reshuffling SGD whose epoch data moves as a coded broadcast.

A training loop on the library's :class:`~coded_shuffle.CodedShuffle`, as a user's script
would be: rank 0 (master) holds the training set and hands it to ``CodedShuffle``, which plans,
proves, encodes, moves (``dist.transport``), decodes and verifies every epoch's delivery.
Workers (ranks 1..K) get their batch as a data set and run synchronous data-parallel SGD
(the model wrapped in ``DistributedDataParallel`` over ``workers_group``; with local SGD its
``no_sync`` skips the per-step all-reduce and the models are averaged every ``H`` steps);
worker 0 sends the parameters to the master,
which evaluates them on the test split and writes each epoch's metrics beside the delivery's.

The scheme changes the bytes on the link, never the batches or their order: with the same seed
every scheme yields bit-identical parameters (``final_params_sha256`` in ``summary.json``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

from coded_shuffle import CodedShuffle
from coded_shuffle.codec.records import LocalBatch
from coded_shuffle.distributed import faults
from coded_shuffle.distributed.liveness import Heartbeat
from coded_shuffle.distributed.shuffle import check_transport
from coded_shuffle.distributed.transports import JOB_NAMES
from coded_shuffle.errors import UsageError, VerificationError
from coded_shuffle.math.policies import ShufflePolicy, check_placement
from coded_shuffle.math.schemes import get_scheme

from . import checkpoint, data, models
from .dist import RankContext, context, die_if_asked, liveness, mark, start_liveness, tick
from .metrics import MetricsWriter, human_bytes

log = logging.getLogger("train")

COLLECTIVE_TIMEOUT = timedelta(days=7)  # collectives wait for work; the watchdog for peers
DIGEST_BYTES = 32
META_FIELDS = 4  # features, classes, dropped points, epochs already done (int64 each)


def mean_in_model_order(state: tuple[Any, dict[int, int]], bucket):
    """DDP communication hook: the bucket's gradients averaged over the workers, laid out in
    the model's parameter order for the all-reduce (gloo's sums depend on an element's place
    in the buffer; DDP reorders a bucket after its first step, and anew after a restart).
    ``bucket`` and the result are not annotated: DDP checks annotations as objects, and this
    module's are strings."""
    group, order = state
    buffer, params = bucket.buffer(), bucket.parameters()
    starts = np.concatenate([[0], np.cumsum([p.numel() for p in params])]).tolist()
    ranked = sorted(range(len(params)), key=lambda i: order[id(params[i])])
    flat = torch.cat([buffer[starts[i] : starts[i + 1]] for i in ranked])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    at = 0
    for i in ranked:
        n = starts[i + 1] - starts[i]
        buffer[starts[i] : starts[i + 1]].copy_(flat[at : at + n])
        at += n
    done: torch.futures.Future = torch.futures.Future()
    done.set_result(buffer)
    return done


def release_ddp(owner: Any) -> None:
    """Frees ``owner.ddp`` now, while its process group is still registered.

    Left to the end of the process, DDP's reducer would drop the last reference to the group:
    the group's destructor then joins gloo's threads with the GIL held while one of them
    frees a finished all-reduce that needs the GIL (launched from the autograd thread, it
    carries Python thread-local state), and the process hangs at exit."""
    owner.ddp = None
    gc.collect()  # DDP's module and reducer can sit in reference cycles


def model_inputs(transform: data.Transform, x: torch.Tensor) -> torch.Tensor:
    """Decoded inputs ``(n, *item shape)`` as the model reads them: ``data.transform`` (the
    array sources: none), one float32 row per point."""
    return transform(x).reshape(x.shape[0], -1).to(torch.float32)


def averaging_steps(steps: int, every: int) -> list[int]:
    """The steps (1-based) after which local SGD averages the workers' models: every
    ``every`` steps and after the epoch's last (``every = 0``: none; gradients are averaged at
    every step instead)."""
    if every <= 0:
        return []
    return sorted({*range(every, steps + 1, every), steps})


def minibatch_order(seed: int, epoch: int, worker: int, batch: int) -> np.ndarray:
    """The order in which ``worker`` visits its batch in ``epoch`` (scheme-independent)."""
    return np.random.default_rng([seed, 1, epoch, worker]).permutation(batch)


def collective_timeout(cfg: Any) -> timedelta:
    """Collectives wait for long work (an epoch's training, a large delivery) without a bound:
    the liveness watchdog fails the job within ``dist.timeout_seconds`` of a lost peer."""
    del cfg
    return COLLECTIVE_TIMEOUT


def max_restarts(cfg: Any) -> int:
    """``dist.max_restarts``: the launcher restarts every process; the job resumes from its
    checkpoint (``job.checkpoint``)."""
    return int(cfg.dist.max_restarts)


def progress_line(records: dict[int, Heartbeat], seconds: float) -> None:
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


def policy(cfg: Any) -> ShufflePolicy:
    """The shuffle policy of ``shuffle=`` (``shuffle.fraction`` for ``partial``)."""
    node = cfg.get("shuffle") or {}
    return ShufflePolicy(str(node.get("name", "full")), float(node.get("fraction", 1.0)))


def placement(cfg: Any) -> str:
    """``data.placement``: the first assignment, ``random`` or ``by_label``."""
    return str(cfg.data.get("placement", "random"))


def validate(cfg: Any) -> None:
    """Everything that can be checked before a process starts (raises :class:`UsageError`)."""
    workers, epochs = int(cfg.workers), int(cfg.epochs)
    if workers < 1:
        raise UsageError(f"workers={workers} out of range (must be >= 1)")
    if epochs < 1:
        raise UsageError(f"epochs={epochs} out of range (must be >= 1)")
    policy(cfg).check("shuffle", "shuffle.fraction")
    check_placement(placement(cfg), "data.placement")
    info = data.describe(cfg.data)
    if info.train_points < workers:
        raise UsageError(
            f"workers={workers} exceeds the {info.train_points} training points of "
            f"data.source={cfg.data.source} (valid: 1..{info.train_points})"
        )
    points = info.train_points - info.train_points % workers
    scheme = get_scheme(str(cfg.scheme.name), info.point_bytes)
    if not 1 <= float(cfg.storage) <= workers:
        raise UsageError(f"storage={cfg.storage} out of range 1..{workers} (workers)")
    scheme.check(points, workers, float(cfg.storage))
    scheme.check_point_bytes(workers, float(cfg.storage))
    models.check(cfg.model, info.input_shape)
    if float(cfg.optim.lr) <= 0:
        raise UsageError(f"optim.lr={cfg.optim.lr} out of range (must be > 0)")
    if int(cfg.optim.get("average_every", 0)) < 0:
        raise UsageError(
            f"optim.average_every={cfg.optim.average_every} out of range (must be >= 0; 0: "
            "gradients averaged every step, H >= 1: local SGD, models averaged every H steps)"
        )
    if int(cfg.optim.batch_size) < 1:
        raise UsageError(f"optim.batch_size={cfg.optim.batch_size} out of range (must be >= 1)")
    if int(cfg.dist.chunk_bytes) < 1:
        raise UsageError(f"dist.chunk_bytes={cfg.dist.chunk_bytes} out of range (must be >= 1)")
    if int(cfg.dist.max_restarts) < 0:
        raise UsageError(f"dist.max_restarts={cfg.dist.max_restarts} out of range (must be >= 0)")
    for key in ("timeout_seconds", "heartbeat_seconds", "progress_seconds"):
        if float(cfg.dist[key]) <= 0:
            raise UsageError(f"dist.{key}={cfg.dist[key]} out of range (must be > 0)")
    check_transport(
        str(cfg.dist.transport),
        scheme,
        workers,
        transport_options(cfg),
        JOB_NAMES,
    )
    die = cfg.get("debug", {}).get("die_rank")
    if die is not None and not 0 <= int(die) <= workers:
        raise UsageError(f"debug.die_rank={die} out of range 0..{workers}")


def run(cfg: Any) -> None:
    """Per-rank body (the process group is already set up by :mod:`train.entry`)."""
    ctx = context()
    start_liveness(cfg, progress_line if ctx.is_master else None)
    pair = dist.new_group([0, 1], timeout=ctx.collective_timeout or ctx.timeout)
    (Master if ctx.is_master else Worker)(cfg, ctx, pair).run()


class _Rank:
    """What master and workers share: config, the coded shuffle, the model."""

    def __init__(self, cfg: Any, ctx: RankContext, pair: Any) -> None:
        self.cfg, self.ctx, self.pair = cfg, ctx, pair
        self.workers, self.epochs, self.seed = int(cfg.workers), int(cfg.epochs), int(cfg.seed)
        self.storage = float(cfg.storage)
        self.average_every = int(cfg.optim.get("average_every", 0))  # 0: gradients every step
        self.cs_policy = policy(cfg)

    def coded_shuffle(self, dataset: Dataset | None) -> CodedShuffle:
        return CodedShuffle(
            dataset,
            scheme=str(self.cfg.scheme.name),
            storage=self.storage,
            seed=self.seed,
            shuffle=self.cs_policy.name,
            fraction=self.cs_policy.fraction,
            placement=placement(self.cfg),
            transport=str(self.cfg.dist.transport),
            transport_options=transport_options(self.cfg),
            chunk_bytes=int(self.cfg.dist.chunk_bytes),
            epochs=self.epochs,
            liveness=liveness(),  # ticked by every message it moves
            store_dir=self.store_dir,
        )

    @property
    def store_dir(self) -> Path | None:
        """Where the workers' stores live (memory-mapped) and persist: ``dist.store_dir``,
        else the run directory's ``stores/``; None without checkpoints (in memory)."""
        if not self.checkpointing:
            return None
        given = self.cfg.dist.get("store_dir")
        return Path(given) if given else self.ctx.run_dir / "stores"

    @property
    def checkpointing(self) -> bool:
        return bool(self.cfg.job.get("checkpoint", True))

    @property
    def momentum(self) -> float:
        return float(self.cfg.optim.get("momentum", 0.0))

    def resumed_state(self, params: torch.Tensor, momentum: torch.Tensor) -> None:
        """The master's checkpointed parameters and momentum, to every rank (in place)."""
        dist.broadcast(params, src=0)
        if momentum.numel():
            dist.broadcast(momentum, src=0)

    def build_model(self, shape: tuple[int, ...], classes: int) -> torch.nn.Module:
        """The model for inputs of ``shape`` (after ``data.transform``), the same on every
        rank."""
        torch.manual_seed(self.seed)
        return models.build(self.cfg.model, shape, classes)

    def begin(self, epoch: int) -> None:
        die_if_asked(self.cfg, self.ctx.rank, epoch)
        mark(f"epoch {epoch} start")

    def meta(self, values: list[int] | None = None) -> list[int]:
        """The data set's shape, from the master to every rank (control, not shuffle bytes)."""
        t = torch.tensor(values if values is not None else [0] * META_FIELDS, dtype=torch.int64)
        dist.broadcast(t, src=0)
        return t.tolist()


class Master(_Rank):
    """Rank 0: holds the data set, evaluates the workers' parameters, writes the metrics."""

    def run(self) -> None:
        t_start = time.perf_counter()
        ds = data.load(self.cfg.data, self.workers, self.seed)
        if ds.dropped:
            log.info(
                f"data: dropped {ds.dropped} training points so that {self.workers} workers "
                f"divide N = {ds.num_points}"
            )
        self.dropped = ds.dropped
        saved = checkpoint.load(self.ctx.run_dir, self.cfg) if self.checkpointing else None
        done = int(saved["epoch"]) if saved else 0
        self.meta([ds.features, ds.classes, ds.dropped, done])
        # records of the inputs' and labels' own bytes (the array sources: float32 features
        # and an int32 label, 4 d + 4 bytes; data=dataset: the items' dtypes)
        train = ds.train
        self.cs = self.coded_shuffle(train)
        if self.cfg.debug.corrupt_epoch is not None:
            faults.set_before_send(self.corrupt_if_asked)
        self.n, self.b = self.cs.settings.num_points, self.cs.settings.layout.record_bytes
        self.model = self.build_model(ds.input_shape, ds.classes)
        self.data = ds  # its test split, evaluated a block at a time
        del train  # the coded shuffle reads the training split as records
        self.writer = MetricsWriter(self.ctx.run_dir, self.epochs, bool(self.cfg.tensorboard))
        self.steps = math.ceil(self.n // self.workers / int(self.cfg.optim.batch_size))
        log.info(
            f"shuffle_sgd: scheme {self.cs.scheme.name}, transport "
            f"{self.cs.link.transport.name}, placement {self.cs.placement}, "
            f"shuffle {self.cs.policy.name}"
            + (
                f" (fraction {self.cs.policy.fraction:g})"
                if self.cs.policy.name == "partial"
                else ""
            )
            + (
                f", local SGD (models averaged every {every} steps)"
                if (every := self.average_every)
                else ""
            )
            + f", {self.workers} workers, storage {self.storage:g}, "
            f"N = {self.n} records of {self.b} bytes, {self.epochs} epochs"
        )
        if abs(self.cs.storage_used - self.storage) > 1e-9:
            log.info(
                f"storage: {self.b}-byte records store T = {self.cs.storage_used:.6g}, not "
                f"{self.storage:g}: the point size moves bytes to another corner"
            )
        restart: dict[str, Any] = {}
        self.momentum_flat = torch.zeros(0)
        if saved:
            restart = self.resume(saved)
        # seconds since the first epoch began, restarts included: the last record's, the time
        # between it and now (the restart), then this attempt's
        first = time.perf_counter()
        before = 0.0
        if saved:
            last = saved["rows"][-1]
            since = time.time() - float(last.get("time", time.time()))  # older records: 0
            before = float(last.get("elapsed_seconds", 0.0)) + max(0.0, since)
        try:
            for epoch in range(done + 1, self.epochs + 1):
                began = time.perf_counter()
                self.begin(epoch)
                self.cs.epoch(epoch)  # then prepares the next while the workers train
                mark(f"epoch {epoch} delivered")
                attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
                row = self.finish_epoch(
                    {
                        **self.cs.report,
                        "dropped_points": self.dropped,
                        "attempt": attempt,
                        **restart,
                    },
                    clock=(began, first, before),
                )
                restart = {}
                if self.checkpointing:  # before the record: a recorded epoch is a resumable one
                    flat = models.flat_params(self.model)
                    rows = [*self.writer.rows, row]
                    checkpoint.save(
                        self.ctx.run_dir, self.cfg, epoch, flat, self.momentum_flat, rows
                    )
                self.writer.epoch(row)
        finally:
            self.cs.close()
        self.finish(time.perf_counter() - t_start)

    def resume(self, saved: dict[str, Any]) -> dict[str, Any]:
        """After a restart: the stores restored (damaged ones re-placed), the checkpointed
        model and momentum to every rank, the metrics so far rewritten. The first resumed
        epoch's record says what the restart cost."""
        done = int(saved["epoch"])
        report = self.cs.restore(done)
        params, momentum = saved["params"].clone(), saved["momentum"].clone()
        self.resumed_state(params, momentum)
        models.load_flat(self.model, params)
        self.momentum_flat = momentum
        self.writer.resume(saved["rows"])
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # 0: run again by hand
        replaced = report["replaced_workers"]
        log.info(
            f"resumed after epoch {done} (attempt {attempt}): stores of "
            f"{self.workers - len(replaced)} of {self.workers} workers intact"
            + (f", workers {replaced} re-placed ({human_bytes(report['replacement_bytes'])})"
               if replaced else "")
        )  # fmt: skip
        return {**report, "attempt": attempt}

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

    def finish_epoch(
        self, row: dict[str, Any], clock: tuple[float, float, float]
    ) -> dict[str, Any]:
        """Waits for the workers' parameters, evaluates them, completes the epoch's record.

        ``clock``: when this epoch and the first epoch of this attempt began (perf_counter),
        and the seconds elapsed before this attempt (``elapsed_seconds`` of the last record).
        """
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

    def evaluate(self) -> tuple[float, float]:
        """Test loss and accuracy of the model, the test split read a block at a time."""
        losses, correct, count = [], 0.0, 0
        for inputs, labels in self.data.test_batches():
            logits = self.model(model_inputs(self.data.transform, inputs))
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
        summary = self.writer.summary(
            {
                "scheme": self.cs.scheme.name,
                "workers": self.workers,
                "storage": self.storage,
                "shuffle": self.cs.policy.name,
                "fraction": self.cs.policy.fraction,
                "average_every": self.average_every,
                "placement": self.cs.placement,
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
    """Ranks 1..K: get the epoch's batch from the coded shuffle, train on it."""

    def run(self) -> None:
        _, classes, _, done = self.meta()
        self.cs = self.coded_shuffle(None)
        self.k, self.q = self.ctx.worker, self.cs.settings.num_points // self.workers
        self.transform = data.transform_of(self.cfg.data)
        item = self.cs.settings.layout.fields[0]
        one = torch.zeros((1, *item.shape), dtype=item.torch_dtype)
        self.model = self.build_model(tuple(self.transform(one).shape[1:]), classes)
        # DDP averages the gradients at every step (no buffer synchronised at each forward:
        # the models keep none that training changes), in one bucket reduced in the parameters'
        # order: the same bits before and after DDP rebuilds its buckets, so a resumed job
        # ends with the parameters of an unbroken one
        model_mb = models.num_params(self.model) * 4 / 2**20
        self.ddp = DistributedDataParallel(
            self.model,
            process_group=self.ctx.workers_group,
            forward_sync_buffers=False,
            bucket_cap_mb=model_mb + 1,
        )
        order = {id(p): i for i, p in enumerate(self.model.parameters())}
        self.ddp.register_comm_hook((self.ctx.workers_group, order), mean_in_model_order)
        o = self.cfg.optim
        self.opt = torch.optim.SGD(
            self.model.parameters(),
            lr=float(o.lr),
            momentum=float(o.get("momentum", 0.0)),
            weight_decay=float(o.get("weight_decay", 0.0)),
        )
        if done:
            self.resume(done)
        try:
            for epoch in range(done + 1, self.epochs + 1):
                self.begin(epoch)
                batch = self.cs.epoch(epoch)
                mark(f"epoch {epoch} delivered")
                assert batch is not None
                self.train(epoch, batch)
        finally:
            self.cs.close()
        self.gather_digest()
        release_ddp(self)

    def resume(self, done: int) -> None:
        """After a restart: the own store restored (or re-placed), the master's checkpointed
        parameters and momentum loaded."""
        self.cs.restore(done)
        params = models.flat_params(self.model).clone()
        momentum = torch.zeros_like(params) if self.momentum else torch.zeros(0)
        self.resumed_state(params, momentum)
        models.load_flat(self.model, params)
        if momentum.numel():
            offset = 0
            for p in self.model.parameters():
                n = p.numel()
                self.opt.state[p]["momentum_buffer"] = (
                    momentum[offset : offset + n].view_as(p).clone()
                )
                offset += n

    def momentum_buffers(self) -> torch.Tensor:
        """The optimiser's momentum as one flat vector (parameters' order)."""
        return torch.cat(
            [self.opt.state[p]["momentum_buffer"].reshape(-1) for p in self.model.parameters()]
        )

    def train(self, epoch: int, batch: LocalBatch) -> None:
        """One epoch of synchronous SGD over the own batch (each minibatch read from the
        batch's records where they are: memory or the store's file); worker 0 sends the
        result."""
        order = torch.from_numpy(minibatch_order(self.seed, epoch, self.k, self.q))
        size = int(self.cfg.optim.batch_size)
        params = list(self.model.parameters())
        self.model.train()
        loss_sum, count = 0.0, 0
        steps = math.ceil(self.q / size)
        every = self.average_every
        average_after = set(averaging_steps(steps, every))
        delay = float((self.cfg.get("debug") or {}).get("step_delay") or 0.0)
        for step, a in enumerate(range(0, self.q, size)):
            tick(f"epoch {epoch} step {step + 1}/{steps}")
            if delay:  # debug: a slow model (long epochs without changing the data)
                time.sleep(delay)
            idx = order[a : a + size]
            inputs, labels = batch.fields(idx)
            x, y = model_inputs(self.transform, inputs), labels.long()
            # local SGD: no gradient synchronisation (every step stays inside no_sync)
            with self.ddp.no_sync() if every else contextlib.nullcontext():
                loss = F.cross_entropy(self.ddp(x), y)
                self.opt.zero_grad(set_to_none=False)
                loss.backward()  # DDP: the gradients averaged over the workers
            self.opt.step()
            if step + 1 in average_after:
                self.average_models(params)
            loss_sum += float(loss.detach()) * idx.numel()
            count += idx.numel()
        totals = torch.tensor([loss_sum, count], dtype=torch.float64)
        dist.all_reduce(totals, group=self.ctx.workers_group)
        if self.k == 0:
            dist.broadcast(models.flat_params(self.model), src=1, group=self.pair)
            dist.broadcast(totals, src=1, group=self.pair)
            if self.checkpointing and self.momentum:
                dist.broadcast(self.momentum_buffers(), src=1, group=self.pair)
        mark(f"epoch {epoch} trained")

    def average_models(self, params: list[torch.nn.Parameter]) -> None:
        """Local SGD: the workers' parameters and momentum buffers replaced by their mean
        (one flat all-reduce)."""
        buffers = [self.opt.state[p].get("momentum_buffer") for p in params]
        tensors = [p.data for p in params] + [b for b in buffers if b is not None]
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, group=self.ctx.workers_group)
        flat /= self.workers
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n

    def gather_digest(self) -> None:
        mine = bytes.fromhex(models.params_sha256(self.model))
        dist.gather(torch.frombuffer(bytearray(mine), dtype=torch.uint8), dst=0)
