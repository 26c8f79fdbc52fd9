"""Job ``shuffle_sgd``: random-reshuffling SGD whose epoch data moves as a coded broadcast.

A training loop on the library's :class:`~coded_shuffle.CodedShuffle`, as a user's script
would be: rank 0 (master, :mod:`.master`) holds the training set and hands it to
``CodedShuffle``, which plans, proves, encodes, moves (``dist.transport``), decodes and
verifies every epoch's delivery. Workers (ranks 1..K, :mod:`.worker`) get their batch as a
data set and run synchronous data-parallel SGD (the model wrapped in
``DistributedDataParallel`` over the workers' group; with local SGD its ``no_sync`` skips the
per-step all-reduce and the models are averaged every ``H`` steps); worker 0 sends the
parameters to the master, which evaluates them on the test split and writes each epoch's
metrics beside the delivery's.

The scheme changes the bytes on the link, never the batches or their order: with the same seed
every scheme yields bit-identical parameters (``final_params_sha256`` in ``summary.json``).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from ..config import Config
from ..device import agreed_device_type, model_group
from ..dist import context, start_liveness
from ..jobs import Job
from .master import Master, stage_line
from .settings import validate
from .steps import average_state, averaging_steps, mean_in_model_order, model_inputs
from .worker import Worker

# collectives wait for long work (an epoch's training, a large delivery) without a bound: the
# liveness watchdog fails the job within dist.timeout_seconds of a lost peer
COLLECTIVE_TIMEOUT = timedelta(days=7)

__all__ = [
    "JOB",
    "average_state",
    "averaging_steps",
    "mean_in_model_order",
    "model_inputs",
    "validate",
]


class ShuffleSGD(Job):
    name = "shuffle_sgd"

    def validate(self, cfg: Config) -> None:
        validate(cfg)

    def max_restarts(self, cfg: Config) -> int:
        """``dist.max_restarts``: the launcher restarts every process; the job resumes from
        its checkpoint (``job.checkpoint``)."""
        return int(cfg.dist.max_restarts)

    def collective_timeout(self, cfg: Config) -> timedelta:
        del cfg
        return COLLECTIVE_TIMEOUT

    def run(self, cfg: Config) -> None:
        ctx = context()
        start_liveness(cfg.dist, stage_line if ctx.is_master else None)
        timeout = ctx.collective_timeout or ctx.timeout
        pair = dist.new_group([0, 1], timeout=timeout)
        kind = agreed_device_type(cfg.device)
        models = model_group(kind, ctx.workers_group, timeout)
        (Master if ctx.is_master else Worker)(cfg, ctx, pair, (kind, models)).run()


JOB = ShuffleSGD()
