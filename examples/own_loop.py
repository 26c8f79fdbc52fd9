"""Coded shuffling in an own training loop: a plain PyTorch script on ``CodedShuffle``.

    torchrun --standalone --nproc-per-node 5 examples/own_loop.py
    torchrun --standalone --nproc-per-node 5 examples/own_loop.py --scheme uncoded

Rank 0 is the master: it holds the data set and hands it to ``CodedShuffle``. Ranks 1..4 are
the workers: every epoch they get their new batch as a data set, wrap it in a ``DataLoader``
and train one model together, wrapped in ``DistributedDataParallel`` over ``workers_group``
(the gradients averaged at every step). The scheme changes
the bytes on the network, never the batches: coded and uncoded runs end with the same
parameters (the last line prints their SHA-256).

``CodedShuffle`` watches every rank (heartbeats through the job's store): a rank that dies, is
stopped or loses its link ends every rank within ``--timeout`` seconds, with one line naming
it and its address (in the delivery, and in the training inside ``cs.watched()``).
``--shuffle partial|none`` (``--fraction Q``) picks the shuffle policy; ``--average-every H``
runs local SGD (DDP's ``no_sync`` at every step, the models averaged every ``H`` steps and at
every epoch's end) instead of averaging the gradients at every step. ``--device cuda`` (or
``auto`` where every rank has CUDA) trains on the GPU: the model, its minibatches and DDP's
NCCL group there, while the coded shuffle, its gloo group and the data stay on the host.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from coded_shuffle import CodedShuffle


def make_dataset(points: int, features: int, classes: int) -> TensorDataset:
    """A small synthetic classification set (only the master builds it)."""
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(classes, features, generator=gen) * 2
    labels = torch.randint(0, classes, (points,), generator=gen)
    x = centres[labels] + torch.randn(points, features, generator=gen)
    return TensorDataset(x, labels)


def average(tensors: list[torch.Tensor], group: dist.ProcessGroup, workers: int) -> None:
    """Every tensor replaced by its mean over the workers (in place): local SGD's models."""
    for t in tensors:
        dist.all_reduce(t, group=group)
        t /= workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="cycles")
    parser.add_argument("--transport", default="chain")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--points", type=int, default=4000)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds (the watchdog)")
    parser.add_argument("--shuffle", default="full", help="full | partial | none")
    parser.add_argument("--fraction", type=float, default=0.25, help="Q of --shuffle partial")
    parser.add_argument(
        "--average-every", type=int, default=0, help="0: average gradients; H: local SGD"
    )
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but CUDA is not available on this host")

    dist.init_process_group("gloo")  # the coded shuffle's plane: the host
    rank, features, classes = dist.get_rank(), 16, 4
    on_gpu = torch.tensor([int(args.device != "cpu" and torch.cuda.is_available())])
    dist.all_reduce(on_gpu, op=dist.ReduceOp.MIN)  # CUDA only where every rank has it
    device = torch.device("cuda", rank % torch.cuda.device_count()) if on_gpu else None
    dataset = make_dataset(args.points, features, classes) if rank == 0 else None
    cs = CodedShuffle(
        dataset,
        scheme=args.scheme,
        seed=0,
        transport=args.transport,
        epochs=args.epochs,
        shuffle=args.shuffle,
        fraction=args.fraction,
        timeout=timedelta(seconds=args.timeout),
    )

    torch.manual_seed(0)  # the same initial model on every rank
    model = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, classes))
    model.to(device or "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    world = dist.get_world_size()
    workers = world - 1
    # the model's all-reduce: gloo beside the shuffle on the CPU, NCCL on GPUs (new_group is
    # collective: every rank calls it)
    group = (
        cs.workers_group
        if device is None
        else dist.new_group(list(range(1, world)), backend="nccl")
    )
    ids = None if device is None else [device.index]
    ddp = None if rank == 0 else DistributedDataParallel(model, ids, process_group=group)

    for epoch in range(1, args.epochs + 1):
        local = cs.epoch(epoch)  # worker: its new batch; master: None
        if rank == 0:
            r = cs.report
            print(
                f"epoch {epoch}: {r['broadcast_bytes']} bytes on the link, "
                f"uncoded {r['uncoded_bytes']}, lower bound {r['lower_bound_bytes']}, "
                f"verified {r['verified']}",
                flush=True,
            )
            continue
        assert ddp is not None
        loader = DataLoader(
            local, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(epoch)
        )
        with cs.watched():  # a lost peer: one line naming it on every rank, not a traceback
            for step, (x, y) in enumerate(loader, start=1):
                if device is not None:  # from pinned host memory, without blocking
                    x = x.pin_memory().to(device, non_blocking=True)
                    y = y.pin_memory().to(device, non_blocking=True)
                opt.zero_grad()
                # synchronous SGD: DDP averages the gradients; local SGD: no_sync every step
                with ddp.no_sync() if args.average_every else contextlib.nullcontext():
                    nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
                if args.average_every and (step % args.average_every == 0 or step == len(loader)):
                    # local SGD: the workers' models averaged every H steps and at the end
                    average([p.data for p in model.parameters()], group, workers)

    if rank == 1:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
        print(f"final parameters sha256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")
    cs.close()  # with the workers' group: DDP may outlive it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
