#!/usr/bin/env python3
"""What coding buys in training: seconds and bytes to a target accuracy, on the emulated
cluster, against what a user would do instead.

Every run is the training job on ``coded-shuffle cluster --hosts K+1`` (one network namespace
per host, every NIC limited to ``--rate`` both ways; ``--medium shared``: one medium of
``--rate`` that every host's frames cross, the papers' shared link) with skewed shards
(``data.placement=by_label``: every worker starts with a few classes) and a synchronisation
(``optim.average_every``: ``0`` averages the gradients at every step, ``H`` runs local SGD and
averages the models every ``H`` steps and at every epoch's end). Per synchronisation it runs
the shuffle policies a user chooses between, each delivered the ways that can carry it:

* ``full`` coded (``cycles``) over ``chain`` and ``multicast``; ``full`` uncoded over
  ``unicast`` (the master sends each worker its points) and ``p2p`` (workers exchange);
* ``partial`` (``Q = --fraction``) coded over ``chain`` and ``multicast``, uncoded over
  ``unicast`` and ``p2p``;
* ``none`` (no global reshuffle: no byte after the placement).

``--big-gb G`` adds the reshuffle-bound runs: a synthetic set of ``G`` GB packed by
``coded-shuffle pack`` into a temporary directory (removed after), logistic regression on it
(``data=file``, memory-mapped) at ``--big-rate`` (multicast paced at
``--big-multicast-rate``, by default the cluster's 0.99 of the NICs): full reshuffles coded
over ``multicast`` and uncoded over ``unicast``, ``p2p`` and ``multicast``; ``partial``
coded (multicast) and uncoded (unicast); ``none``. Every full delivery trains the same
parameters (same seed), so those runs reach the same accuracy at the same epoch. Its table
gives per run every epoch's seconds, the seconds to the end against the best uncoded full
run, the placement and the slowest reshuffle against ``unicast``'s, the costliest host's CPU
seconds per GB, the largest anonymous memory of a host, and what the cheaper shuffles give
up (``coverage_min``, ``label_tv_max`` after the last epoch).

Every run prefetches (``dist.prefetch``, the job's default: epoch ``e + 1``'s delivery runs
while the workers train on epoch ``e``), the uncoded alternatives too; ``--blocking`` runs
every big run a second time with ``dist.prefetch=false`` (each epoch's delivery waits for the
training before it), beside. ``--balanced-step S`` adds the balanced runs: the same set, but
every minibatch step holds its worker ``S`` seconds more without using the host's CPU or
network (``debug.step_delay``: the steps of a model on an accelerator, which this machine has
not), so that an epoch's steps take about as long as a coded delivery; coded ``multicast``
against uncoded ``unicast``, ``p2p`` and ``multicast``, each prefetching and blocking
(minibatches of ``--balanced-batch``: few steps, each a heavy one, as on an accelerator). The
big tables add per run the steps' and the wait's seconds (medians over the reshuffles) and
the overlap realized: the seconds from the end of the placement to the end over the sum of
``max(steps of e - 1, delivery of e)`` and the last epoch's steps.

``--remote-store MASTER_RATE`` adds the remote-store runs (docs/decentralized.md): the master,
where the data lives, behind ``MASTER_RATE``, the workers on a shared medium of
``--remote-rate``, logistic regression on a synthetic set; the workers' own decentralized
delivery (``decentralized`` at ``T = 2``) over ``peer-multicast`` and ``peer-unicast`` beside
uncoded ``p2p``, coded ``multicast`` and uncoded ``unicast`` from the master; the same
per-epoch table.

It prints per run the final test accuracy, the epochs, seconds (``elapsed_seconds``: since the
first epoch began) and shuffle bytes (network, master) to ``--target``, the seconds ratio
against ``full`` uncoded ``unicast`` of the same synchronisation, the share of an epoch that
delivery takes, and the load against the run's own uncoded load; ``--plot FILE`` draws test
accuracy against seconds. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coded_shuffle.costs.model import PACE_SHARE
from coded_shuffle.tools.cluster.jobs import job_argv, run_job
from coded_shuffle.tools.records import verified_records

CALLER = "bench_time_to_accuracy.py"  # how its errors name it

RUNS = (  # policy, scheme, transport
    ("full", "cycles", "chain"),
    ("full", "cycles", "multicast"),
    ("full", "uncoded", "unicast"),
    ("full", "uncoded", "p2p"),
    ("partial", "cycles", "chain"),
    ("partial", "cycles", "multicast"),
    ("partial", "uncoded", "unicast"),
    ("partial", "uncoded", "p2p"),
    ("none", "uncoded", "unicast"),
)
BASELINE = ("full", "uncoded", "unicast")
REMOTE_RUNS = (  # policy, scheme[@T], transport: the master behind a slower link
    ("full", "decentralized@2", "peer-multicast"),
    ("full", "decentralized@2", "peer-unicast"),
    ("full", "uncoded", "p2p"),
    ("full", "cycles", "multicast"),
    ("full", "uncoded", "unicast"),
)
BIG_RUNS = (  # policy, scheme, transport: the reshuffle-bound runs
    ("full", "cycles", "multicast"),
    ("full", "uncoded", "unicast"),
    ("full", "uncoded", "p2p"),
    ("full", "uncoded", "multicast"),
    ("partial", "cycles", "multicast"),
    ("partial", "uncoded", "unicast"),
    ("none", "uncoded", "unicast"),
)


BALANCED_RUNS = (  # the balanced runs: full reshuffles
    ("full", "cycles", "multicast"),
    ("full", "uncoded", "unicast"),
    ("full", "uncoded", "p2p"),
    ("full", "uncoded", "multicast"),
)


@dataclass
class Result:
    average_every: int
    policy: str
    scheme: str
    transport: str
    rows: list[dict]
    prefetch: bool = True

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

    def overlap(self) -> float:
        """The seconds from the end of the placement to the end, over the sum of
        ``max(steps of e - 1, delivery of e)`` for every reshuffle ``e`` and the last epoch's
        steps: 1.0 where every delivery hid behind the steps before it (or they behind it)."""
        steps, deliver = self.series("train_seconds"), self.series("delivery_seconds")
        span = self.series("elapsed_seconds")[-1] - self.series("wait_seconds")[0]
        ideal = float(np.sum(np.maximum(steps[:-1], deliver[1:])) + steps[-1])
        return span / ideal


def cluster(
    args: argparse.Namespace,
    rate: str,
    run_dir: Path,
    overrides: list[str],
    master_rate: str | None = None,
) -> list:
    """One training job on the emulated cluster (the master's NIC at ``master_rate`` if
    given); its metrics (every epoch verified). With ``--reuse``, a finished run already in
    ``run_dir`` (every epoch recorded) is read instead."""
    if args.reuse and (run_dir / "summary.json").is_file():
        return verified_records(run_dir, CALLER)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    job = [f"hydra.run.dir={run_dir}", f"seed={args.seed}", *overrides, *args.set]
    run_job(job_argv(args.workers + 1, rate, args.medium, job, master_rate), CALLER)
    return verified_records(run_dir, CALLER)


def delivery(scheme: str, transport: str, policy: str, args: argparse.Namespace) -> list[str]:
    name, _, storage = scheme.partition("@")  # SCHEME@T: storage T
    overrides = [f"scheme={name}", f"dist.transport={transport}", f"shuffle={policy}"]
    overrides += [f"storage={storage}"] if storage else []
    if policy == "partial":
        overrides.append(f"shuffle.fraction={args.fraction}")
    return overrides


def run_one(args: argparse.Namespace, every: int, policy: str, scheme: str, transport: str):
    overrides = [
        *delivery(scheme, transport, policy, args),
        f"data.placement={args.placement}",
        f"optim.average_every={every}",
        f"epochs={args.epochs}",
        f"dist.chunk_bytes={args.chunk_bytes}",
    ]
    if transport == "multicast":
        overrides.append(f"dist.multicast.rate={args.multicast_rate}")
    run_dir = Path(args.out) / f"H{every}" / f"{policy}-{scheme}-{transport}"
    return Result(every, policy, scheme, transport, cluster(args, args.rate, run_dir, overrides))


def big_pacing(args: argparse.Namespace) -> str:
    """What multicast is paced at in the big runs, as the table's title says it."""
    if args.big_multicast_rate:
        return args.big_multicast_rate
    return f"{PACE_SHARE:g} of {args.big_rate} (the cluster's default)"


def run_big(
    args: argparse.Namespace,
    packed: Path,
    run: tuple[str, str, str],
    prefetch: bool = True,
    step: float = 0.0,
) -> Result:
    """Logistic regression on the packed set larger than memory (``step``: seconds every
    minibatch step holds its worker besides its work; then minibatches of
    ``--balanced-batch``)."""
    policy, scheme, transport = run
    overrides = [
        *delivery(scheme, transport, policy, args),
        f"dist.prefetch={str(prefetch).lower()}",
        f"debug.step_delay={step}",
        "data=file",
        f"data.path={packed}",
        "model=logreg",
        f"epochs={args.big_epochs}",
        f"optim.batch_size={args.balanced_batch if step else 512}",
        "optim.lr=0.01",
        f"dist.store_dir={Path(args.out) / 'big-stores'}",
    ]
    if transport == "multicast" and args.big_multicast_rate:
        overrides.append(f"dist.multicast.rate={args.big_multicast_rate}")
    kind = ("balanced" if step else "big") + ("" if prefetch else "-blocking")
    run_dir = Path(args.out) / kind / f"{policy}-{scheme}-{transport}"
    try:
        rows = cluster(args, args.big_rate, run_dir, overrides)
        end = rows[-1]["elapsed_seconds"]
        print(f"  {kind} {policy}/{scheme}/{transport}: {end:.1f} s", file=sys.stderr, flush=True)
        return Result(0, policy, scheme, transport, rows, prefetch)
    finally:
        shutil.rmtree(Path(args.out) / "big-stores", ignore_errors=True)


def remote(args: argparse.Namespace) -> list[Result]:
    """``--remote-store MASTER_RATE``: the workers on a shared medium of ``--remote-rate``,
    the master (the data's store) behind ``MASTER_RATE``; logistic regression on a synthetic
    set, every option of :data:`REMOTE_RUNS`."""
    print(
        f"remote store: {args.workers} workers on a shared {args.remote_rate} medium, the "
        f"master behind {args.remote_store}; {args.remote_points:,} synthetic points of "
        f"{4 * args.remote_features + 4} bytes, logreg, {args.remote_epochs} epochs; multicast "
        "paced at 99% of the sender's NIC",
        flush=True,
    )
    results = []
    for policy, scheme, transport in REMOTE_RUNS:
        overrides = [
            *delivery(scheme, transport, policy, args),
            "data=synthetic",
            f"data.points={args.remote_points}",
            f"data.features={args.remote_features}",
            "model=logreg",
            f"epochs={args.remote_epochs}",
            "optim.batch_size=1024",
        ]
        run_dir = Path(args.out) / "remote" / f"{policy}-{scheme}-{transport}"
        rows = cluster(args, args.remote_rate, run_dir, overrides, args.remote_store)
        results.append(Result(0, policy, scheme, transport, rows))
        print(f"  remote {policy}/{scheme}/{transport}: done", file=sys.stderr, flush=True)
    return results


def big(args: argparse.Namespace) -> tuple[list[Result], list[Result]]:
    """``--big-gb``: pack the set into a temporary directory, train on it (the big runs,
    prefetching and with ``--blocking`` blocking; with ``--balanced-step`` the balanced
    runs), remove it."""
    work = Path(tempfile.mkdtemp(prefix="bench-tta-big-", dir=args.big_dir))
    try:
        record = 4 * args.big_features + 4
        points = int(args.big_gb * 1e9 // record)
        packed = work / "set"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "coded_shuffle_train.pack",
                str(packed),
                "--",
                "data=synthetic",
                f"data.points={points}",
                f"data.features={args.big_features}",
                "data.test_points=2000",
                f"seed={args.seed}",
            ],
            check=True,
            capture_output=True,
        )
        size = sum(f.stat().st_size for f in packed.glob("*.npy"))
        print(
            f"larger than memory: {points:,} synthetic points of {record} bytes ({size / 1e9:.2f}"
            f" GB on disk, memory-mapped), logreg, {args.big_epochs} epochs, NICs and medium "
            f"{args.big_rate} ({args.medium}), multicast paced at {big_pacing(args)}",
            flush=True,
        )
        modes = (True, False) if args.blocking else (True,)
        results = [run_big(args, packed, run, mode) for mode in modes for run in BIG_RUNS]
        balanced = []
        if args.balanced_step:
            step = args.balanced_step
            balanced = [
                run_big(args, packed, run, mode, step)
                for mode in (True, False)
                for run in BALANCED_RUNS
            ]
        return results, balanced
    finally:
        shutil.rmtree(work, ignore_errors=True)


def label(r: Result, fraction: float) -> str:
    policy = f"partial{fraction:g}" if r.policy == "partial" else r.policy
    return f"{policy}/{r.scheme}/{r.transport}" + ("" if r.prefetch else " blocking")


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


def epoch_table(results: list[Result], fraction: float) -> list[str]:
    """Per run: every epoch's seconds (``epoch_seconds``), the seconds to the end
    (``elapsed_seconds``) over the best uncoded full run's, its placement and its slowest
    reshuffle against uncoded ``unicast``'s, the costliest host's CPU seconds per GB (median
    over the reshuffles), the largest anonymous memory of any host, and the mixing after the
    last epoch; then the test accuracy of every epoch (the full runs: the same parameters)."""
    full = [r for r in results if r.policy == "full"]
    ahead = [r for r in full if r.prefetch] or full  # the best uncoded run a user would run
    best = min(r.series("elapsed_seconds")[-1] for r in ahead if r.scheme == "uncoded")
    unicast = next(r for r in ahead if r.transport == "unicast").series("delivery_seconds")
    epochs = len(results[0].rows)
    head = f"{'run':45s} " + " ".join(f"{f'e{e}':>6s}" for e in range(1, epochs + 1))
    head += (
        f" {'to end':>7s} {'vs best':>7s} {'place/u':>7s} {'reshuf/u':>8s} {'steps s':>7s}"
        f" {'wait s':>6s} {'overlap':>7s} {'cpu s/GB':>8s} {'anon MB':>7s} {'coverage':>8s}"
        f" {'label tv':>8s}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        seconds, deliver = r.series("epoch_seconds"), r.series("delivery_seconds")
        reshuffle = np.max(deliver[1:] / unicast[1:]) if r.policy == "full" else np.nan
        anon = max(max(row.get("host_anon_bytes", [0])) for row in r.rows)
        end, last = r.series("elapsed_seconds")[-1], r.rows[-1]
        cells = [
            f"{label(r, fraction):45s}",
            *(f"{s:6.1f}" for s in seconds),
            f"{end:7.1f}",
            f"{end / best:7.2f}",
            f"{deliver[0] / unicast[0]:7.2f}",
            f"{reshuffle:8.2f}",
            f"{r.later('train_seconds'):7.2f}",
            f"{r.later('wait_seconds'):6.2f}",
            f"{r.overlap():7.2f}",
            f"{r.later('cpu_seconds_per_gb_max'):8.2f}",
            f"{anon / 1e6:7.0f}",
            f"{last['coverage_min']:8.3f}",
            f"{last['label_tv_max']:8.3f}",
        ]
        lines.append(" ".join(cells))
    accuracy = full[0].series("test_accuracy")
    same = all(np.array_equal(r.series("test_accuracy"), accuracy) for r in full)
    lines.append(
        "test accuracy at every epoch (full): "
        + ", ".join(f"{a:.4f}" for a in accuracy)
        + (" (every full run the same)" if same else " (the full runs differ)")
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


def verdicts(results: list[Result], target: float) -> list[str]:
    """Per synchronisation: the fastest run to ``target``; coded full (the faster of its
    transports) against the best uncoded full alternative; coded ``partial`` over multicast
    against uncoded ``partial``."""
    out = []
    for every in sorted({r.average_every for r in results}):
        mine = {r.key: r for r in results if r.average_every == every}
        reached = {k: t[1] for k, r in mine.items() if (t := r.to_target(target)) is not None}
        if not reached:
            out.append(f"H={every}: no run reached {target:g}")
            continue
        best = min(reached, key=reached.get)
        line = f"H={every}: fastest to {target:g}: {'/'.join(best)} ({reached[best]:.2f} s)"
        for policy, coded, uncoded in (
            ("full", ("chain", "multicast"), ("unicast", "p2p")),
            ("partial", ("multicast",), ("unicast", "p2p")),
        ):
            c = [
                reached[k]
                for k in reached
                if k[0] == policy and k[1] != "uncoded" and k[2] in coded
            ]
            u = [
                reached[k]
                for k in reached
                if k[0] == policy and k[1] == "uncoded" and k[2] in uncoded
            ]
            if c and u:
                line += f"; coded {policy} {min(c) / min(u):.2f}x the best uncoded {policy}"
        out.append(line)
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
            ax.plot(
                r.series("elapsed_seconds"),
                100 * r.series("test_accuracy"),
                "-o",
                ms=3,
                color=cmap(i),
                label=label(r, args.fraction),
            )
        ax.axhline(100 * args.target, color="black", lw=0.8, ls=":")
        sync = "gradients every step" if every == 0 else f"local SGD, models every {every} steps"
        ax.set(
            xlabel="seconds since the first epoch began",
            ylabel="test accuracy (%)",
            title=f"{sync}",
            ylim=(80, 100),
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"K = {args.workers}, NICs {args.rate}, placement {args.placement}; dotted: the target",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_big(results: list[Result], path: Path, args: argparse.Namespace) -> None:
    """The reshuffle-bound runs: seconds since the first epoch began at the end of every
    epoch, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.4))
    cmap = plt.get_cmap("tab10")
    for i, r in enumerate(results):
        epochs = np.arange(1, len(r.rows) + 1)
        style = "-o" if r.scheme != "uncoded" else "--s"
        seconds = r.series("elapsed_seconds")
        ax.plot(epochs, seconds, style, ms=3, color=cmap(i), label=label(r, args.fraction))
    title = f"{args.big_gb:g} GB, K = {args.workers}, {args.medium} medium {args.big_rate}"
    ax.set(xlabel="epoch (1: the placement)", ylabel="seconds since the first epoch began")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
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
        "--chunk-bytes",
        type=int,
        default=8192,
        help="message payload: small enough that a relay pipelines an epoch of ~100 KiB",
    )
    parser.add_argument("--target", type=float, default=0.96, help="test accuracy to reach")
    parser.add_argument("--fraction", type=float, default=0.25, help="Q of the partial runs")
    parser.add_argument("--placement", default="by_label")
    parser.add_argument("--average-every", type=int, nargs="+", default=[1000, 0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench_time_to_accuracy")
    parser.add_argument("--plot", type=Path, help="test accuracy against seconds (PNG)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--medium",
        default="switch",
        choices=("switch", "shared"),
        help="every NIC on a switch, or one shared medium of --rate (the papers' link)",
    )
    parser.add_argument("--big-gb", type=float, default=0.0, help="a set larger than memory")
    parser.add_argument("--big-rate", default="400mbit", help="NICs and medium of the big runs")
    parser.add_argument("--big-epochs", type=int, default=6)
    parser.add_argument(
        "--big-multicast-rate",
        help="multicast's pacing in the big runs (default: the cluster's, 0.99 of the NICs)",
    )
    parser.add_argument("--big-features", type=int, default=2000, help="records of 4*F+4 bytes")
    parser.add_argument("--big-dir", type=Path, default=None, help="where the big set is packed")
    parser.add_argument(
        "--blocking", action="store_true", help="every big run also without prefetch, beside"
    )
    parser.add_argument(
        "--balanced-step",
        type=float,
        default=0.0,
        help="the balanced runs: seconds a minibatch step holds its worker (an accelerator's)",
    )
    parser.add_argument(
        "--balanced-batch", type=int, default=2048, help="the balanced runs' minibatch"
    )
    parser.add_argument(
        "--remote-store",
        metavar="MASTER_RATE",
        help="the remote-store runs: the master behind this rate (e.g. 50mbit)",
    )
    parser.add_argument("--remote-rate", default="200mbit", help="the workers' shared medium")
    parser.add_argument("--remote-points", type=int, default=20000)
    parser.add_argument("--remote-features", type=int, default=500)
    parser.add_argument("--remote-epochs", type=int, default=6)
    parser.add_argument("--skip-digits", action="store_true", help="only the big runs")
    parser.add_argument("--big-plot", type=Path, help="the big runs' seconds per epoch (PNG)")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="read the finished runs already in --out instead of running them again",
    )
    args = parser.parse_args(argv)
    if not 0 < args.target <= 1:
        parser.error(f"--target {args.target} out of range (0, 1]")
    results = []
    if not args.skip_digits:
        print(
            f"emulated cluster: {args.workers} workers + master on a {args.medium} medium, NICs "
            f"{args.rate} both ways; the default job (digits, MLP) with placement "
            f"{args.placement}, {args.epochs} epochs, messages of {args.chunk_bytes} bytes, "
            f"target test accuracy {args.target:g}; every epoch verified",
            flush=True,
        )
        for every in args.average_every:
            for policy, scheme, transport in RUNS:
                results.append(run_one(args, every, policy, scheme, transport))
                done = f"{policy}/{scheme}/{transport}"
                print(f"  H={every} {done}: done", file=sys.stderr, flush=True)
        print("\n".join(table(results, args.target, args.fraction)))
        print("\n".join(partial_check(results, args.fraction)))
        print("\n".join(verdicts(results, args.target)))
    if args.remote_store:
        print("\n".join(epoch_table(remote(args), args.fraction)))
    if args.big_gb > 0:
        large, balanced = big(args)
        print("\n".join(epoch_table(large, args.fraction)))
        if balanced:
            print(
                f"balanced: minibatches of {args.balanced_batch}, every step held "
                f"{args.balanced_step:g} s more (an accelerator's, not the host's CPU)"
            )
            print("\n".join(epoch_table(balanced, args.fraction)))
        if args.big_plot:
            plot_big([r for r in large if r.prefetch], args.big_plot, args)
            print(f"wrote {args.big_plot}")
    if args.plot and results:
        plot(results, args.plot, args)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
