"""What a worker's training steps are made of: when local SGD averages, the model's inputs
from decoded records, and DDP let go of in time (the order a worker visits its batch in and
DDP's gradient averaging are the library's: :mod:`coded_shuffle.distributed.ddp`)."""

from __future__ import annotations

import gc
from typing import Any

import torch
import torch.distributed as dist

from coded_shuffle_train import data


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


def average_state(
    params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, group: Any, workers: int
) -> None:
    """Local SGD: every worker's parameters and momentum buffers replaced by their mean over
    the ``workers`` of ``group`` (one flat all-reduce)."""
    buffers = [optimizer.state[p].get("momentum_buffer") for p in params]
    tensors = [p.data for p in params] + [b for b in buffers if b is not None]
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat /= workers
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n
