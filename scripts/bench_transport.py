#!/usr/bin/env python3
"""When does coding pay in seconds? Every scheme x transport on the emulated cluster.

For every ``K`` the script runs the training job on ``coded-shuffle cluster --hosts K+1``
(one network namespace per host, every NIC limited to ``--rate`` both ways) once per
combination of scheme (``uncoded``, ``cycles``) and transport that can carry it, and prints
one table row per run:

* ``load/unc``: the coded load over the uncoded load (the papers' saving on a shared link);
* ``deliver s``: median delivery seconds of the coded epochs (wall clock at the master, from
  the first byte produced until every worker's batch is verified);
* ``vs unicast``: that time over the uncoded ``unicast`` time at the same ``K`` (the honest
  baseline when only the master holds the data);
* ``master MB`` / ``network MB``: median bytes per coded epoch the master sent, and all hosts;
* ``model``: the largest deviation of the counted master and network bytes from the
  transport's cost model (transports.md), computed here from the shared-link bytes;
* ``NIC/count``: what the master's NIC really sent over the whole run (``cluster.json``, IP
  and TCP headers included) over what the job counted.

Needs root (network namespaces). ``--plot FILE`` draws the delivery times.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COMBOS = (
    ("uncoded", "unicast"),
    ("uncoded", "p2p"),
    ("uncoded", "tree"),
    ("uncoded", "chain"),
    ("uncoded", "multicast"),
    ("cycles", "tree"),
    ("cycles", "chain"),
    ("cycles", "multicast"),
)


@dataclass
class Result:
    workers: int
    scheme: str
    transport: str
    rows: list[dict]
    cluster: dict

    def coded(self, key: str) -> np.ndarray:
        return np.array([r[key] for r in self.rows if r["phase"] == "coded"], dtype=float)

    def median(self, key: str) -> float:
        return float(np.median(self.coded(key)))


def model_deviation(res: Result) -> float:
    """Largest relative deviation of master and network bytes from the cost model (%)."""
    p = res.workers + 1
    worst = 0.0
    for r in (r for r in res.rows if r["phase"] == "coded"):
        link, uncoded = r["broadcast_bytes"], r["uncoded_bytes"]
        control = r.get("control_bytes", 0)
        if res.transport == "tree":  # gloo's binomial tree: ceil(log2 P) copies at the master
            model = (math.ceil(math.log2(p)) * link, (p - 1) * link)
        elif res.transport == "chain":  # the stream once per link of the chain
            model = (link, res.workers * link)
        elif res.transport == "multicast":  # once, 16 bytes per datagram, repairs, feedback
            datagram = r["transport_settings"]["datagram_bytes"]
            sent = link + 16 * math.ceil(link / datagram) + r["repair_bytes"]
            workers_feedback = sum(r["host_egress_bytes"][1:])  # workers send feedback only
            model = (sent + control - workers_feedback, sent + control)
        elif res.transport == "unicast":  # each worker its own rows, from the master
            model = (uncoded, uncoded)
        else:  # p2p: the workers send what leaves them, the master nothing
            model = (0, uncoded)
        counted = (r["master_egress_bytes"], r["network_bytes"])
        for c, m in zip(counted, model, strict=True):
            if m:
                worst = max(worst, abs(c - m) / m)
            elif c:
                worst = math.inf
    return 100 * worst


def nic_ratio(res: Result) -> float:
    """Master NIC bytes sent over the whole run / master bytes the job counted."""
    counted = sum(r["master_egress_bytes"] for r in res.rows)
    return res.cluster["hosts"][0]["nic_tx_bytes"] / counted if counted else math.nan


def run_one(args: argparse.Namespace, k: int, scheme: str, transport: str) -> Result:
    run_dir = Path(args.out) / f"K{k}" / f"{scheme}-{transport}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    overrides = [
        f"scheme={scheme}", f"dist.transport={transport}", "data=synthetic",
        f"data.points={args.points}", f"data.features={args.features}", "model=logreg",
        f"epochs={args.epochs}", "optim.batch_size=1024", f"seed={args.seed}",
        f"hydra.run.dir={run_dir}", *args.set,
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "coded_shuffle", "cluster", "--hosts", str(k + 1),
           "--rate", args.rate, "--mtu", str(args.mtu), "--", *overrides]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(
            f"bench_transport.py: error: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}"
        )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if not all(r["verified"] for r in rows):
        raise SystemExit(f"bench_transport.py: error: {run_dir}: an epoch was not verified")
    cluster = json.loads((run_dir / "cluster.json").read_text())
    return Result(k, scheme, transport, rows, cluster)


HEADER = (
    f"{'K':>3} {'scheme':8s} {'transport':10s} {'load/unc':>8s} {'deliver s':>9s} "
    f"{'vs unicast':>10s} {'master MB':>9s} {'network MB':>10s} {'model':>7s} {'NIC/count':>9s}"
)


def table(results: list[Result]) -> list[str]:
    lines = [HEADER, "-" * len(HEADER)]
    for k in sorted({r.workers for r in results}):
        mine = [r for r in results if r.workers == k]
        base = next(r for r in mine if (r.scheme, r.transport) == ("uncoded", "unicast"))
        for r in mine:
            ratio = r.median("load_points") / r.median("uncoded_points")
            seconds = r.median("delivery_seconds")
            lines.append(
                f"{k:>3} {r.scheme:8s} {r.transport:10s} {ratio:8.3f} {seconds:9.3f} "
                f"{seconds / base.median('delivery_seconds'):10.2f} "
                f"{r.median('master_egress_bytes') / 1e6:9.1f} "
                f"{r.median('network_bytes') / 1e6:10.1f} {model_deviation(r):6.2f}% "
                f"{nic_ratio(r):9.3f}"
            )
    return lines


def plot(results: list[Result], path: Path, rate: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = sorted({r.workers for r in results})
    fig, axes = plt.subplots(1, len(ks), figsize=(5.5 * len(ks), 4.2), squeeze=False)
    for ax, k in zip(axes[0], ks, strict=True):
        mine = [r for r in results if r.workers == k]
        base = next(r for r in mine if (r.scheme, r.transport) == ("uncoded", "unicast"))
        labels = [f"{r.scheme}\n{r.transport}" for r in mine]
        values = [r.median("delivery_seconds") for r in mine]
        colors = ["tab:blue" if r.scheme == "uncoded" else "tab:orange" for r in mine]
        ax.bar(range(len(mine)), values, color=colors)
        ax.axhline(base.median("delivery_seconds"), color="black", lw=1, ls="--",
                   label="uncoded unicast")  # fmt: skip
        ax.set_xticks(range(len(mine)), labels, fontsize=7)
        ax.set(title=f"K = {k} workers: delivery per coded epoch", ylabel="seconds (median)")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"blue: uncoded, orange: cycles (coded); emulated cluster, NICs {rate}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rate", default="400mbit", help="every NIC's rate (tc units)")
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--points", type=int, default=20000)
    parser.add_argument("--features", type=int, default=500, help="points of 4*F+4 bytes")
    parser.add_argument("--epochs", type=int, default=6, help="epoch 1 is the placement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench_transport", help="run directories")
    parser.add_argument("--plot", type=Path, help="bar chart of the delivery times (PNG)")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides for every run"
    )
    parser.add_argument(
        "--combos", nargs="+", metavar="SCHEME/TRANSPORT",
        default=[f"{s}/{t}" for s, t in COMBOS],
    )  # fmt: skip
    args = parser.parse_args(argv)
    combos = [tuple(c.split("/", 1)) for c in args.combos]
    if ("uncoded", "unicast") not in combos:
        parser.error("the combos must include uncoded/unicast (the baseline of 'vs unicast')")
    print(
        f"emulated cluster: K+1 hosts, NICs {args.rate} both ways, MTU {args.mtu}; "
        f"{args.points} points of {4 * args.features + 4} bytes, {args.epochs - 1} coded epochs "
        "(median); every epoch verified",
        flush=True,
    )
    results = []
    for k in args.workers:
        for scheme, transport in combos:
            results.append(run_one(args, k, scheme, transport))
            print(f"  K={k} {scheme}/{transport}: done", file=sys.stderr, flush=True)
    print("\n".join(table(results)))
    if args.plot:
        plot(results, args.plot, args.rate)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
