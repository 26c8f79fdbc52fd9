#!/usr/bin/env python3
"""Measures a table of training runs on the emulated cluster for ``predict --job``'s checks
(``docs/measured_runs.json``, read by ``scripts/predict_job_check.py`` and the tests): one job,
several ways to run it, each run's seconds to the end, the job's profile recorded beside them.

    python scripts/predict_runs.py --title "switch 400 Mbit/s, 2 KB, minibatch 16" --set check \\
        --medium switch --rate 400mbit --runs full/cycles/chain full/uncoded/unicast:blocking \\
        -- data=synthetic data.points=20000 data.features=500 model=logreg epochs=4

Every run is ``coded-shuffle cluster --hosts K+1 --rate R --medium M -- OVERRIDES`` with the
run's scheme, transport and shuffle (``policy/scheme[@T]/transport``; ``:blocking``: without
prefetch), every epoch verified. ``--from RUN_DIR ...`` reads finished runs instead (their
``metrics.jsonl`` and ``config.yaml``: the benchmarks' own, in the order of ``--runs``);
``--profile-overrides`` then gives the job as ``--profile`` takes it where its data is gone (a
packed set removed after: its synthetic source). The table replaces the one of the same
title. Needs root (network namespaces) unless ``--from``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from coded_shuffle.tools.cluster.jobs import job_argv, run_job
from coded_shuffle.tools.measured import SETS, Measured, Table, load, save
from coded_shuffle.tools.predict_job import profile_of
from coded_shuffle.tools.records import verified_records

RUNS = Path(__file__).resolve().parent.parent / "docs" / "measured_runs.json"


def parse_run(text: str) -> tuple[str, bool]:
    """``policy/scheme[@T]/transport[:blocking]`` -> the label and whether it prefetches."""
    label, _, mode = text.partition(":")
    if mode not in ("", "blocking") or len(label.split("/")) != 3:
        raise SystemExit(
            f"predict_runs.py: error: --runs {text!r}: policy/scheme/transport[:blocking]"
        )
    return label, mode != "blocking"


def run_overrides(label: str, prefetch: bool, fraction: float) -> list[str]:
    """The overrides that make the job this run."""
    policy, scheme, transport = label.split("/")
    name, _, storage = scheme.partition("@")
    shuffle = "partial" if policy.startswith("partial") else policy
    out = [f"scheme={name}", f"dist.transport={transport}", f"shuffle={shuffle}"]
    out += [f"storage={storage}"] if storage else []
    out += (
        [f"shuffle.fraction={policy.removeprefix('partial') or fraction}"]
        if shuffle == "partial"
        else []
    )
    return [*out, f"dist.prefetch={str(prefetch).lower()}"]


def measure(args: argparse.Namespace, label: str, prefetch: bool, run_dir: Path) -> float:
    """One run on the cluster: its seconds to the end (every epoch verified)."""
    overrides = [
        *args.overrides,
        *run_overrides(label, prefetch, args.fraction),
        f"hydra.run.dir={run_dir}",
    ]
    argv = job_argv(args.workers + 1, args.rate, args.medium, overrides, args.master_rate, args.mtu)
    run_job(argv, "predict_runs.py")
    return seconds_of(run_dir)


def epochs_of(overrides: list[str]) -> int:
    """The job's ``epochs`` (the last such override; the schema's default, 10, otherwise)."""
    given = [a.split("=", 1)[1] for a in overrides if a.startswith("epochs=")]
    return int(given[-1]) if given else 10


def seconds_of(run_dir: Path) -> float:
    return float(verified_records(run_dir, "predict_runs.py")[-1]["elapsed_seconds"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--title", required=True)
    parser.add_argument("--set", required=True, choices=SETS)
    parser.add_argument("--medium", default="switch", choices=("switch", "shared"))
    parser.add_argument("--rate", required=True)
    parser.add_argument("--master-rate")
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--fraction", type=float, default=0.25)
    parser.add_argument(
        "--runs", nargs="+", required=True, help="policy/scheme/transport[:blocking]"
    )
    parser.add_argument("--from", dest="dirs", nargs="+", type=Path, help="finished runs instead")
    parser.add_argument(
        "--profile-overrides", nargs="*", help="the job for --profile (with --from)"
    )
    parser.add_argument("--source", default="docs/benchmarks.md")
    parser.add_argument("--out", type=Path, default=RUNS)
    parser.add_argument("--keep", type=Path, help="keep the runs' directories here")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="-- then the job's overrides")
    args = parser.parse_args(argv)
    args.overrides = args.overrides[1:] if args.overrides[:1] == ["--"] else args.overrides
    runs = [parse_run(r) for r in args.runs]
    if args.dirs and len(args.dirs) != len(runs):
        parser.error("--from takes one run directory per --runs entry, in their order")
    with tempfile.TemporaryDirectory(prefix="predict-runs-") as scratch:
        work = args.keep or scratch
        measured, epochs = [], epochs_of(args.overrides)
        for i, (label, prefetch) in enumerate(runs):
            seconds = (
                seconds_of(args.dirs[i])
                if args.dirs
                else measure(args, label, prefetch, Path(work) / f"run{i}")
            )
            measured.append(Measured(label, epochs, round(seconds, 2), prefetch))
            print(
                f"  {label}{'' if prefetch else ' blocking'}: {seconds:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    profile_overrides = args.profile_overrides or args.overrides
    table = Table(
        title=args.title,
        set=args.set,
        medium=args.medium,
        rate=args.rate,
        master_rate=args.master_rate,
        mtu=args.mtu,
        overrides=tuple(profile_overrides),
        runs=tuple(measured),
        profile=profile_of(profile_overrides),
        source=args.source,
    )
    tables = [t for t in load(args.out) if t.title != args.title] if args.out.exists() else []
    save(args.out, [*tables, table])
    print(f"wrote {args.title!r} ({len(measured)} runs) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
