"""The ``coded-shuffle`` command (docs/command.md): evaluate, predict, cluster, pack, schemes,
transports."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from coded_shuffle.distributed.fault_kinds import FAULTS, fault_kinds
from coded_shuffle.errors import UndecodableError, UsageError, VerificationError
from coded_shuffle.math.schemes import REGISTRY
from coded_shuffle.version import __version__

if TYPE_CHECKING:  # the commands import what they run: `--help` and `schemes` load no torch
    from coded_shuffle.tools.evaluate import EpochReport, Evaluation


PACK_PHOTOS = (  # one command: a folder of images of any size, one subfolder per class
    "coded-shuffle pack runs/photos -- data=dataset "
    "data.dataset._target_=coded_shuffle_train.datasets.ImageFolder +data.dataset.root=photos "
    "'data.item_transform={_target_:coded_shuffle_train.datasets.ResizeCrop,size:32}'"
)
PACK_EXAMPLES = f"""examples:
  coded-shuffle pack runs/synthetic -- data=synthetic data.points=100000 data.features=500
  coded-shuffle pack runs/digits -- data=dataset
  {PACK_PHOTOS}

A user's own map-style Dataset class: data.dataset._target_=pkg.module.Class (and
+data.dataset.ARG=VALUE for each of its arguments); items are (input, label) pairs or dicts,
inputs tensors, NumPy arrays, numbers or PIL images of one size (else data.item_transform)."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line, without the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="coded-shuffle", description="Coded data shuffling: plan, encode, decode, measure."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_evaluate(sub)
    _add_predict(sub)
    sub.add_parser("schemes", help="list the registered schemes")
    sub.add_parser("transports", help="list the registered transports")
    _add_cluster(sub)
    pk = sub.add_parser(
        "pack",
        help="write a data set the job takes as memory-mapped .npy files (data=file data.path=DIR)",
        description="OUT_DIR gets X.npy, y.npy, X_test.npy and y_test.npy from the data source "
        "that the overrides after -- configure (as for the training job), written in blocks "
        "with bounded memory and a progress line; the job reads it with data=file "
        "data.path=OUT_DIR, an own loop with coded_shuffle.PackedDataset(OUT_DIR).",
        epilog=PACK_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pk.add_argument("out", type=Path, help="the directory to write (must not exist, or be empty)")
    pk.add_argument("args", nargs=argparse.REMAINDER, help="-- then the data overrides")
    return parser


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "evaluate", help="run a scheme on random bytes and verify every worker's decode"
    )
    ev.add_argument("--scheme", required=True, help=f"one of: {', '.join(sorted(REGISTRY))}")
    ev.add_argument("--workers", "-K", type=int, required=True, help="number of workers K")
    ev.add_argument(
        "--points", "-N", type=int, required=True, help="number of points N (a multiple of K)"
    )
    ev.add_argument(
        "--storage", "-T", type=float, default=1.0, help="storage per worker in batches, 1..K"
    )
    ev.add_argument(
        "--epochs", "-E", type=int, default=1, help="epoch transitions to run (default 1)"
    )
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument(
        "--point-bytes",
        "-B",
        type=int,
        default=None,
        help="bytes per point (default: the smallest size >= 64 at which T is exact)",
    )
    ev.add_argument(
        "--shuffle",
        default="random",
        help="random (default); cyclic: every batch to the next worker; worst: per epoch the "
        "candidate with the largest load (every cycle type of a whole-batch permutation, "
        "every batch split over the others, random ones), named in the output",
    )
    ev.add_argument(
        "--old", type=Path, help="initial assignment (.npy, length N, worker ids 0..K-1)"
    )
    ev.add_argument("--new", type=Path, help="next assignment (.npy), with --old")
    ev.add_argument("--json", action="store_true", help="one JSON object per line per transition")


# predict's cluster flags and their defaults (one source for the parser and the check that
# --job refuses them: the job's overrides give them instead)
NOT_WITH_JOB = {
    "workers": None,
    "points": None,
    "point_bytes": None,
    "storage": 1.0,
    "scheme": "cycles",
    "fraction": 1.0,
    "topology": "switch",
    "peer_seconds": None,
    "chunk_bytes": 256 << 10,
    "seed": 0,
}


def _add_predict(sub: argparse._SubParsersAction) -> None:
    pr = sub.add_parser(
        "predict",
        help="predict every transport's delivery seconds for a described cluster, or (--job) "
        "a whole training run's seconds beside its alternatives",
        description="A coded and an uncoded epoch over every transport, from the transports' "
        "cost models and the scheme's load on a random shuffle (docs/transports.md). With "
        "--job -- OVERRIDES: the seconds to every epoch of the run that `coded-shuffle cluster "
        "--rate R --medium M -- OVERRIDES` would run, and of every alternative to it.",
    )
    pr.add_argument(
        "--job",
        action="store_true",
        help="price the training job that the overrides after -- describe (as for cluster)",
    )
    pr.add_argument("--workers", "-K", type=int, help="number of workers K (not with --job)")
    pr.add_argument("--points", "-N", type=int, help="points N (a multiple of K; not with --job)")
    pr.add_argument("--point-bytes", "-B", type=int, help="bytes per point (not with --job)")
    pr.add_argument("--rate", required=True, help="every worker's NIC rate, e.g. 10gbit")
    pr.add_argument("--master-rate", help="the master's NIC rate (default: --rate)")
    pr.add_argument(
        "--host-rate",
        action="append",
        default=[],
        metavar="HOST=RATE",
        help="worker HOST's NIC rate (1..K, repeatable), as coded-shuffle cluster --host-rate: "
        "an uneven cluster",
    )
    pr.add_argument(
        "--storage",
        "-T",
        type=float,
        default=NOT_WITH_JOB["storage"],
        help="storage per worker in batches, 1..K",
    )
    pr.add_argument(
        "--scheme", default=NOT_WITH_JOB["scheme"], help="the coded scheme (default cycles)"
    )
    pr.add_argument(
        "--fraction",
        type=float,
        default=NOT_WITH_JOB["fraction"],
        help="a partial reshuffle: every worker gives up this share of its batch (0, 1]; "
        "default 1, a full one",
    )
    pr.add_argument(
        "--topology",
        default=NOT_WITH_JOB["topology"],
        help="switch (full bisection, default) | shared (one medium of --rate) | uplink (a "
        "master behind a slower link: --master-rate below --rate)",
    )
    pr.add_argument(
        "--medium",
        default="switch",
        help="--job: switch (default) | shared, as coded-shuffle cluster --medium",
    )
    pr.add_argument("--mtu", type=int, default=1500, help="MTU of every NIC (default 1500)")
    pr.add_argument(
        "--peer-seconds",
        type=float,
        default=None,
        help="p2p: seconds per peer a worker exchanges with (default: calibrated on the "
        "emulated cluster)",
    )
    pr.add_argument(
        "--chunk-bytes", type=int, default=NOT_WITH_JOB["chunk_bytes"], help="payload per message"
    )
    pr.add_argument("--seed", type=int, default=NOT_WITH_JOB["seed"])
    pr.add_argument("--json", action="store_true", help="one JSON object per row")
    pr.add_argument("args", nargs=argparse.REMAINDER, help="--job: -- then the job's overrides")


def _add_cluster(sub: argparse._SubParsersAction) -> None:
    cl = sub.add_parser(
        "cluster",
        help="run the training job (or a torchrun script) on an emulated cluster of hosts",
        description="One network namespace per host, NICs limited by tc, one torchrun node "
        "per host. Needs root. Everything it creates is removed on exit.",
    )
    cl.add_argument("--hosts", type=int, help="hosts P (host 0 runs the master)")
    cl.add_argument("--rate", help="every NIC's rate in both directions, e.g. 400mbit")
    cl.add_argument("--master-rate", help="host 0's NIC rate (default: --rate)")
    cl.add_argument(
        "--host-rate",
        action="append",
        metavar="HOST=RATE",
        help="that host's NIC rate both ways (repeatable), e.g. 3=200mbit",
    )
    cl.add_argument(
        "--host-loss",
        action="append",
        metavar="HOST=SHARE",
        help="that host loses this share of the IP frames it receives, each at random "
        "(repeatable), e.g. 2=0.01",
    )
    cl.add_argument(
        "--host-procs",
        action="append",
        metavar="HOST=N",
        help="processes on that host (repeatable; default 1; the job's workers follow: every "
        "process but the master, dist.master_rank, is a worker), e.g. 1=2",
    )
    cl.add_argument(
        "--medium",
        default="switch",
        help="switch (default: every NIC on a switch) | shared (one medium of --rate that "
        "every frame of every host crosses once, a multicast frame once: the papers' link)",
    )
    cl.add_argument("--mtu", type=int, default=1500, help="MTU of every NIC (default 1500)")
    cl.add_argument(
        "--grace", type=float, default=30.0, help="seconds the others get after a host fails"
    )
    cl.add_argument("--logs", type=Path, help="where every host's log goes")
    _add_cluster_faults(cl)
    cl.add_argument("--script", type=Path, help="run this torchrun script instead of the job")
    cl.add_argument(
        "--cleanup", action="store_true", help="remove clusters left by killed runs, then exit"
    )
    cl.add_argument(
        "--dry-run", action="store_true", help="check everything, print what would run, exit"
    )
    cl.add_argument("args", nargs=argparse.REMAINDER, help="-- then overrides or script args")


def _add_cluster_faults(cl: argparse.ArgumentParser) -> None:
    """``coded-shuffle cluster``'s faults: a ``--NAME HOST@WHEN`` flag for every kind the
    cluster puts in (the registry, :data:`~coded_shuffle.distributed.fault_kinds.FAULTS`), and
    ``--min-hosts`` (an elastic cluster, which ``--lose`` needs) and ``--heal``."""
    for name in fault_kinds("cluster"):
        cl.add_argument(
            f"--{name}",
            action="append",
            default=[],
            metavar="HOST@WHEN",
            help=f"{FAULTS[name].does}. WHEN: seconds after the start (2@30), once the job "
            "recorded epoch N (2@e2), or D seconds after that (2@e2+0.5: inside epoch N + 1)",
        )
    cl.add_argument(
        "--min-hosts",
        type=int,
        help="elastic nodes: torchrun --nnodes MIN:P with c10d rendezvous at host 0; after a "
        "failure the job starts again with the hosts that are left (at least MIN)",
    )
    cl.add_argument(
        "--heal",
        type=float,
        metavar="SECONDS",
        help="a cut or stopped host comes back SECONDS after its fault: link up, processes "
        "killed and (with dist.max_restarts > 0) started again",
    )


def _load_assignment(path: Path, name: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{name}: cannot read {str(path)!r} as a .npy integer array ({exc})"
        ) from None


def evaluation_from_args(args: argparse.Namespace) -> Evaluation:
    """Turns parsed arguments into an :class:`Evaluation` (validated user assignments)."""
    from coded_shuffle.math.assignment import batch_size, validate_assignment
    from coded_shuffle.tools.evaluate import Evaluation

    old = new = None
    if (args.old is None) != (args.new is None):
        raise UsageError("--old and --new go together: give both files or neither")
    if args.old is not None:
        if args.epochs != 1:
            raise UsageError(
                f"--old/--new describe one transition; --epochs must be 1, got {args.epochs}"
            )
        batch_size(args.points, args.workers)
        old = validate_assignment(
            _load_assignment(args.old, "--old"), args.points, args.workers, "--old"
        )
        new = validate_assignment(
            _load_assignment(args.new, "--new"), args.points, args.workers, "--new"
        )
    return Evaluation(
        scheme=args.scheme,
        workers=args.workers,
        points=args.points,
        storage=args.storage,
        epochs=args.epochs,
        seed=args.seed,
        point_bytes=args.point_bytes,
        shuffle=args.shuffle,
        old=old,
        new=new,
    )


def _human_line(r: EpochReport) -> str:
    saved = 100.0 * (1 - r.load_points / r.uncoded_points) if r.uncoded_points else 0.0
    bound = f"{r.lower_bound_points:g}{'' if r.lower_bound_exact else ' (local search)'}"
    parts = ", ".join(f"{k} {v:g}" for k, v in r.breakdown.items())
    if r.pairs_only_points is not None:
        parts += f"; pairs-only load {r.pairs_only_points:g}"
    shift = (
        f" [{r.point_bytes}-byte points store T = {r.storage_used:.6g}, not {r.storage:g}: "
        "bytes moved to another corner]"
        if r.storage_shifted
        else ""
    )
    attained = f" on the worst shuffle found ({r.worst_shuffle})" if r.worst_shuffle else ""
    return (
        f"epoch {r.epoch}: {r.plan_scheme} load {r.load_points:g} points{attained}{shift} "
        f"(uncoded {r.uncoded_points:g}, saved {saved:.1f}%, {r.bound_label} {bound}); "
        f"{r.broadcast_bytes} bytes on the link; [{parts}]; "
        f"plan {r.plan_seconds:.3f}s encode {r.encode_seconds:.3f}s "
        f"decode {r.decode_seconds:.3f}s; "
        f"{'verified' if r.verified else 'MISMATCH'}"
    )


def cmd_evaluate(args: argparse.Namespace) -> int:
    from coded_shuffle.tools.evaluate import run

    def compiled(seconds: float) -> None:
        print(
            f"coded-shuffle: compiled the codec and the planner in {seconds:.1f} s (the first "
            "run after an install; cached for the next, and not in plan_seconds)",
            file=sys.stderr,
            flush=True,
        )

    ok = True
    for report in run(evaluation_from_args(args), compiled):
        ok &= report.verified
        if args.json:
            print(json.dumps(asdict(report)), flush=True)
        else:
            print(_human_line(report), flush=True)
    if not ok:
        print(
            "coded-shuffle: error: a worker's decoded bytes differ from the master's",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_predict_job(args: argparse.Namespace) -> int:
    """``predict --job -- OVERRIDES``: the run's seconds and its alternatives'."""
    from coded_shuffle.costs.rates import format_rate
    from coded_shuffle.tools.cluster.run import multicast_pace, pacing_overrides
    from coded_shuffle.tools.predict_job import (
        as_json,
        check_cluster,
        paced,
        predict_job,
        profile_job,
        render,
    )

    for flag, default in NOT_WITH_JOB.items():
        if getattr(args, flag) != default:
            name = flag.replace("_", "-")
            why = "--medium and --master-rate" if flag == "topology" else "the job's overrides"
            raise UsageError(f"--{name} does not go with --job: {why} give it")
    cluster = check_cluster(args.medium, args.rate, args.master_rate, args.mtu)
    rest = list(args.args)
    overrides = rest[1:] if rest[:1] == ["--"] else rest
    # multicast paced as the cluster command paces it where the overrides do not say: the
    # profile (whose config needs a pace) at --rate's, then at the job's workers' NICs
    master = int(cluster.master_rate)
    job = profile_job([*overrides, *pacing_overrides(overrides, [int(cluster.rate)], master)])
    given = worker_rates(args.host_rate, job.workers, cluster.rate)
    nics = [int(r) for r in given] or [int(cluster.rate)]
    pace = multicast_pace(overrides, nics, master)
    job = dataclasses.replace(job, multicast_rate=format_rate(pace)) if pace else job
    net = paced(dataclasses.replace(cluster, worker_rates=given), job)
    runs = predict_job(job, net)
    if args.json:
        for obj in as_json(job, runs):
            print(json.dumps(obj))
    else:
        print("\n".join(render(job, net, runs)))
    return 0


def worker_rates(given: Sequence[str], workers: int, rate: float) -> tuple[float, ...]:
    """``--host-rate HOST=RATE`` as every worker's NIC rate (bits/s; the others ``rate``), or
    () where none is given; one line for a host outside ``1..workers`` or a bad rate."""
    from coded_shuffle.tools.cluster.command import per_host, rate_of

    rates = [rate] * workers
    for host, value in per_host(given, "--host-rate", rate_of("--host-rate"), "RATE").items():
        if not 1 <= host <= workers:
            why = " (host 0 is the master: --master-rate)" if host == 0 else ""
            raise UsageError(f"--host-rate {host}=...: host {host} out of range 1..{workers}{why}")
        rates[host - 1] = value
    return tuple(rates) if given else ()


def cmd_predict(args: argparse.Namespace) -> int:
    if args.job:
        return cmd_predict_job(args)
    missing = [f for f in ("workers", "points", "point_bytes") if getattr(args, f) is None]
    if missing:
        names = ", ".join("--" + f.replace("_", "-") for f in missing)
        raise UsageError(f"predict needs {names} (or --job -- OVERRIDES: a training job)")
    if args.args:
        raise UsageError(f"unexpected arguments {' '.join(args.args)!r} (overrides go with --job)")
    if args.medium != "switch":
        raise UsageError("--medium goes with --job; without it the cluster is --topology")
    from coded_shuffle.costs.model import Network
    from coded_shuffle.costs.rates import parse_rate
    from coded_shuffle.tools.predict import (
        Workload,
        as_json,
        peer_load,
        planned_load,
        predict,
        render,
    )

    if args.scheme not in REGISTRY:
        raise UsageError(f"unknown scheme {args.scheme!r}; valid: {', '.join(sorted(REGISTRY))}")
    rate = parse_rate(args.rate, "--rate")
    net = Network(
        topology=args.topology,
        rate=rate,
        master_rate=parse_rate(args.master_rate, "--master-rate") if args.master_rate else rate,
        mtu=args.mtu,
        **({} if args.peer_seconds is None else {"peer_seconds": args.peer_seconds}),
        worker_rates=worker_rates(args.host_rate, args.workers or 0, rate),
    )
    net.check()
    cluster = Workload(
        workers=args.workers,
        points=args.points,
        point_bytes=args.point_bytes,
        storage=args.storage,
        scheme=args.scheme,
        chunk_bytes=args.chunk_bytes,
        seed=args.seed,
        fraction=args.fraction,
    )
    chain = net.topology == "shared" or bool(net.worker_rates)
    load = planned_load(cluster, chain, net.relay_order(cluster.workers))
    peers = peer_load(cluster)
    rows = predict(cluster, net, load, peers)
    if args.json:
        for obj in as_json(cluster, net, load, rows):
            print(json.dumps(obj))
    else:
        print("\n".join(render(cluster, net, load, rows, peers)))
    return 0


def cmd_schemes(_: argparse.Namespace) -> int:
    for name in sorted(REGISTRY):
        print(f"{name:22s} {REGISTRY[name].summary}")
    return 0


def cmd_transports(_: argparse.Namespace) -> int:
    from coded_shuffle.distributed.transports import REGISTRY as TRANSPORTS

    for name in sorted(TRANSPORTS):
        cls = TRANSPORTS[name]
        print(f"{name:14s} {cls.routing:9s} {cls.summary}")
        key = cls.options_key or name  # peer-multicast reads dist.multicast
        for f in dataclasses.fields(cls.Options):
            default = "required" if f.metadata.get("required") else f"default {f.default!r}"
            print(f"{'':25s}dist.{key}.{f.name} ({default})")
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    from coded_shuffle.tools.cluster.command import run_cluster_command
    from coded_shuffle.tools.cluster.netns import ClusterError

    try:
        return run_cluster_command(args)
    except ClusterError as exc:
        print(f"coded-shuffle: error: {exc}", file=sys.stderr)
        return 2


def cmd_pack(args: argparse.Namespace) -> int:
    """Runs the training package's packer (the data sources are the job's:
    ``coded_shuffle_train.pack``)."""
    import subprocess

    rest = list(args.args)
    return subprocess.run(
        [sys.executable, "-m", "coded_shuffle_train.pack", str(args.out), *rest]
    ).returncode


COMMANDS = {
    "evaluate": cmd_evaluate,
    "predict": cmd_predict,
    "schemes": cmd_schemes,
    "transports": cmd_transports,
    "cluster": cmd_cluster,
    "pack": cmd_pack,
}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except (UsageError, UndecodableError, VerificationError) as exc:
        print(f"coded-shuffle: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("coded-shuffle: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
