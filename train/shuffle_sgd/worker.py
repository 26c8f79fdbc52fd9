"""The job's ranks 1..K: every epoch's batch from the coded shuffle (read where it was
decoded: memory, or the store's memory-mapped file), synchronous SGD on it together (DDP over
the workers' group, or local SGD), worker 0 sending the result to the master."""

from __future__ import annotations

import contextlib
import math
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from coded_shuffle.codec.records import LocalBatch

from .. import data, models
from ..dist import mark, tick
from .rank import Rank
from .steps import (
    average_state,
    averaging_steps,
    mean_in_model_order,
    minibatch_order,
    model_inputs,
    release_ddp,
)


class Worker(Rank):
    """Ranks 1..K: get the epoch's batch from the coded shuffle, train on it."""

    def run(self) -> None:
        _, classes, _, done = self.meta()
        self.cs = self.coded_shuffle(None)
        self.k, self.q = self.ctx.worker, self.cs.shape.num_points // self.workers
        self.transform = data.transform_of(self.cfg.data)
        item = self.cs.shape.layout.fields[0]
        one = torch.zeros((1, *item.shape), dtype=item.torch_dtype)
        self.model = self.build_model(tuple(self.transform(one).shape[1:]), classes)
        self.ddp = self.distributed()
        o = self.cfg.optim
        self.opt = torch.optim.SGD(
            self.model.parameters(),
            lr=float(o.lr),
            momentum=float(o.momentum),
            weight_decay=float(o.weight_decay),
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

    def distributed(self) -> DistributedDataParallel:
        """The model in DDP over the workers' group: the gradients averaged at every step (no
        buffer synchronised at each forward: the models keep none that training changes), in
        one bucket reduced in the parameters' order: the same bits before and after DDP
        rebuilds its buckets, so a resumed job ends with the parameters of an unbroken one."""
        model_mb = models.num_params(self.model) * 4 / 2**20
        ddp = DistributedDataParallel(
            self.model,
            process_group=self.ctx.workers_group,
            forward_sync_buffers=False,
            bucket_cap_mb=model_mb + 1,
        )
        order = {id(p): i for i, p in enumerate(self.model.parameters())}
        ddp.register_comm_hook((self.ctx.workers_group, order), mean_in_model_order)
        return ddp

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
        batch's records where they are); worker 0 sends the result."""
        order = torch.from_numpy(minibatch_order(self.seed, epoch, self.k, self.q))
        size = int(self.cfg.optim.batch_size)
        params = list(self.model.parameters())
        self.model.train()
        loss_sum, count = 0.0, 0
        steps = math.ceil(self.q / size)
        every = self.average_every
        average_after = set(averaging_steps(steps, every))
        delay = float(self.cfg.debug.step_delay)
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
                average_state(params, self.opt, self.ctx.workers_group, self.workers)
            loss_sum += float(loss.detach()) * idx.numel()
            count += idx.numel()
        self.report(epoch, torch.tensor([loss_sum, count], dtype=torch.float64))

    def report(self, epoch: int, totals: torch.Tensor) -> None:
        """The epoch's summed loss over every worker; worker 0 sends it, the parameters and
        (for the checkpoint) the momentum to the master."""
        dist.all_reduce(totals, group=self.ctx.workers_group)
        if self.k == 0:
            dist.broadcast(models.flat_params(self.model), src=1, group=self.pair)
            dist.broadcast(totals, src=1, group=self.pair)
            if self.checkpointing and self.momentum:
                dist.broadcast(self.momentum_buffers(), src=1, group=self.pair)
        mark(f"epoch {epoch} trained")

    def gather_digest(self) -> None:
        mine = bytes.fromhex(models.params_sha256(self.model))
        dist.gather(torch.frombuffer(bytearray(mine), dtype=torch.uint8), dst=0)
