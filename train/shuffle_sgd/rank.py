"""What the job's master and workers share: the config, the coded shuffle, the model, and the
few control messages every rank takes part in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from coded_shuffle import CodedShuffle

from .. import models
from ..config import Config
from ..device import local_device
from ..dist import RankContext, die_if_asked, liveness, mark
from .settings import shuffle_settings

# features, classes, dropped points, epochs already done, the epoch of the run's placement (1,
# or later after a change in the number of workers), the workers before a change in their
# number now (0: none); int64 each
META_FIELDS = 6
NO_STEP = 2**62  # the master's bid when the ranks agree on a step to resume at


class Rank:
    """One rank of the job (the master, or a worker)."""

    def __init__(self, cfg: Config, ctx: RankContext, pair: Any, device: tuple[str, Any]) -> None:
        """``device``: the agreed device type and the group the workers' model all-reduce runs
        over (:func:`~train.device.model_group`)."""
        self.cfg, self.ctx, self.pair = cfg, ctx, pair
        self.device, self.model_group = local_device(device[0]), device[1]
        self.workers, self.epochs, self.seed = int(cfg.workers), int(cfg.epochs), int(cfg.seed)
        self.storage = float(cfg.storage)
        self.average_every = int(cfg.optim.average_every)  # 0: gradients every step
        self.momentum = float(cfg.optim.momentum)
        self.checkpointing = bool(cfg.job.checkpoint)
        self.step_every = int(cfg.job.checkpoint_steps) if self.checkpointing else 0

    @property
    def store_dir(self) -> Path | None:
        """Where the workers' stores live (memory-mapped) and persist: ``dist.store_dir``,
        else the run directory's ``stores/``; None without checkpoints (in memory)."""
        if not self.checkpointing:
            return None
        given = self.cfg.dist.store_dir
        return Path(given) if given else self.ctx.run_dir / "stores"

    def coded_shuffle(
        self, dataset: Dataset | None, first_epoch: int = 1, before: int | None = None
    ) -> CodedShuffle:
        """``first_epoch``: the epoch of the run's placement (later than 1 once the number of
        workers changed); ``before``: the number of workers before a change now (the
        placement then reuses what they held)."""
        settings = shuffle_settings(self.cfg, self.store_dir, first_epoch, before)
        return CodedShuffle(dataset, settings, liveness=liveness())  # ticked by every message

    def agree_inside(self, done: int, held: set[tuple[int, int]], ready: bool = True) -> int:
        """The step of epoch ``done + 1`` to resume at (0: none, resume after ``done``): the
        last one every worker holds a checkpoint of (``held``: this worker's ``(epoch,
        step)`` pairs), where the master holds that epoch's delivery record (``ready``). A
        collective of every rank, with step checkpoints on."""
        if not self.step_every:
            return 0
        if self.ctx.is_master:
            bid = NO_STEP if ready else 0
        else:
            bid = max((s for e, s in held if e == done + 1), default=0)
        step = torch.tensor([bid], dtype=torch.int64)
        dist.all_reduce(step, op=dist.ReduceOp.MIN)
        at = int(step)
        if at == 0:
            return 0
        has = torch.tensor([int(self.ctx.is_master or (done + 1, at) in held)])
        dist.all_reduce(has, op=dist.ReduceOp.MIN)
        return at if int(has) else 0

    def resumed_state(self, params: torch.Tensor, momentum: torch.Tensor) -> None:
        """The master's checkpointed parameters and momentum, to every rank (in place)."""
        dist.broadcast(params, src=0)
        if momentum.numel():
            dist.broadcast(momentum, src=0)

    def build_model(self, shape: tuple[int, ...], classes: int) -> torch.nn.Module:
        """The model for inputs of ``shape`` (after ``data.transform``), the same on every
        rank (drawn on the host, then moved to the rank's device)."""
        torch.manual_seed(self.seed)
        return models.build(self.cfg.model, shape, classes).to(self.device)

    def host_params(self) -> torch.Tensor:
        """The model's parameters as one flat vector in host memory (what crosses gloo)."""
        return models.flat_params(self.model).cpu()

    def load_params(self, flat: torch.Tensor) -> None:
        """The model's parameters from a flat host vector."""
        models.load_flat(self.model, flat.to(self.device))

    def begin(self, epoch: int) -> None:
        die_if_asked(self.cfg.debug, self.ctx.rank, epoch)
        mark(f"epoch {epoch} start")

    def die_at(self, epoch: int, step: int) -> None:
        """``debug.die_step``: the die rank exits at this step (1-based) of ``epoch``."""
        die_if_asked(self.cfg.debug, self.ctx.rank, epoch, step)

    def meta(self, values: list[int] | None = None) -> list[int]:
        """The data set's shape, from the master to every rank (control, not shuffle bytes)."""
        t = torch.tensor(values if values is not None else [0] * META_FIELDS, dtype=torch.int64)
        dist.broadcast(t, src=0)
        return t.tolist()
