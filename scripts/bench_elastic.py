"""Yang et al. 2018's Fig. 2(a)/(b) experiment: time per product against machines pre-empted.

``P`` machines store the coded ``A`` (``L`` row blocks, ``rows x cols``); ``m = 0..P-L`` are
pre-empted before the first step; every method computes ``A x`` for ``--trials`` fresh ``x``.

1. **Per machine** (``coded_shuffle.elastic.product_runner``, workers simulated one after the
   other in this process, so each runs alone, as on a machine of its own): the slowest
   worker's compute (what the step waits for: ``L``-th fastest for ``nonadaptive``), the
   master's decoding, and their sum, medians over the trials. Coded compute against the ideal
   ``P / (P - m)`` scaling of its ``m = 0`` value.
2. **Whole job** (``--job``): ``coded-shuffle-train job=elastic_matmul`` with ``P + 1`` real
   processes on this machine (loopback), or with ``--cluster RATE`` one emulated host per
   rank (``coded-shuffle cluster``, NICs at ``RATE``, needs root); median wall time per step
   split into compute, decode and the rest (communication and waiting). On a machine with
   fewer cores than processes the workers share cores, so the compute column is not per
   machine.

    python scripts/bench_elastic.py                    # 12000 x 4000, 20 trials
    python scripts/bench_elastic.py --rows 30000 --cols 10000 --out docs/img/elastic_matmul.png
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from coded_shuffle.elastic.product_runner import (
    PRODUCT_METHODS,
    check_product_sizes,
    make_product_problem,
    simulate_products,
)
from coded_shuffle.elastic.settings import make_settings
from coded_shuffle.errors import UsageError
from coded_shuffle.tools.records import METRICS, read_metrics

PAPER = (30000, 10000)  # Yang et al. 2018, sec. 4: A is 30000 x 10000, P = 6, L = 3


def per_machine(rows: int, cols: int, workers: int, size: int, trials: int) -> list[dict]:
    problem = make_product_problem(rows, cols, 1, workers, size, seed=0)
    out = []
    for m in range(workers - size + 1):
        leave = (
            None if m == 0 else [{"step": 0, "leave": list(range(workers - m + 1, workers + 1))}]
        )
        settings = make_settings(
            workers,
            size,
            trials,
            leave,
            PRODUCT_METHODS,
            max_workers=workers,
            valid_methods=PRODUCT_METHODS,
        )
        with tempfile.TemporaryDirectory() as root:
            records = simulate_products(problem, settings, root)
        for method in PRODUCT_METHODS:
            rows_m = [r for r in records if r["method"] == method][1:]  # first: cache fill
            out.append(summarise(method, m, rows_m))
    return out


def summarise(method: str, m: int, records: list[dict]) -> dict:
    med = {k: statistics.median(r[k] for r in records) for k in SECONDS}
    return {
        "method": method,
        "preempted": m,
        "rows": max(r["rows_used_max"] for r in records),
        "error": max(r["result_rel_error"] for r in records),
        **med,
    }


SECONDS = ("compute_seconds", "decode_seconds", "comm_seconds", "step_seconds")


def per_machine_table(found: list[dict], workers: int) -> None:
    print("1. per machine (workers one at a time): median ms per product")
    print(
        f"{'method':<12}{'m':>2}{'rows/worker':>12}{'compute':>9}{'decode':>8}{'total':>8}"
        f"{'vs coded m=0':>13}{'compute x':>10}{'ideal x':>8}{'max error':>10}"
    )
    base = {r["method"]: r for r in found if r["preempted"] == 0}
    ref = base["coded"]["compute_seconds"] + base["coded"]["decode_seconds"]
    for r in found:
        total = r["compute_seconds"] + r["decode_seconds"]
        scale = r["compute_seconds"] / base[r["method"]]["compute_seconds"]
        ideal = workers / (workers - r["preempted"]) if r["method"] != "nonadaptive" else 1.0
        print(
            f"{r['method']:<12}{r['preempted']:>2}{r['rows']:>12}"
            f"{r['compute_seconds'] * 1e3:>9.2f}{r['decode_seconds'] * 1e3:>8.2f}"
            f"{total * 1e3:>8.2f}{total / ref:>13.2f}{scale:>10.2f}{ideal:>8.2f}"
            f"{r['error']:>10.1e}"
        )


def whole_job(
    rows: int, cols: int, workers: int, size: int, trials: int, cluster: str | None
) -> list[dict]:
    """The job for every ``m``: local processes, or one emulated host per rank (``cluster``:
    every NIC's rate, ``coded-shuffle cluster``)."""
    if cluster:
        exe = shutil.which("coded-shuffle")
        base = [exe] if exe else [sys.executable, "-m", "coded_shuffle"]
        command = [*base, "cluster", "--hosts", str(workers + 1), "--rate", cluster, "--"]
    else:
        exe = shutil.which("coded-shuffle-train")
        command = [exe] if exe else [sys.executable, "-m", "coded_shuffle_train.launch"]
    out = []
    for m in range(workers - size + 1):
        with tempfile.TemporaryDirectory() as run_dir:
            leave = (
                "null"
                if m == 0
                else f"[{{step: 0, leave: {list(range(workers - m + 1, workers + 1))}}}]"
            )
            args = [
                "job=elastic_matmul",
                f"workers={workers}",
                f"job.steps={trials + 1}",
                f"job.problem.rows={rows}",
                f"job.problem.cols={cols}",
                f"job.elastic.recovery_threshold={size}",
                f"job.elastic.events={leave}",
                "job.report_every=0",
            ]
            if not cluster:
                args.append(f"hydra.run.dir={run_dir}")
            done = subprocess.run(command + args, capture_output=True, text=True, cwd=run_dir)
            if done.returncode != 0:
                raise SystemExit(f"bench_elastic: the job failed: {done.stderr.strip()[-500:]}")
            found = sorted(Path(run_dir).rglob(METRICS))
            records = read_metrics(found[0])
        for method in PRODUCT_METHODS:
            rows_m = [r for r in records if r["method"] == method][1:]
            out.append(summarise(method, m, rows_m))
    return out


def whole_job_table(found: list[dict]) -> None:
    print("\n2. whole job (real processes on this machine): median ms per product")
    print(
        f"{'method':<12}{'m':>2}{'rows/worker':>12}{'step':>8}{'compute':>9}{'decode':>8}"
        f"{'comm+wait':>10}{'max error':>10}"
    )
    for r in found:
        print(
            f"{r['method']:<12}{r['preempted']:>2}{r['rows']:>12}{r['step_seconds'] * 1e3:>8.1f}"
            f"{r['compute_seconds'] * 1e3:>9.1f}{r['decode_seconds'] * 1e3:>8.2f}"
            f"{r['comm_seconds'] * 1e3:>10.1f}{r['error']:>10.1e}"
        )


def plot(found: list[dict], out: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = {"coded": ("tab:blue", "o"), "uncoded": ("0.4", "s"), "nonadaptive": ("tab:red", "^")}
    for method, (colour, marker) in styles.items():
        rows = [r for r in found if r["method"] == method]
        ms = [(r["compute_seconds"] + r["decode_seconds"]) * 1e3 for r in rows]
        ax.plot([r["preempted"] for r in rows], ms, marker=marker, color=colour, label=method)
        if method == "coded":
            dec = [r["decode_seconds"] * 1e3 for r in rows]
            ax.plot(
                [r["preempted"] for r in rows], dec, ls=":", color=colour, label="coded: decode"
            )
    ax.set_xticks(sorted({r["preempted"] for r in found}))
    ax.set_xlabel("machines pre-empted")
    ax.set_ylabel("ms per product (slowest worker + decode)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"\nplot: {out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=12000, help="rows of A (paper: 30000)")
    ap.add_argument("--cols", type=int, default=4000, help="columns of A (paper: 10000)")
    ap.add_argument("-P", "--workers", type=int, default=6)
    ap.add_argument("-L", "--recovery-threshold", type=int, default=3)
    ap.add_argument("--trials", type=int, default=20, help="products per method and m")
    ap.add_argument("--job", action="store_true", help="also run the real job (table 2)")
    ap.add_argument("--job-rows", type=int, default=6000, help="rows of A in the real job")
    ap.add_argument("--job-cols", type=int, default=2000, help="columns of A in the real job")
    ap.add_argument(
        "--cluster",
        default=None,
        metavar="RATE",
        help="run the job on the emulated cluster (one host per rank, NICs at RATE; root)",
    )
    ap.add_argument("--out", type=Path, default=None, help="plot of table 1 (PNG)")
    args = ap.parse_args(argv)
    try:
        make_settings(args.workers, args.recovery_threshold, max(args.trials, 1))
        check_product_sizes(args.rows, args.cols, 1, args.workers, args.recovery_threshold)
        if args.trials < 2:
            raise UsageError(f"--trials={args.trials} must be >= 2")
    except UsageError as exc:
        print(f"bench_elastic: error: {exc}", file=sys.stderr)
        return 2
    size = "the paper's size" if (args.rows, args.cols) == PAPER else "not the paper's size"
    print(
        f"A {args.rows} x {args.cols} ({size}: 30000 x 10000), P = {args.workers}, "
        f"L = {args.recovery_threshold}, {args.trials} products per method and m\n"
    )
    found = per_machine(args.rows, args.cols, args.workers, args.recovery_threshold, args.trials)
    per_machine_table(found, args.workers)
    if args.job:
        job = whole_job(
            args.job_rows,
            args.job_cols,
            args.workers,
            args.recovery_threshold,
            args.trials,
            args.cluster,
        )
        where = f"emulated cluster, NICs {args.cluster}" if args.cluster else "local processes"
        print(f"(whole job: A {args.job_rows} x {args.job_cols}, {where})")
        whole_job_table(job)
    if args.out:
        title = f"A {args.rows} x {args.cols}, P = {args.workers}, L = {args.recovery_threshold}"
        plot(found, args.out, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
