#!/usr/bin/env python3
"""Predicted delivery seconds for clusters this machine cannot emulate (docs/benchmarks.md,
"Predictions"): ``coded-shuffle predict``'s model for every ``K`` and topology, one row each.

Columns: the uncoded deliveries from the master (``unicast``) and between the workers
(``p2p``), the coded ones (``cycles``) over ``chain`` and ``multicast``, the best coded over
``unicast`` (where only the master holds the data), and the fastest with its ratio to the
fastest uncoded delivery. Predictions, not measurements: the transports' cost
models (docs/transports.md, "Predictions"), calibrated on the emulated cluster.
"""

from __future__ import annotations

import argparse
import sys
import time

from coded_shuffle.costs.model import Network
from coded_shuffle.costs.rates import format_rate, parse_rate
from coded_shuffle.tools.predict import Workload, planned_load, predict

HEADER = (
    f"{'K':>4} {'topology':8s} {'unicast s':>9s} {'p2p s':>7s} {'coded chain s':>13s} "
    f"{'coded multicast s':>17s} {'coded/unicast':>13s}  fastest"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--points", type=int, default=1 << 20)
    parser.add_argument("--point-bytes", type=int, default=3080, help="a CIFAR-10 record")
    parser.add_argument("--rate", default="10gbit")
    parser.add_argument("--uplink-rate", default="1gbit", help="the master's NIC for uplink")
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("--scheme", default="cycles")
    parser.add_argument(
        "--peer-seconds", type=float, default=None, help="p2p's per-peer cost (predict's)"
    )
    args = parser.parse_args(argv)
    rate, uplink = parse_rate(args.rate), parse_rate(args.uplink_rate)
    print(
        f"predicted (not measured): N = {args.points:,} points of {args.point_bytes} B, "
        f"scheme {args.scheme}, NICs {format_rate(rate)} (uplink: master "
        f"{format_rate(uplink)}), MTU {args.mtu}; seconds of one epoch's delivery"
    )
    print(HEADER)
    print("-" * len(HEADER))
    for k in args.workers:
        t0 = time.perf_counter()
        cluster = Workload(k, args.points - args.points % k, args.point_bytes, scheme=args.scheme)
        load = planned_load(cluster, chain=True)  # the shared rows' chain
        for topology in ("switch", "shared", "uplink"):
            extra = {} if args.peer_seconds is None else {"peer_seconds": args.peer_seconds}
            master = uplink if topology == "uplink" else rate
            net = Network(topology, rate, master, mtu=args.mtu, **extra)
            rows = {(r.delivery, r.transport): r for r in predict(cluster, net, load)}
            fastest = min(rows.values(), key=lambda r: r.seconds)
            best_coded = min(r.seconds for (d, _), r in rows.items() if d == "coded")
            print(
                f"{k:>4} {topology:8s} {rows['uncoded', 'unicast'].seconds:9.3f} "
                f"{rows['uncoded', 'p2p'].seconds:7.3f} {rows['coded', 'chain'].seconds:13.3f} "
                f"{rows['coded', 'multicast'].seconds:17.3f} "
                f"{best_coded / rows['uncoded', 'unicast'].seconds:13.2f}  {fastest.delivery} "
                f"{fastest.transport} ({fastest.vs_best_uncoded:.2f}x the best uncoded)"
            )
        print(f"  K={k}: planned in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
