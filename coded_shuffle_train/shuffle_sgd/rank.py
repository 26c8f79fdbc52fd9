"""What the job's master and workers share: the config, the coded shuffle (which owns the
workers' group and is handed the job's watchdog), the model, and the few control messages
every rank takes part in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from coded_shuffle import CodedShuffle
from coded_shuffle.distributed.liveness import WATCHED_WAIT

from .. import models
from ..config import Config
from ..device import local_device, model_group
from ..dist import RankContext, liveness, mark
from ..faults import die_if_asked
from .settings import shuffle_settings
from .start import RunStart


def send(tensor: torch.Tensor, dst: int) -> None:
    """``tensor`` to rank ``dst``, point to point on the default group, waiting as long as a
    watched collective may (a gloo send or receive waits its own timeout, not the group's)."""
    dist.isend(tensor, dst=dst).wait(timeout=WATCHED_WAIT)


def recv(tensor: torch.Tensor, src: int) -> None:
    """``tensor`` from rank ``src`` (in place), as :func:`send` sends it."""
    dist.irecv(tensor, src=src).wait(timeout=WATCHED_WAIT)


class Rank:
    """One rank of the job (the master, or a worker)."""

    def __init__(self, cfg: Config, ctx: RankContext, device_kind: str) -> None:
        """``device_kind``: the device type every rank agreed on (``cpu`` or ``cuda``)."""
        self.cfg, self.ctx, self.device_kind = cfg, ctx, device_kind
        self.device = local_device(device_kind)
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

    def coded_shuffle(self, dataset: Dataset | None, start: RunStart) -> CodedShuffle:
        """The coded shuffle of a run that starts as ``start`` says (every rank, together),
        with the job's watchdog; then the group the workers' model all-reduce runs over (its
        workers' group, or an NCCL group of the same ranks on CUDA)."""
        settings = shuffle_settings(self.cfg, self.store_dir, start)
        self.cs = CodedShuffle(dataset, settings, liveness=liveness())  # ticked by every message
        self.model_group = model_group(self.device_kind, self.cs.workers_group, self.ctx.roles)
        return self.cs

    @property
    def master(self) -> int:
        """The master's rank."""
        return self.ctx.master_rank

    @property
    def model_sender(self) -> int:
        """The rank that sends the trained model to the master: worker 0's."""
        return self.ctx.rank_of_worker(0)

    def resumed_state(
        self, params: torch.Tensor, optimizer: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """The master's checkpointed parameters (in place) and optimiser state (its
        ``state_dict()``, returned), to every rank."""
        dist.broadcast(params, src=self.master)
        box = [optimizer]
        dist.broadcast_object_list(box, src=self.master)
        return box[0]

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
        die_if_asked(self.cfg.debug, self.ctx.rank, epoch, master=self.master)
        mark(f"epoch {epoch} start")

    def die_at(self, epoch: int, step: int) -> None:
        """``debug.die_step``: the die rank exits at this step (1-based) of ``epoch``."""
        die_if_asked(self.cfg.debug, self.ctx.rank, epoch, step, self.master)
