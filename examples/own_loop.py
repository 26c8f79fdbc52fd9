"""Coded shuffling in an own training loop: a ``DistributedSampler`` + DDP loop, made coded.

    torchrun --standalone --nproc-per-node 5 examples/own_loop.py
    torchrun --standalone --nproc-per-node 5 examples/own_loop.py --scheme uncoded
    torchrun --standalone --nproc-per-node 5 examples/own_loop.py --master-rank 4 --num-workers 2
    torchrun --standalone --nproc-per-node 5 examples/own_loop.py --data runs/photos --classes 3

One rank is the master (``--master-rank``, rank 0 by default): it holds the data set and hands
it to ``CodedShuffle``. The other ranks are the workers. Every rank builds one ``DataLoader``
over ``cs.dataset`` with ``cs.sampler`` for the whole run and tells ``cs.set_epoch(epoch)``
each epoch, as a ``DistributedSampler`` loop tells its sampler; the model is wrapped by
``cs.ddp`` (DDP over the workers, the gradients averaged as the training job averages them).
On the master the loader is empty and the model is not wrapped: it trains nothing. Epoch
``e + 1``'s delivery runs in the background while the workers train on epoch ``e``. The
scheme changes the bytes on the network, never the batches: coded and uncoded runs end with
the same parameters (the last line prints their SHA-256), and so does the training job with
the same data, model and optimiser (``tests/test_readme.py``). ``--data DIR`` trains on a
directory that ``coded-shuffle pack`` wrote (``coded_shuffle.PackedDataset``: memory-mapped,
items of any fixed shape; ``uint8`` images are scaled to [0, 1]).

``CodedShuffle`` watches every rank (heartbeats through the job's store): a rank that dies, is
stopped or loses its link ends every rank within ``--timeout`` seconds, with one line naming
it and its address (in the delivery, and in the training inside ``cs.watched()``).
``--shuffle partial|none`` (``--fraction Q``) picks the shuffle policy; ``--average-every H``
runs local SGD (DDP's ``no_sync`` at every step, the models averaged every ``H`` steps and at
every epoch's end) instead of averaging the gradients at every step. ``--device cuda`` (or
``auto`` where every rank has CUDA) trains on the GPU: the model, its minibatches (pinned by
the loader) and DDP's NCCL group there, while the coded shuffle, its gloo group and the data
stay on the host.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from coded_shuffle import CodedShuffle, PackedDataset


def make_dataset(points: int, features: int, classes: int, seed: int = 0) -> TensorDataset:
    """A small synthetic classification set (only the master builds it): Gaussian classes
    around the same centres whatever the ``seed`` (another seed: a test split)."""
    centres = torch.randn(classes, features, generator=torch.Generator().manual_seed(0)) * 2
    gen = torch.Generator().manual_seed(1 + seed)
    labels = torch.randint(0, classes, (points,), generator=gen)
    x = centres[labels] + torch.randn(points, features, generator=gen)
    return TensorDataset(x, labels)


def model_input(x: torch.Tensor) -> torch.Tensor:
    """A minibatch as the model's flat float32 rows (``uint8`` images scaled to [0, 1])."""
    x = x.reshape(len(x), -1)
    return x.float().mul_(1 / 255) if x.dtype == torch.uint8 else x.float()


def average(model: nn.Module, opt: torch.optim.Optimizer, group: dist.ProcessGroup) -> None:
    """Local SGD: the parameters and momentum buffers replaced by their mean over the workers,
    in one all-reduce in the model's order (as the training job averages them)."""
    params = list(model.parameters())
    buffers = [opt.state[p].get("momentum_buffer") for p in params]
    tensors = [p.data for p in params] + [b for b in buffers if b is not None]
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="cycles")
    parser.add_argument("--transport", default="chain")
    parser.add_argument("--master-rank", type=int, default=0, help="the rank with the data")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--data", default=None, help="a packed directory (else synthetic)")
    parser.add_argument("--points", type=int, default=4000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=0, help="the DataLoader's")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds (the watchdog)")
    parser.add_argument("--shuffle", default="full", help="full | partial | none")
    parser.add_argument("--fraction", type=float, default=0.25, help="Q of --shuffle partial")
    parser.add_argument("--no-prefetch", action="store_true", help="deliver when asked")
    parser.add_argument(
        "--average-every", type=int, default=0, help="0: average gradients; H: local SGD"
    )
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but CUDA is not available on this host")
    return args


def main() -> None:
    args = arguments()
    dist.init_process_group("gloo")  # the coded shuffle's plane: the host
    rank = dist.get_rank()
    on_gpu = torch.tensor([int(args.device != "cpu" and torch.cuda.is_available())])
    dist.all_reduce(on_gpu, op=dist.ReduceOp.MIN)  # CUDA only where every rank has it
    gpus = torch.cuda.device_count()
    device = torch.device("cuda", rank % gpus) if on_gpu else None
    master = rank == args.master_rank
    data = None
    if master and args.data:
        data = PackedDataset(args.data)
    elif master:
        data = make_dataset(args.points, args.features, args.classes, args.seed)
    cs = CodedShuffle(
        data,
        master_rank=args.master_rank,
        scheme=args.scheme,
        seed=args.seed,
        transport=args.transport,
        epochs=args.epochs,
        shuffle=args.shuffle,
        fraction=args.fraction,
        prefetch=not args.no_prefetch,
        timeout=timedelta(seconds=args.timeout),
    )
    loader = DataLoader(
        cs.dataset,
        batch_size=args.batch_size,
        sampler=cs.sampler,
        num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
        pin_memory=device is not None,
    )
    torch.manual_seed(args.seed)  # the same initial model on every rank
    features = math.prod(cs.shape.layout.fields[0].shape)  # every rank knows the items' shape
    model = nn.Sequential(
        nn.Linear(features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.classes)
    ).to(device or "cpu")
    # the model's all-reduce: gloo beside the shuffle on the CPU, NCCL on GPUs where each rank
    # has one of its own (NCCL takes one rank per GPU), else gloo on the GPUs' tensors
    # (new_group is collective: every rank calls it)
    own = torch.tensor([int(int(os.environ.get("LOCAL_WORLD_SIZE", "1")) <= gpus)])
    dist.all_reduce(own, op=dist.ReduceOp.MIN)
    backend = "nccl" if int(own) else "gloo"
    workers = cs.roles.worker_ranks()
    group = cs.workers_group if device is None else dist.new_group(workers, backend=backend)
    ddp = cs.ddp(model, process_group=group)  # the master: the model itself
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    for epoch in range(1, args.epochs + 1):
        cs.set_epoch(epoch)  # the master: the delivery; a worker: its batch, for the loader
        with cs.watched():  # a lost peer: one line naming it on every rank, not a traceback
            for step, (x, y) in enumerate(loader, start=1):
                x = model_input(x)
                if device is not None:  # from pinned host memory, without blocking
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                # synchronous SGD: DDP averages the gradients; local SGD: no_sync every step
                with ddp.no_sync() if args.average_every else contextlib.nullcontext():
                    loss = nn.functional.cross_entropy(ddp(x), y)
                    opt.zero_grad(set_to_none=False)
                    loss.backward()
                opt.step()
                if args.average_every and (step % args.average_every == 0 or step == len(loader)):
                    average(model, opt, group)  # local SGD: every H steps and at the end
        if cs.is_master:
            r = cs.report
            print(
                f"epoch {epoch}: {r['broadcast_bytes']} bytes on the link, "
                f"uncoded {r['uncoded_bytes']}, lower bound {r['lower_bound_bytes']}, "
                f"verified {r['verified']}",
                flush=True,
            )

    if cs.worker == 0:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
        print(f"final parameters sha256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")
    cs.close()  # with the workers' group: DDP may outlive it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
