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
from ..dist import RankContext, die_if_asked, liveness, mark
from .settings import shuffle_settings

META_FIELDS = 4  # features, classes, dropped points, epochs already done (int64 each)


class Rank:
    """One rank of the job (the master, or a worker)."""

    def __init__(self, cfg: Config, ctx: RankContext, pair: Any) -> None:
        self.cfg, self.ctx, self.pair = cfg, ctx, pair
        self.workers, self.epochs, self.seed = int(cfg.workers), int(cfg.epochs), int(cfg.seed)
        self.storage = float(cfg.storage)
        self.average_every = int(cfg.optim.average_every)  # 0: gradients every step
        self.momentum = float(cfg.optim.momentum)
        self.checkpointing = bool(cfg.job.checkpoint)

    @property
    def store_dir(self) -> Path | None:
        """Where the workers' stores live (memory-mapped) and persist: ``dist.store_dir``,
        else the run directory's ``stores/``; None without checkpoints (in memory)."""
        if not self.checkpointing:
            return None
        given = self.cfg.dist.store_dir
        return Path(given) if given else self.ctx.run_dir / "stores"

    def coded_shuffle(self, dataset: Dataset | None) -> CodedShuffle:
        settings = shuffle_settings(self.cfg, self.store_dir)
        return CodedShuffle(dataset, settings, liveness=liveness())  # ticked by every message

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
        die_if_asked(self.cfg.debug, self.ctx.rank, epoch)
        mark(f"epoch {epoch} start")

    def meta(self, values: list[int] | None = None) -> list[int]:
        """The data set's shape, from the master to every rank (control, not shuffle bytes)."""
        t = torch.tensor(values if values is not None else [0] * META_FIELDS, dtype=torch.int64)
        dist.broadcast(t, src=0)
        return t.tolist()
