#!/usr/bin/env python3
"""What a data set larger than memory costs the job's memory: the training job on a packed
synthetic set of ``--size-gb`` and on one of ``--small-mb``, everything else the same.

Both sets are written by ``coded-shuffle pack`` into a temporary directory (removed after)
and trained on with ``data=file`` (memory-mapped): ``--workers`` workers, ``model=logreg``,
``--epochs`` epochs, every epoch verified. While each job runs, the script samples every
process of the job (the launcher, its fork server and every rank) a few times a second and
prints the peak of their summed anonymous memory (``RssAnon`` of ``/proc/PID/status``: what a
process holds of its own, not the page cache of the mapped files) and each rank's own peak.
The goal: the big set's peak at most 10% of its size above the small set's.

``--grid SHAPE ...`` measures what grows with ``N`` instead, shape by shape: ``FxN`` (records
of ``4F + 4`` bytes, ``N`` points, a test split of 2,000 in the directory) or ``FxN:notest``
(no test split: the job holds one out of the training points). Each shape runs twice, at
``N`` and at ``N / 10``; the table gives both peaks and the growth in bytes per point per
rank, ``(peak(N) - peak(N/10)) / (0.9 N) / (K + 1)`` (goal: at most 200), and the same growth
of the sum of every process's own peak (the peak of the sum also moves with whether the
processes' transients happen at the same moment).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from coded_shuffle.tools.records import verified_records

KB = 1024


def descendants(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def anonymous_bytes(pid: int) -> tuple[int, str]:
    """``RssAnon`` of a process in bytes, and its command line's tail (0 when it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return 0, ""
    for line in status.splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * KB, cmdline[-60:]
    return 0, cmdline[-60:]


@dataclass
class Peak:
    total: int = 0
    per_process: dict[int, int] = field(default_factory=dict)

    def sample(self, root: int) -> None:
        now = {pid: anonymous_bytes(pid)[0] for pid in descendants(root)}
        self.total = max(self.total, sum(now.values()))
        for pid, value in now.items():
            self.per_process[pid] = max(self.per_process.get(pid, 0), value)


def run(cmd: list[str], cwd: Path) -> None:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"bench_memory.py: error: {' '.join(cmd)}:\n{out.stderr[-2000:]}")


def train(args: argparse.Namespace, packed: Path, run_dir: Path) -> tuple[Peak, list[dict]]:
    """The job on ``packed``, sampled until it ends; its peak and its metrics."""
    cmd = [
        sys.executable,
        "-m",
        "coded_shuffle_train.launch",
        "data=file",
        f"data.path={packed}",
        "model=logreg",
        f"workers={args.workers}",
        f"epochs={args.epochs}",
        f"dist.transport={args.transport}",
        "optim.batch_size=512",
        f"hydra.run.dir={run_dir}",
        *args.set,
    ]
    peak = Peak()
    job = subprocess.Popen(cmd, cwd=run_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while job.poll() is None:
        peak.sample(job.pid)
        time.sleep(args.interval)
    _, err = job.communicate()
    if job.returncode:
        raise SystemExit(f"bench_memory.py: error: the job failed:\n{err.decode()[-2000:]}")
    return peak, verified_records(run_dir, "bench_memory.py")


def pack(work: Path, name: str, features: int, points: int, test: bool) -> Path:
    """A synthetic set packed into ``work / name`` (without its test split unless ``test``)."""
    packed = work / name
    options = [f"data.points={points}", f"data.features={features}", "data.test_points=2000"]
    run(
        [
            sys.executable,
            "-m",
            "coded_shuffle_train.pack",
            str(packed),
            "--",
            "data=synthetic",
            *options,
        ],
        work,
    )
    if not test:
        for f in ("X_test.npy", "y_test.npy"):
            (packed / f).unlink()
    return packed


def growth(peaks: list[int], points: int, ranks: int) -> float:
    """Bytes per point and rank between the runs at ``N / 10`` and at ``N``."""
    return (peaks[1] - peaks[0]) / (points - points // 10) / ranks


def grid(args: argparse.Namespace, work: Path) -> None:
    """``--grid``: every shape at ``N`` and ``N / 10``; growth per point per rank, of the
    peak of the processes' sum (the job's) and of the sum of every process's own peak (which
    does not depend on whether the processes' transients meet in time)."""
    head = (
        f"{'shape':22s} {'record B':>8s} {'N':>9s} {'test':>5s} {'peak N/10 MB':>12s} "
        f"{'peak N MB':>10s} {'B/point/rank':>12s} {'of own peaks':>12s}"
    )
    print(head + "\n" + "-" * len(head), flush=True)
    for shape in args.grid:
        dims, _, flag = shape.partition(":")
        features, points = (int(v) for v in dims.split("x"))
        peaks, own = [], []
        for n in (points // 10, points):
            name = f"{features}x{n}{flag}"
            packed = pack(work, name, features, n, flag != "notest")
            (work / f"run-{name}").mkdir()
            peak, _ = train(args, packed, work / f"run-{name}" / "job")
            peaks.append(peak.total)
            own.append(sum(peak.per_process.values()))
            shutil.rmtree(packed)
        ranks = args.workers + 1
        print(
            f"{shape:22s} {4 * features + 4:8d} {points:9,d} {flag != 'notest'!s:>5s} "
            f"{peaks[0] / 2**20:12,.1f} {peaks[1] / 2**20:10,.1f} "
            f"{growth(peaks, points, ranks):12,.0f} {growth(own, points, ranks):12,.0f}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0, help="the large set's size")
    parser.add_argument("--small-mb", type=float, default=50.0, help="the small set's size")
    parser.add_argument("--features", type=int, default=2000, help="records of 4*F+4 bytes")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--transport", default="chain")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between samples")
    parser.add_argument("--dir", type=Path, default=None, help="where the sets go (temporary)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--grid", nargs="+", metavar="FxN[:notest]", help="growth per point")
    args = parser.parse_args(argv)
    record = 4 * args.features + 4
    sizes = {"small": args.small_mb * 1e6, "large": args.size_gb * 1e9}
    work = Path(tempfile.mkdtemp(prefix="bench-memory-", dir=args.dir))
    if args.grid:
        try:
            print(
                f"the job on packed synthetic sets, K = {args.workers}, model=logreg, "
                f"{args.epochs} epochs, dist.transport={args.transport}; peak RssAnon summed "
                "over every process of the job",
                flush=True,
            )
            grid(args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    print(
        f"the job on a packed synthetic set (records of {record} bytes, memory-mapped), "
        f"K = {args.workers}, model=logreg, {args.epochs} epochs, dist.transport="
        f"{args.transport}; peak RssAnon summed over every process of the job",
        flush=True,
    )
    try:
        results = {}
        for name, size in sizes.items():
            points = int(size // record)
            packed = work / name
            run(
                [
                    sys.executable,
                    "-m",
                    "coded_shuffle_train.pack",
                    str(packed),
                    "--",
                    "data=synthetic",
                    f"data.points={points}",
                    f"data.features={args.features}",
                    "data.test_points=2000",
                ],
                work,
            )
            on_disk = sum(f.stat().st_size for f in packed.glob("*.npy"))
            (work / f"run-{name}").mkdir()
            peak, rows = train(args, packed, work / f"run-{name}" / "job")
            results[name] = (points, on_disk, peak, rows)
            print(f"  {name}: done", file=sys.stderr, flush=True)
            shutil.rmtree(packed)
        header = (
            f"{'set':6s} {'N':>10s} {'on disk MB':>10s} {'peak anon MB':>12s} "
            f"{'largest process MB':>18s} {'epoch s':>8s} {'verified':>8s}"
        )
        print(header + "\n" + "-" * len(header))
        for name, (points, on_disk, peak, rows) in results.items():
            epoch = sum(r["epoch_seconds"] for r in rows) / len(rows)
            print(
                f"{name:6s} {points:10,d} {on_disk / 1e6:10,.1f} {peak.total / 2**20:12,.1f} "
                f"{max(peak.per_process.values()) / 2**20:18,.1f} {epoch:8.2f} "
                f"{all(r['verified'] for r in rows)!s:>8s}"
            )
        large, small = results["large"], results["small"]
        grown = large[2].total - small[2].total
        share = grown / large[1]
        print(
            f"peak grew by {grown / 2**20:,.1f} MB for {(large[1] - small[1]) / 1e6:,.0f} MB more "
            f"data: {100 * share:.1f}% of the large set's size (goal: at most 10%)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
