"""An own training loop on ``CodedShuffle`` whose rank ``--fault-rank`` kills or stops itself
in the middle of epoch ``--fault-epoch``'s delivery (after its first message): the other
ranks must end within ``--timeout`` and a few seconds, naming it. Run one process per rank
with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (no launcher that
could notice the fault for them)."""

from __future__ import annotations

import argparse
import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from coded_shuffle import CodedShuffle


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=["kill", "stop"], required=True)
    parser.add_argument("--fault-rank", type=int, default=2)
    parser.add_argument("--fault-epoch", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=4.0)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))  # longer than the test
    rank = dist.get_rank()
    data = None
    if rank == 0:
        gen = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(3000, 32, generator=gen), torch.arange(3000) % 5)
    epoch = 0

    def on_progress(done: int, total: int) -> None:
        if rank == args.fault_rank and epoch == args.fault_epoch and 0 < done < total:
            print(f"rank {rank}: {args.fault} myself mid-delivery", flush=True)
            os.kill(os.getpid(), signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)

    cs = CodedShuffle(
        data,
        scheme="cycles",
        epochs=args.epochs,
        chunk_bytes=4096,  # many messages per delivery
        timeout=timedelta(seconds=args.timeout),
        heartbeat=0.5,
        on_progress=on_progress,
    )
    for epoch in range(1, args.epochs + 1):  # on_progress reads it
        cs.epoch(epoch)
        print(f"rank {rank}: epoch {epoch} done", flush=True)
    cs.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
