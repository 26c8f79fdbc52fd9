"""Where the model trains (``device=auto|cpu|cuda``): the data plane stays on the host (the
coded transports, the stores, ``CodedShuffle``'s gloo group); the model, its minibatches and
the workers' gradient all-reduce go to the device (NCCL on CUDA), each batch copied from
pinned host memory without blocking."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from coded_shuffle.distributed.liveness import WATCHED_WAIT
from coded_shuffle.distributed.roles import Roles
from coded_shuffle.errors import UsageError

DEVICES = ("auto", "cpu", "cuda")


def check_device(name: str, cuda_available: bool | None = None) -> None:
    """``device=name`` is valid on this host (:class:`UsageError`: one line)."""
    if name not in DEVICES:
        raise UsageError(f"device={name} is not one of {' | '.join(DEVICES)}")
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if name == "cuda" and not available:
        raise UsageError(
            "device=cuda but CUDA is not available on this host (torch.cuda.is_available() "
            "is False): use device=auto or device=cpu"
        )


def device_type(name: str, cuda_available: bool | None = None) -> str:
    """``cuda`` or ``cpu`` for ``device=name`` (``auto``: CUDA where available)."""
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    check_device(name, available)
    return "cuda" if name == "cuda" or (name == "auto" and available) else "cpu"


def agreed_device_type(name: str) -> str:
    """The device type every rank of the job uses (a collective over the default group):
    ``auto`` picks CUDA only where every rank has it, so that the ranks build the same
    groups."""
    local = device_type(name)
    if name != "auto" or not dist.is_initialized():
        return local
    flag = torch.tensor([int(local == "cuda")])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return "cuda" if int(flag) else "cpu"


def local_device(kind: str, local_rank: int | None = None) -> torch.device:
    """This process's device: ``cuda:LOCAL_RANK % device_count()`` on CUDA, else the CPU."""
    if kind != "cuda":
        return torch.device("cpu")
    rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    return torch.device("cuda", rank % torch.cuda.device_count())


def ddp_backend(device: torch.device, own_gpu: bool = True) -> str:
    """The backend of the workers' model group: NCCL for CUDA tensors where every rank has a
    GPU of its own (NCCL refuses two ranks on one GPU), gloo otherwise (CUDA tensors too)."""
    return "nccl" if device.type == "cuda" and own_gpu else "gloo"


def own_gpu() -> bool:
    """Whether every rank of the job has a GPU of its own: its host's processes
    (``LOCAL_WORLD_SIZE``) are no more than its GPUs, on every host (collective)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    flag = torch.tensor([int(local <= torch.cuda.device_count())])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(int(flag))


def model_group(kind: str, workers_group: Any, roles: Roles | None = None) -> Any:
    """The group the workers' DDP and model averaging run over: ``workers_group`` (gloo) on
    the CPU; on CUDA a new group of the same ranks (``new_group`` is collective: every rank
    calls this, the master too), NCCL where every rank has its own GPU, else gloo on the
    GPUs' tensors, waiting as long as the job's watchdog allows."""
    if kind != "cuda":
        return workers_group
    ranks = (roles or Roles(0, dist.get_world_size())).worker_ranks()
    backend = ddp_backend(torch.device("cuda"), own_gpu())
    return dist.new_group(ranks, timeout=WATCHED_WAIT, backend=backend)


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device``: from pinned host memory without blocking on CUDA; unchanged on
    the CPU."""
    if device.type == "cpu":
        return x
    return x.pin_memory().to(device, non_blocking=True)
