"""The job's workers: every epoch's batch from the coded shuffle (read where it was
decoded: memory, or the store's memory-mapped file), synchronous SGD on it together (DDP over
the workers' group, or local SGD), worker 0 sending the result to the master."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from coded_shuffle.codec.records import LocalBatch
from coded_shuffle.distributed.ddp import minibatch_order

from .. import checkpoint, data, models
from ..device import to_device
from ..dist import mark, tick
from ..faults import step_delay
from .rank import Rank, send
from .start import AfterEpoch, Complete, Fresh, InsideEpoch, broadcast, gather_held
from .steps import average_state, averaging_steps, model_inputs, release_ddp


@dataclass(frozen=True)
class StepState:
    """Where a worker resumes inside an epoch: the steps done, the loss summed over them, and
    the batch it kept."""

    step: int
    loss_sum: float
    count: int
    batch: LocalBatch


class Worker(Rank):
    """The workers: get the epoch's batch from the coded shuffle (delivered while they
    trained on the epoch before, ``dist.prefetch``), train on it."""

    def run(self) -> None:
        if not self.setup():
            return  # the run is complete
        inside = self.resume()
        try:
            for epoch in range(self.start.done + 1, self.epochs + 1):
                self.begin(epoch)
                state = inside if epoch == self.start.done + 1 else None
                batch = self.cs.epoch(epoch) if state is None else state.batch
                waited = (self.cs.report.wait_seconds or 0.0) if state is None else 0.0
                mark(f"epoch {epoch} delivered")
                assert batch is not None
                self.train(epoch, batch, state, waited)
        finally:
            self.cs.close()
        self.gather_digest()
        release_ddp(self)

    def setup(self) -> bool:
        """The run's start from the master (this worker's step checkpoints told first), the
        coded shuffle, the model in DDP and its optimiser; False when the run is complete."""
        self.k = self.ctx.worker
        held = {}
        if self.step_every:
            held = checkpoint.load_steps(self.ctx.run_dir, self.cfg, self.k)
        gather_held(set(held))
        opening = broadcast(None)
        self.start = opening.start
        # the one step checkpoint a restart inside an epoch goes on from (the others go now)
        start = self.start
        inside = isinstance(start, InsideEpoch)
        self.step_saved = held[(start.done + 1, start.step)] if inside else None
        if isinstance(self.start, Complete):
            return False
        self.cs = self.coded_shuffle(None, self.start)
        self.q = self.cs.shape.num_points // self.workers
        self.transform = data.transform_of(self.cfg.data)
        item = self.cs.shape.layout.fields[0]
        one = torch.zeros((1, *item.shape), dtype=item.torch_dtype)
        self.model = self.build_model(tuple(self.transform(one).shape[1:]), opening.classes)
        self.ddp = self.distributed()
        o = self.cfg.optim
        self.opt = torch.optim.SGD(
            self.model.parameters(),
            lr=float(o.lr),
            momentum=float(o.momentum),
            weight_decay=float(o.weight_decay),
        )
        return True

    def resume(self) -> StepState | None:
        """After a restart, as the run's start says: the own store restored (after an epoch;
        after a change in the number of workers the next epoch places anew) and the master's
        checkpointed parameters and momentum loaded; or, inside an epoch, the own store and
        batch restored (no new delivery) and the own training state at that step loaded."""
        start = self.start
        if isinstance(start, Fresh):
            return None
        if isinstance(start, InsideEpoch):
            return self.resume_inside(start)
        if isinstance(start, AfterEpoch):
            self.cs.restore(start.done)
        params = self.host_params().clone()
        optimizer = self.resumed_state(params, None)
        self.load_params(params)
        if optimizer is not None:
            self.opt.load_state_dict(optimizer)
        return None

    def distributed(self) -> torch.nn.Module:
        """The model in DDP over the workers' model group (gloo, or NCCL on CUDA) by the coded
        shuffle (``cs.ddp``: the gradients averaged at every step in one bucket reduced in the
        parameters' order, so a resumed job ends with the parameters of an unbroken one; no
        buffer synchronised at each forward: the models keep none that training changes).
        Every worker drew the same model from the seed, so DDP does not broadcast it at start
        (a model's bytes to every worker over the network): :meth:`same_start` compares the
        workers' digests instead."""
        self.same_start()
        return self.cs.ddp(
            self.model,
            process_group=self.model_group,
            forward_sync_buffers=False,
            init_sync=False,
        )

    def same_start(self) -> None:
        """Every worker's model the same bits before training (32-byte digests gathered over
        the model group, where DDP's own start would send the whole model); a worker whose
        model differs stops the job in one line."""
        mine = models.params_sha256(self.model)
        every: list[str | None] = [None] * dist.get_world_size(self.model_group)
        dist.all_gather_object(every, mine, group=self.model_group)
        if any(d != every[0] for d in every):
            raise RuntimeError(
                "the workers drew different models from one seed (digests "
                + ", ".join(str(d)[:12] for d in every)
                + "): their torch versions or devices differ"
            )

    def resume_inside(self, start: InsideEpoch) -> StepState:
        """After a restart inside epoch ``start.done + 1``: the own store and batch restored
        (no new delivery), the own training state at ``start.step`` loaded."""
        saved = self.step_saved
        assert saved is not None
        self.step_saved = None
        batch = self.cs.resume_inside(start.done + 1)
        assert batch is not None
        self.load_params(saved.params)
        self.opt.load_state_dict(saved.optimizer)
        torch.set_rng_state(saved.rng)
        return StepState(start.step, float(saved.loss_sum), int(saved.count), batch)

    def save_step(self, epoch: int, step: int, totals: tuple[float, int]) -> None:
        """This worker's training state after ``step`` of ``epoch`` (``job.checkpoint_steps``),
        once every worker got there (so the last checkpoint of one is the last or the one
        before of every other)."""
        dist.barrier(group=self.cs.workers_group)
        state = checkpoint.StepCheckpoint(
            epoch=epoch,
            step=step,
            params=self.host_params().clone(),
            optimizer=self.host_optimizer(),  # its momentum, as torch saves it
            loss_sum=totals[0],
            count=totals[1],
        )
        checkpoint.save_step(self.ctx.run_dir, self.cfg, self.k, state)

    def host_optimizer(self) -> dict[str, Any]:
        """The optimiser's ``state_dict()`` with its tensors in host memory (what a checkpoint
        and gloo carry)."""
        return _to_host(self.opt.state_dict())

    def train(
        self, epoch: int, batch: LocalBatch, start: StepState | None = None, waited: float = 0.0
    ) -> None:
        """One epoch of synchronous SGD over the own batch (each minibatch read from the
        batch's records where they are), from step ``start.step`` after a restart inside it;
        worker 0 sends the result, and the slowest worker's seconds on the steps and before
        them, waiting for the batch (``waited``)."""
        began = time.perf_counter()
        order = torch.from_numpy(minibatch_order(self.seed, epoch, self.k, self.q))
        size = int(self.cfg.optim.batch_size)
        params = list(self.model.parameters())
        self.model.train()
        loss_sum, count = (start.loss_sum, start.count) if start else (0.0, 0)
        first = start.step if start else 0
        steps = math.ceil(self.q / size)
        every = self.average_every
        average_after = set(averaging_steps(steps, every))
        for step, a in enumerate(range(0, self.q, size)):
            if step < first:  # done before the restart
                continue
            self.die_at(epoch, step + 1)
            tick(f"epoch {epoch} step {step + 1}/{steps}")
            step_delay(self.cfg.debug)
            idx = order[a : a + size]
            inputs, labels = batch.fields(idx)
            x = to_device(model_inputs(self.transform, inputs), self.device)
            y = to_device(labels.long(), self.device)
            # local SGD: no gradient synchronisation (every step stays inside no_sync)
            with self.ddp.no_sync() if every else contextlib.nullcontext():
                loss = F.cross_entropy(self.ddp(x), y)
                self.opt.zero_grad(set_to_none=False)
                loss.backward()  # DDP: the gradients averaged over the workers
            self.opt.step()
            if step + 1 in average_after:
                average_state(params, self.opt, self.model_group, self.workers)
            loss_sum += float(loss.detach()) * idx.numel()
            count += idx.numel()
            if self.step_every and (step + 1) % self.step_every == 0 and step + 1 < steps:
                self.save_step(epoch, step + 1, (loss_sum, count))
        seconds = time.perf_counter() - began
        totals = torch.tensor([loss_sum, count], dtype=torch.float64)
        self.report(epoch, totals, torch.tensor([seconds, waited], dtype=torch.float64))

    def report(self, epoch: int, totals: torch.Tensor, seconds: torch.Tensor) -> None:
        """The epoch's summed loss over every worker, and the slowest worker's seconds on the
        steps and waiting for the batch; worker 0 sends them, the parameters and (for the
        checkpoint) its optimiser's state to the master (every worker's is the same: the
        gradients, or with local SGD the momentum, averaged)."""
        dist.all_reduce(totals, group=self.cs.workers_group)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=self.cs.workers_group)
        if self.ctx.rank == self.model_sender:
            send(self.host_params(), self.master)
            send(torch.cat([totals, seconds]), self.master)
            if self.checkpointing:
                dist.send_object_list([self.host_optimizer()], dst=self.master)
        mark(f"epoch {epoch} trained")

    def gather_digest(self) -> None:
        mine = bytes.fromhex(models.params_sha256(self.model))
        dist.gather(torch.frombuffer(bytearray(mine), dtype=torch.uint8), dst=self.master)


def _to_host(state: Any) -> Any:
    """``state`` (a ``state_dict()``: dicts, lists, tensors, numbers) with every tensor in
    host memory."""
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: _to_host(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_to_host(v) for v in state)
    return state
