"""An own training loop that forgets to close its ``CodedShuffle`` (made without ``with``,
never closed) and destroys the process group at the end, as users do: every rank must still
exit 0. ``--close-after-destroy`` closes it after the group is gone instead. Run one process
per rank with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, or under
``torchrun``."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from coded_shuffle import CodedShuffle


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheme", default="uncoded")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--close-after-destroy", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = None
    if rank == 0:
        gen = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(600, 16, generator=gen), torch.arange(600) % 5)
    cs = CodedShuffle(data, scheme=args.scheme, epochs=args.epochs, heartbeat=0.2)
    for epoch in range(1, args.epochs + 1):
        cs.epoch(epoch)
    print(f"rank {rank}: {args.epochs} epochs verified", flush=True)
    dist.destroy_process_group()
    if args.close_after_destroy:
        cs.close()


if __name__ == "__main__":
    main()
