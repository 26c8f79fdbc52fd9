"""Streaming delivery: does encoding overlap the network? A torchrun script.

The master holds ``--points`` random records of ``--point-bytes`` bytes and runs
``--epochs`` epochs of ``--scheme`` twice through :class:`~coded_shuffle.CodedShuffle`
(``epochs`` unknown, so nothing is encoded ahead): once encoding every epoch whole before
its first byte (``stream=False``), once encoding message by message while earlier messages
are on the link (``stream=True``). Workers decode as symbols arrive in both runs. Per coded
epoch (median over epochs 2..E):

* ``encode s``: the master's encoding time (whole epoch, ``stream=False``);
* ``network s``: delivery of the already encoded symbols, from the first byte sent until
  every worker's batch is verified (``stream=False``);
* ``enc+net s``: the two one after the other (the delivery without streaming);
* ``stream s``: the streamed delivery, from the first symbol encoded until every batch is
  verified;
* ``stream/max``: ``stream s`` over ``max(encode s, network s)`` (1.00: full overlap).

Loopback (every rank on this machine, sharing its cores)::

    torchrun --standalone --nproc-per-node 3 scripts/bench_overlap.py

The emulated cluster (one host per rank, NICs limited by tc; needs root)::

    coded-shuffle cluster --hosts 3 --rate 1gbit --script scripts/bench_overlap.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from coded_shuffle import CodedShuffle
from coded_shuffle.errors import UsageError


def run(args: argparse.Namespace, stream: bool) -> list[dict[str, float]]:
    """The master's delivery report of every coded epoch, with ``stream`` on or off."""
    dataset = None
    if dist.get_rank() == 0:
        gen = torch.Generator().manual_seed(args.seed)
        shape = (args.points, args.point_bytes)
        dataset = TensorDataset(torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen))
    cs = CodedShuffle(
        dataset, scheme=args.scheme, seed=args.seed, transport=args.transport, stream=stream
    )
    rows = []
    for epoch in range(1, args.epochs + 1):
        cs.epoch(epoch)
        if dist.get_rank() == 0 and epoch > 1:
            if not cs.report["verified"]:
                raise SystemExit(f"epoch {epoch}: a worker decoded wrong bytes")
            rows.append(dict(cs.report))
    cs.close()
    return rows


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=400_000)
    parser.add_argument("--point-bytes", type=int, default=256)
    parser.add_argument("--scheme", default="cycles")
    parser.add_argument("--transport", default="chain")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mode")
    args = parser.parse_args(argv)
    if args.epochs < 2 or min(args.points, args.point_bytes, args.repeats) < 1:
        print(
            f"error: --epochs ({args.epochs}) must be >= 2, --points ({args.points}), "
            f"--point-bytes ({args.point_bytes}) and --repeats ({args.repeats}) >= 1",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        whole, streamed = [], []
        for _ in range(args.repeats):  # alternating, so that neither gets a warmer machine
            whole += run(args, stream=False)
            streamed += run(args, stream=True)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    enc, net = median(whole, "encode_seconds"), median(whole, "delivery_seconds")
    both = statistics.median(r["encode_seconds"] + r["delivery_seconds"] for r in whole)
    stream = median(streamed, "delivery_seconds")
    mb = median(whole, "payload_bytes") / 1e6
    print(
        f"{args.scheme} on {args.transport}, {os.environ.get('WORLD_SIZE', '?')} ranks, "
        f"N = {args.points} x {args.point_bytes} B, {mb:.1f} MB of symbols per coded epoch, "
        f"median of {len(whole)} epochs each"
    )
    header = (
        f"{'encode s':>9} {'network s':>9} {'enc+net s':>9} {'stream s':>9} "
        f"{'stream/max':>10} {'stream/(enc+net)':>16}"
    )
    print(header)
    print("-" * len(header))
    print(
        f"{enc:>9.3f} {net:>9.3f} {both:>9.3f} {stream:>9.3f} {stream / max(enc, net):>10.2f} "
        f"{stream / both:>16.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
