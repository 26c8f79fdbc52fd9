"""An own loop whose master corrupts epoch 3's symbols while it waits, in the loop, for a
message that comes only after a minute of "training": the failure of the background delivery
must end the master at once with one line (it cannot be raised where the loop waits: in a gloo
receive). Run one process per rank with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set."""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from coded_shuffle import CodedShuffle
from coded_shuffle.distributed import faults

CORRUPT_EPOCH = 3


def flip(epoch: int, first: int, rows: torch.Tensor) -> torch.Tensor | None:
    """Epoch 3's first symbol with byte 0 flipped (the rows themselves are not written)."""
    if epoch != CORRUPT_EPOCH or first != 0 or not rows.numel():
        return None
    flipped = rows.clone()
    flipped[0, 0] ^= 0xFF
    return flipped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=4.0)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))  # longer than the test
    rank = dist.get_rank()
    data = None
    if rank == 0:
        gen = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(3000, 32, generator=gen), torch.arange(3000) % 5)
        faults.set_outgoing(flip)
    cs = CodedShuffle(
        data, scheme="cycles", epochs=4, timeout=timedelta(seconds=args.timeout), heartbeat=0.5
    )
    token = torch.zeros(1)
    for epoch in range(1, 5):
        cs.epoch(epoch)  # then epoch + 1's delivery runs in the background
        if epoch == CORRUPT_EPOCH - 1:
            if rank == 0:
                dist.recv(token, src=1)  # waits in gloo while epoch 3 is delivered
            elif rank == 1:
                time.sleep(60)  # a long "training"
                dist.send(token, dst=0)
    cs.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
