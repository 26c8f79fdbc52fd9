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

from ..config import Config
from ..device import agreed_device_type
from ..dist import context, start_liveness
from ..jobs import Job
from .master import Master, stage_line
from .settings import validate
from .steps import average_state, averaging_steps, model_inputs
from .worker import Worker

__all__ = [
    "JOB",
    "average_state",
    "averaging_steps",
    "model_inputs",
    "validate",
]


class ShuffleSGD(Job):
    name = "shuffle_sgd"

    def validate(self, cfg: Config) -> None:
        validate(cfg)

    def run(self, cfg: Config) -> None:
        """Every rank: the watchdog (from here on collectives wait for long work: it bounds
        how long a lost peer goes unnoticed), the agreed device, then the master's or a
        worker's loop. The job makes no process group of its own: the workers' group is the
        coded shuffle's (and on CUDA the model's NCCL group beside it)."""
        ctx = context()
        start_liveness(cfg.dist, stage_line if ctx.is_master else None)
        kind = agreed_device_type(cfg.device)
        (Master if ctx.is_master else Worker)(cfg, ctx, kind).run()


JOB = ShuffleSGD()
