"""Data parallel training over the workers' group, with the same bits however it started
(``cs.ddp(model)``), and the order in which a worker visits its batch (``cs.sampler``).

DDP lays a bucket's gradients out in the order they became ready after its first step, and
anew after a restart; gloo's sums depend on an element's place in the buffer. Averaged by
:func:`mean_in_model_order`, always laid out in the model's parameter order, a run resumed
inside an epoch ends with the parameters of an unbroken one, and an own loop with those of the
training job.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def mean_in_model_order(state: tuple[Any, dict[int, int]], bucket):
    """DDP communication hook: the bucket's gradients averaged over the group, laid out in
    the model's parameter order for the all-reduce. ``bucket`` and the result are not
    annotated: DDP checks annotations as objects, and this module's are strings."""
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


# DDP's own options in the installed torch: ``forward_sync_buffers`` (2.13) was
# ``broadcast_buffers`` before
DDP_OPTIONS = frozenset(inspect.signature(DistributedDataParallel.__init__).parameters)


def data_parallel(
    model: torch.nn.Module, group: Any, device: torch.device | None = None, **options: Any
) -> DistributedDataParallel:
    """``model`` in DDP over ``group``, its gradients averaged at every step in one bucket by
    :func:`mean_in_model_order`; ``options`` go to DDP (``init_sync=False`` where every rank
    drew the same model; ``forward_sync_buffers`` as ``broadcast_buffers`` where torch is
    older than that name)."""
    if "forward_sync_buffers" in options and "forward_sync_buffers" not in DDP_OPTIONS:
        options["broadcast_buffers"] = options.pop("forward_sync_buffers")
    model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    on_gpu = device is not None and device.type == "cuda"
    ddp = DistributedDataParallel(
        model,
        device_ids=[device.index] if on_gpu and device is not None else None,
        process_group=group,
        bucket_cap_mb=model_mb + 1,
        **options,
    )
    order = {id(p): i for i, p in enumerate(model.parameters())}
    ddp.register_comm_hook((group, order), mean_in_model_order)
    return ddp


def minibatch_order(seed: int, epoch: int, worker: int, batch: int) -> np.ndarray:
    """The order in which ``worker`` visits its batch of ``batch`` items in ``epoch`` (the
    positions in the batch; scheme-independent): what ``cs.sampler`` yields and the training
    job's steps take."""
    return np.random.default_rng([seed, 1, epoch, worker]).permutation(batch)
