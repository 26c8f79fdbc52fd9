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
  and TCP headers included) over what the job counted;
* with ``--medium shared`` (one medium of ``--rate`` that every frame crosses once):
  ``medium/count``, what crossed the medium over the whole run (``cluster.json``) over the
  network bytes the job counted (every host's egress);
* ``cpu s/GB``: the costliest host's CPU seconds per GB through its NIC (median over the coded
  epochs; ``cpu_seconds_per_gb_max``);
* ``cpu use``: the hosts' CPU seconds in the delivery summed, over the delivery's seconds times
  the machine's cores (1.00: every core busy with the data path); ``bound`` says ``cpu`` where
  that share, or one host's own, is at least 0.85, else ``net``;
* with ``--predict``: ``predicted`` seconds from ``coded-shuffle predict``'s cost model for the
  same cluster (a switch, this MTU, the 14 framing bytes per frame that ``tc`` counts; the load
  planned on its own random shuffle, not read from the run) and ``pred/meas``.

Needs root (network namespaces). ``--plot FILE`` draws the delivery times. ``--cpu-hog``
runs a CPU-bound process beside the cluster for every run (the busy-machine case). ``--loss
SHARE``: every worker's host loses that share of the IP frames it receives, each at random, in
the kernel (``coded-shuffle cluster --host-loss``): TCP's segments as multicast's datagrams.

``--loopback`` measures the other end: every master-sourced transport without any ``tc``
limit between 2..5 local processes (``--processes``), beside a plain TCP stream of the same
bytes between the same processes in the same run (``scripts/loopback_ceiling.py``, run by
torchrun; no root needed): goodput in GB/s and its ratio to the raw stream.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coded_shuffle.costs.wire import DGRAM_HEADER_BYTES, REACH_DTYPE
from coded_shuffle.tools.cluster.jobs import job_argv, run_job
from coded_shuffle.tools.records import verified_records

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
        elif res.transport == "chain":  # the stream to the first worker and its reach table;
            # each message on as many links as it reaches (the master's model from the plan)
            model = (link + REACH_DTYPE.itemsize * r["messages"], r["network_bytes_model"])
        elif res.transport == "multicast":  # once, 20 B per datagram, repairs, parity, feedback
            datagram = r["transport_settings"]["datagram_bytes"]
            sent = link + DGRAM_HEADER_BYTES * math.ceil(link / datagram) + r["repair_bytes"]
            sent += r.get("parity_bytes", 0)
            workers_feedback = sum(r["host_egress_bytes"][1:])  # workers send feedback only
            model = (sent + control - workers_feedback, sent + control)
        elif res.transport == "unicast":  # each worker its own rows, from the master
            model = (uncoded, uncoded)
        elif res.transport == "p2p":  # the workers send what leaves them, the master nothing
            model = (0, uncoded)
        else:  # peer-unicast, peer-multicast: no byte model here (docs/decentralized.md)
            return math.nan
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


def medium_ratio(res: Result) -> float:
    """A shared medium's bytes over the whole run (Ethernet frames, the job's other traffic
    included) / the network bytes the job counted (every host's egress, every epoch)."""
    counted = sum(r["network_bytes"] for r in res.rows)
    crossed = res.cluster.get("medium", {}).get("bytes")
    return crossed / counted if crossed is not None and counted else math.nan


def cpu_use(res: Result) -> tuple[float, float]:
    """Median over coded epochs of (all hosts' delivery CPU / (seconds x cores), the largest
    one host's CPU / seconds)."""
    cores = res.cluster.get("machine_cpu", {}).get("cores") or os.cpu_count() or 1
    rows = [r for r in res.rows if r["phase"] == "coded"]
    machine = [sum(r["host_cpu_seconds"]) / (r["delivery_seconds"] * cores) for r in rows]
    host = [max(r["host_cpu_seconds"]) / r["delivery_seconds"] for r in rows]
    return float(np.median(machine)), float(np.median(host))


@contextlib.contextmanager
def cpu_hog(on: bool) -> Iterator[None]:
    """A process spinning on one core while the block runs (``--cpu-hog``)."""
    if not on:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def run_one(args: argparse.Namespace, k: int, scheme: str, transport: str) -> Result:
    run_dir = Path(args.out) / f"K{k}" / f"{scheme}-{transport}".replace("@", "-T")
    if run_dir.exists():
        shutil.rmtree(run_dir)
    name, _, storage = scheme.partition("@")  # SCHEME@T: storage T
    overrides = [
        f"scheme={name}",
        *([f"storage={storage}"] if storage else []),
        f"dist.transport={transport}",
        "data=synthetic",
        f"data.points={args.points}",
        f"data.features={args.features}",
        "model=logreg",
        f"epochs={args.epochs}",
        "optim.batch_size=1024",
        f"seed={args.seed}",
        f"hydra.run.dir={run_dir}",
        *args.set,
    ]
    losses = [f"{h}={args.loss}" for h in range(1, k + 1)] if args.loss else []
    argv = job_argv(
        k + 1,
        args.rate,
        args.medium,
        overrides,
        args.master_rate,
        args.mtu,
        args.host_rate,
        losses,
    )
    with cpu_hog(args.cpu_hog):
        run_job(argv, "bench_transport.py")
    rows = verified_records(run_dir, "bench_transport.py")
    cluster = json.loads((run_dir / "cluster.json").read_text())
    return Result(k, scheme, transport, rows, cluster)


HEADER = (
    f"{'K':>3} {'scheme':15s} {'transport':14s} {'load/unc':>8s} {'deliver s':>9s} "
    f"{'vs unicast':>10s} {'master MB':>9s} {'network MB':>10s} {'model':>7s} {'NIC/count':>9s} "
    f"{'cpu s/GB':>8s} {'cpu use':>7s} {'bound':>5s}"
)


def predicted_seconds(args: argparse.Namespace, res: Result) -> float:
    """``coded-shuffle predict``'s seconds for this row's cluster (the emulation: a switch or
    a shared medium, ``tc`` counting 14 framing bytes per frame)."""
    from coded_shuffle.costs.model import Network
    from coded_shuffle.costs.rates import parse_rate
    from coded_shuffle.costs.wire import ETHERNET_HEADER_BYTES
    from coded_shuffle.distributed.transports import transport_cost
    from coded_shuffle.tools.cli import worker_rates
    from coded_shuffle.tools.predict import Workload, planned_load

    key = (res.workers, res.scheme)
    name, _, storage = res.scheme.partition("@")
    rate = parse_rate(args.rate)
    master = parse_rate(args.master_rate) if args.master_rate else rate
    topology = "uplink" if args.medium == "switch" and master < rate else args.medium
    workers = worker_rates(args.host_rate, res.workers, rate)
    net = Network(topology, rate, master, args.mtu, ETHERNET_HEADER_BYTES, worker_rates=workers)
    net = net.behind_training(background_share(args, res))
    if key not in _LOADS:
        points = args.points - args.points % res.workers
        cluster = Workload(
            res.workers, points, 4 * args.features + 4, scheme=name, storage=float(storage or 1)
        )
        chain = args.medium == "shared" or bool(args.host_rate)
        _LOADS[key] = planned_load(cluster, chain, net.relay_order(res.workers))
    t, cost = _LOADS[key].traffic, transport_cost(res.transport)
    if name == "uncoded":
        return cost.seconds(t.uncoded_bytes, t, net, t.uncoded_reach)
    if name == "decentralized":
        return cost.seconds(cost.peer_stream(t), t, net)
    return cost.seconds(t.coded_bytes, t, net, t.coded_reach)


_LOADS: dict = {}


def background_share(args: argparse.Namespace, res: Result) -> float:
    """The share of its pace a paced stream (``multicast``, ``peer-multicast``) ran at in this
    row's run: ``dist.multicast.background_share`` where its coded epochs were delivered behind
    the training loop (the job's default, ``dist.prefetch``), else all of it; as ``coded-shuffle
    predict --job`` prices a prefetching job. Other transports do not read it."""
    from coded_shuffle.costs.model import BACKGROUND_SHARE

    if not any(row.get("prefetched") for row in res.rows if row["phase"] != "placement"):
        return 1.0
    key = "dist.multicast.background_share="
    given = [kv.removeprefix(key) for kv in args.set if kv.startswith(key)]
    return float(given[-1]) if given else BACKGROUND_SHARE


def table(results: list[Result], args: argparse.Namespace) -> list[str]:
    shared = args.medium == "shared"
    header = HEADER + (f" {'medium/count':>12s}" if shared else "")
    header += f" {'predicted':>9s} {'pred/meas':>9s}" if args.predict else ""
    lines = [header, "-" * len(header)]
    for k in sorted({r.workers for r in results}):
        mine = [r for r in results if r.workers == k]
        base = next(r for r in mine if (r.scheme, r.transport) == ("uncoded", "unicast"))
        for r in mine:
            ratio = r.median("load_points") / r.median("uncoded_points")
            seconds = r.median("delivery_seconds")
            machine, host = cpu_use(r)
            bound = "cpu" if max(machine, host) >= 0.85 else "net"
            lines.append(
                f"{k:>3} {r.scheme:15s} {r.transport:14s} {ratio:8.3f} {seconds:9.3f} "
                f"{seconds / base.median('delivery_seconds'):10.2f} "
                f"{r.median('master_egress_bytes') / 1e6:9.1f} "
                f"{r.median('network_bytes') / 1e6:10.1f} {model_deviation(r):6.2f}% "
                f"{nic_ratio(r):9.3f} {r.median('cpu_seconds_per_gb_max'):8.2f} "
                f"{machine:7.2f} {bound:>5s}"
                + (f" {medium_ratio(r):12.3f}" if shared else "")
                + (
                    f" {(p := predicted_seconds(args, r)):9.3f} {p / seconds:9.2f}"
                    if args.predict
                    else ""
                )
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
        ax.axhline(
            base.median("delivery_seconds"), color="black", lw=1, ls="--", label="uncoded unicast"
        )
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


LOOPBACK_HEADER = (
    f"{'P':>2} {'transport':14s} {'GB/s':>6s} {'raw GB/s':>8s} {'/raw':>5s} "
    f"{'master cpu s':>12s} {'worker cpu s':>12s}"
)


def loopback(args: argparse.Namespace) -> int:
    """Every master-sourced transport beside a raw TCP stream, 2..5 local processes."""
    script = Path(__file__).with_name("loopback_ceiling.py")
    print(
        f"loopback: no tc limit, {args.loopback_mbytes:g} MB stream of {args.point_bytes}-byte "
        f"rows to every worker, median of {args.repeats}; GB/s = bytes every worker received "
        "(summed) per second; raw = the same bytes over one plain TCP socket per worker",
        flush=True,
    )
    lines = [LOOPBACK_HEADER, "-" * len(LOOPBACK_HEADER)]
    for p in args.processes:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(p),
            str(script),
            "--mbytes",
            str(args.loopback_mbytes),
            "--point-bytes",
            str(args.point_bytes),
            "--repeats",
            str(args.repeats),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"bench_transport.py: error: loopback P={p}:\n{out.stderr[-2000:]}")
        rows = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
        raw = next(r for r in rows if r["transport"] == "raw tcp")
        raw_rate = raw["delivered_bytes"] / raw["seconds"] / 1e9
        for r in rows:
            rate = r["delivered_bytes"] / r["seconds"] / 1e9
            cpu = r["host_cpu_seconds"]
            lines.append(
                f"{p:>2} {r['transport']:14s} {rate:6.2f} {raw_rate:8.2f} {rate / raw_rate:5.2f} "
                f"{cpu[0]:12.3f} {max(cpu[1:]):12.3f}"
            )
        print(f"  P={p}: done", file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rate", default="400mbit", help="every NIC's rate (tc units)")
    parser.add_argument("--mtu", type=int, default=1500, help="the cluster's default")
    parser.add_argument(
        "--master-rate", help="the master's NIC rate (default --rate): a remote store"
    )
    parser.add_argument(
        "--medium",
        default="switch",
        choices=("switch", "shared"),
        help="the cluster's medium: every NIC on a switch, or one shared medium of --rate",
    )
    parser.add_argument("--points", type=int, default=20000)
    parser.add_argument("--features", type=int, default=500, help="points of 4*F+4 bytes")
    parser.add_argument(
        "--epochs",
        type=int,
        default=11,
        help="epoch 1 is the placement; the median runs over the rest (a process's first "
        "deliveries run on fresh memory: with 10 the median is the steady state)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench_transport", help="run directories")
    parser.add_argument("--plot", type=Path, help="bar chart of the delivery times (PNG)")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides for every run"
    )
    parser.add_argument(
        "--combos",
        nargs="+",
        metavar="SCHEME[@T]/TRANSPORT",
        default=[f"{s}/{t}" for s, t in COMBOS],
    )
    parser.add_argument(
        "--cpu-hog", action="store_true", help="a CPU-bound process beside the cluster"
    )
    parser.add_argument(
        "--loopback", action="store_true", help="no tc: transports against raw TCP, locally"
    )
    parser.add_argument(
        "--predict", action="store_true", help="predicted seconds (coded-shuffle predict) too"
    )
    parser.add_argument(
        "--host-rate",
        action="append",
        default=[],
        metavar="HOST=RATE",
        help="that host's NIC rate both ways (repeatable): an uneven cluster",
    )
    parser.add_argument(
        "--loss",
        type=float,
        default=0.0,
        help="every worker's host loses this share of the IP frames it receives, at random "
        "(coded-shuffle cluster --host-loss): every transport's loss",
    )
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 3, 4, 5])
    parser.add_argument("--loopback-mbytes", type=float, default=200.0)
    parser.add_argument("--point-bytes", type=int, default=2004, help="loopback row size")
    parser.add_argument("--repeats", type=int, default=3, help="loopback runs (median)")
    args = parser.parse_args(argv)
    if args.loopback:
        if any(not 2 <= p <= 5 for p in args.processes):
            parser.error(f"--processes {args.processes}: each must be in 2..5")
        return loopback(args)
    combos = [tuple(c.split("/", 1)) for c in args.combos]
    if ("uncoded", "unicast") not in combos:
        parser.error("the combos must include uncoded/unicast (the baseline of 'vs unicast')")
    medium = "a shared medium" if args.medium == "shared" else "a switch"
    print(
        f"emulated cluster: K+1 hosts on {medium}, NICs {args.rate} both ways"
        + (f" (the master's {args.master_rate})" if args.master_rate else "")
        + "".join(f", host {h.replace('=', ' at ')}" for h in args.host_rate)
        + (f", every worker losing {args.loss:g} of what it receives" if args.loss else "")
        + f", MTU {args.mtu}; "
        f"{args.points} points of {4 * args.features + 4} bytes, {args.epochs - 1} coded epochs "
        f"(median); every epoch verified{'; a CPU-bound process beside' if args.cpu_hog else ''}",
        flush=True,
    )
    results = []
    for k in args.workers:
        for scheme, transport in combos:
            results.append(run_one(args, k, scheme, transport))
            print(f"  K={k} {scheme}/{transport}: done", file=sys.stderr, flush=True)
    print("\n".join(table(results, args)))
    if args.plot:
        plot(results, args.plot, args.rate)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
