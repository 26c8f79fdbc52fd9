#!/usr/bin/env python3
"""What coding buys in training: seconds and bytes to a target accuracy, on the emulated
cluster, against what a user would do instead.

Every run is the training job on ``coded-shuffle cluster --hosts K+1`` (one network namespace
per host, every NIC limited to ``--rate`` both ways) with skewed shards
(``data.placement=by_label``: every worker starts with a few classes) and a synchronisation
(``optim.average_every``: ``0`` averages the gradients at every step, ``H`` runs local SGD and
averages the models every ``H`` steps and at every epoch's end). Per synchronisation it runs
the shuffle policies a user chooses between, each delivered the ways that can carry it:

* ``full`` coded (``cycles``) over ``chain`` and ``multicast``; ``full`` uncoded over
  ``unicast`` (the master sends each worker its points) and ``p2p`` (workers exchange);
* ``partial`` (``Q = --fraction``) coded over ``chain`` and uncoded over ``unicast``;
* ``none`` (no global reshuffle: no byte after the placement).

It prints per run the final test accuracy, the epochs, seconds (``elapsed_seconds``: since the
first epoch began) and shuffle bytes (network, master) to ``--target``, the seconds ratio
against ``full`` uncoded ``unicast`` of the same synchronisation, the share of an epoch that
delivery takes, and the load against the run's own uncoded load; ``--plot FILE`` draws test
accuracy against seconds. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RUNS = (  # policy, scheme, transport
    ("full", "cycles", "chain"),
    ("full", "cycles", "multicast"),
    ("full", "uncoded", "unicast"),
    ("full", "uncoded", "p2p"),
    ("partial", "cycles", "chain"),
    ("partial", "uncoded", "unicast"),
    ("none", "uncoded", "unicast"),
)
BASELINE = ("full", "uncoded", "unicast")


@dataclass
class Result:
    average_every: int
    policy: str
    scheme: str
    transport: str
    rows: list[dict]

    @property
    def key(self) -> tuple[str, str, str]:
        return self.policy, self.scheme, self.transport

    def series(self, key: str) -> np.ndarray:
        return np.array([float(r[key]) for r in self.rows])

    def to_target(self, target: float) -> tuple[int, float, float, float] | None:
        """(epochs, seconds, network bytes, master bytes) to ``target``, or None."""
        reached = np.flatnonzero(self.series("test_accuracy") >= target)
        if reached.size == 0:
            return None
        i = int(reached[0])
        network = float(np.sum(self.series("network_bytes")[: i + 1]))
        master = float(np.sum(self.series("master_egress_bytes")[: i + 1]))
        return i + 1, float(self.series("elapsed_seconds")[i]), network, master

    def later(self, key: str) -> float:
        """Median of ``key`` over the epochs after the placement."""
        return float(np.median(self.series(key)[1:]))


def run_one(args: argparse.Namespace, every: int, policy: str, scheme: str, transport: str):
    run_dir = Path(args.out) / f"H{every}" / f"{policy}-{scheme}-{transport}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    overrides = [
        f"scheme={scheme}", f"dist.transport={transport}", f"shuffle={policy}",
        f"data.placement={args.placement}", f"optim.average_every={every}",
        f"epochs={args.epochs}", f"seed={args.seed}", f"dist.chunk_bytes={args.chunk_bytes}",
        f"hydra.run.dir={run_dir}", *args.set,
    ]  # fmt: skip
    if policy == "partial":
        overrides.append(f"shuffle.fraction={args.fraction}")
    if transport == "multicast":
        overrides.append(f"dist.multicast.rate={args.multicast_rate}")
    cmd = [sys.executable, "-m", "coded_shuffle", "cluster", "--hosts", str(args.workers + 1),
           "--rate", args.rate, "--", *overrides]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(
            f"bench_time_to_accuracy.py: error: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}"
        )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if not all(r["verified"] for r in rows):
        raise SystemExit(f"bench_time_to_accuracy.py: error: {run_dir}: an epoch not verified")
    return Result(every, policy, scheme, transport, rows)


def label(r: Result, fraction: float) -> str:
    policy = f"partial{fraction:g}" if r.policy == "partial" else r.policy
    return f"{policy}/{r.scheme}/{r.transport}"


HEADER = (
    f"{'H':>4} {'run':28s} {'final acc':>9s} {'epochs':>6s} {'seconds':>8s} "
    f"{'vs unicast':>10s} {'network MB':>10s} {'master MB':>9s} {'deliv/epoch':>11s} "
    f"{'load/unc':>8s}"
)


def table(results: list[Result], target: float, fraction: float) -> list[str]:
    lines = [HEADER, "-" * len(HEADER)]
    for every in sorted({r.average_every for r in results}):
        mine = [r for r in results if r.average_every == every]
        base = next(r for r in mine if r.key == BASELINE).to_target(target)
        for r in mine:
            reached = r.to_target(target)
            acc = r.series("test_accuracy")[-1]
            share = r.later("delivery_seconds") / r.later("epoch_seconds")
            unc = r.later("uncoded_points")
            load = f"{r.later('load_points') / unc:8.3f}" if unc else f"{'-':>8s}"
            head = f"{every:>4} {label(r, fraction):28s} {acc:9.3f}"
            tail = f"{share:11.2f} {load}"
            if reached is None:
                lines.append(f"{head} {'not reached':>39s} {'':9s} {tail}")
                continue
            epochs, seconds, network, master = reached
            ratio = f"{seconds / base[1]:10.2f}" if base else f"{'-':>10s}"
            lines.append(
                f"{head} {epochs:6d} {seconds:8.2f} {ratio} {network / 1e6:10.2f} "
                f"{master / 1e6:9.2f} {tail}"
            )
    return lines


def partial_check(results: list[Result], fraction: float) -> list[str]:
    """``partial``: its uncoded bytes per epoch against ``fraction`` times ``full``'s."""
    out = []
    for every in sorted({r.average_every for r in results}):
        mine = {r.key: r for r in results if r.average_every == every}
        full = mine[("full", "uncoded", "unicast")].later("uncoded_bytes")
        part = mine[("partial", "uncoded", "unicast")].later("uncoded_bytes")
        coded = mine[("partial", "cycles", "chain")]
        out.append(
            f"H={every}: partial uncoded bytes per epoch / (Q x full's) = "
            f"{part / (fraction * full):.3f}; partial coded load / its uncoded load = "
            f"{coded.later('load_points') / coded.later('uncoded_points'):.3f}"
        )
    return out


def plot(results: list[Result], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    everies = sorted({r.average_every for r in results})
    fig, axes = plt.subplots(1, len(everies), figsize=(6 * len(everies), 4.4), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, every in zip(axes[0], everies, strict=True):
        for i, r in enumerate(r for r in results if r.average_every == every):
            ax.plot(r.series("elapsed_seconds"), 100 * r.series("test_accuracy"), "-o", ms=3,
                    color=cmap(i), label=label(r, args.fraction))  # fmt: skip
        ax.axhline(100 * args.target, color="black", lw=0.8, ls=":")
        sync = "gradients every step" if every == 0 else f"local SGD, models every {every} steps"
        ax.set(xlabel="seconds since the first epoch began", ylabel="test accuracy (%)",
               title=f"{sync}", ylim=(80, 100))  # fmt: skip
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"K = {args.workers}, NICs {args.rate}, placement {args.placement}; dotted: the target",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate", default="4mbit", help="every NIC's rate (tc units)")
    parser.add_argument("--multicast-rate", default="3800kbit", help="multicast's pacing")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument(
        "--chunk-bytes", type=int, default=8192,
        help="message payload: small enough that a relay pipelines an epoch of ~100 KiB",
    )  # fmt: skip
    parser.add_argument("--target", type=float, default=0.96, help="test accuracy to reach")
    parser.add_argument("--fraction", type=float, default=0.25, help="Q of the partial runs")
    parser.add_argument("--placement", default="by_label")
    parser.add_argument("--average-every", type=int, nargs="+", default=[1000, 0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench_time_to_accuracy")
    parser.add_argument("--plot", type=Path, help="test accuracy against seconds (PNG)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    if not 0 < args.target <= 1:
        parser.error(f"--target {args.target} out of range (0, 1]")
    print(
        f"emulated cluster: {args.workers} workers + master, NICs {args.rate} both ways; the "
        f"default job (digits, MLP) with placement {args.placement}, {args.epochs} epochs, "
        f"messages of {args.chunk_bytes} bytes, target test accuracy {args.target:g}; every "
        "epoch verified",
        flush=True,
    )
    results = []
    for every in args.average_every:
        for policy, scheme, transport in RUNS:
            results.append(run_one(args, every, policy, scheme, transport))
            print(f"  H={every} {policy}/{scheme}/{transport}: done", file=sys.stderr, flush=True)
    print("\n".join(table(results, args.target, args.fraction)))
    print("\n".join(partial_check(results, args.fraction)))
    if args.plot:
        plot(results, args.plot, args)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
