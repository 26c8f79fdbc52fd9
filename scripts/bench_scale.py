#!/usr/bin/env python3
"""Planning at hundreds to thousands of workers: plan, proof and bound time, peak memory, load.

For every scheme without excess storage (and ``best``) and every size, one fresh process
draws a random reshuffle and measures, in this order:

* ``place s``: ``scheme.initial_state`` (the placement; ``best`` also plans one probe
  reshuffle with every placement family it may commit to, at ``T = 1`` the excess-storage
  schemes' too up to ``K = 32``);
* ``plan s``: ``scheme.plan`` (the symbols, as index arrays);
* ``proof s``: the generic index decoder derives every worker's program (what the job does
  before it sends a byte);
* ``bound s``: the lower bound reported beside the load (exact up to K = 16, the ordering
  search within its work budget above);
* ``peak MB``: the process's peak resident memory (the interpreter and numpy included);
* ``load/bound``: the plan's load over that bound.

The compiled search kernels are loaded (or, on a fresh install, compiled) before the timing,
once per process; their first call is reported apart (``jit s``). Sizes: ``K`` = 32 ... 1,024
at ``N/K`` = 100 and 1,000, and ``N`` = 10^5 ... 10^7 at ``K = 32``. The fitted exponent is the
slope of ``log(plan s)`` against ``log K`` (fixed ``N/K``, ``K > 32``: where the large-``K``
decomposition runs) or ``log N`` (fixed ``K``).

``--against-small-k`` also runs the small-``K`` decomposition (an integer program for the
triangles, all-pairs shortest cycles) above ``K = 32`` and prints both loads: the new one
must be no worse. ``--markdown`` prints docs/benchmarks.md's table, ``--plot FILE`` the
log-log plot.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCHEMES = ("uncoded", "attia-tandon", "cycles", "best")
WORKERS = (32, 64, 128, 256, 512, 1024)
PER_WORKER = (100, 1000)
POINTS_AT_32 = (100_000, 1_000_000, 10_000_000)
FIT_FROM = 32  # the exponent in K is fitted above this K (where the large-K decomposition runs)
TARGETS = {  # the targets, checked in the summary
    "plan_1024": 10.0,  # cycles and attia-tandon at K = 1,024, N = 1,024,000
    "plan_128": 1.0,  # K = 128, N = 12,800
    "plan_n": 10.0,  # N = 10^7, K = 32
    "memory_n_mb": 4000.0,
}


def measure(scheme: str, workers: int, points: int, seed: int) -> dict:
    """One measurement, in this process (the child's side)."""
    import resource

    from coded_shuffle.math.assignment import random_assignment
    from coded_shuffle.math.index_decoder import decode_plan
    from coded_shuffle.math.plan import plan_load
    from coded_shuffle.math.schemes import get_scheme
    from coded_shuffle.math.transition_bounds import lower_bound

    t0 = time.perf_counter()
    _warm()
    jit = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    plain = get_scheme(scheme)
    old = random_assignment(points, workers, rng)
    new = random_assignment(points, workers, rng)
    t0 = time.perf_counter()
    state = plain.initial_state(old, workers, 1.0)
    place = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = plain.plan(state, new)
    t1 = time.perf_counter()
    for part in plan.plans:
        decode_plan(part)
    t2 = time.perf_counter()
    bound, exact = lower_bound(state, new)
    t3 = time.perf_counter()
    load = plan_load(plan)
    return {
        "scheme": scheme,
        "workers": workers,
        "points": points,
        "place_s": place,
        "plan_s": t1 - t0,
        "proof_s": t2 - t1,
        "bound_s": t3 - t2,
        "jit_s": jit,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load": load,
        "bound": bound,
        "bound_exact": exact,
        "ratio": load / bound if bound else float("nan"),
        "winner": plan.plans[0].scheme,
    }


def _warm() -> None:
    """Calls every compiled kernel once on a tiny instance (loads them from the disk cache)."""
    from coded_shuffle.math.bounds import _search_ordering
    from coded_shuffle.math.schemes.cycle_search import shortest_first, triangle_packing

    ring = np.roll(np.eye(4, dtype=np.int64), 1, axis=1)
    shortest_first(ring)
    triangle_packing(ring, 1)
    _search_ordering(ring)


def against_small_k(workers: int, points: int, seed: int) -> dict:
    """The large-K decomposition against the small-K one on the same reshuffle (cycles)."""
    from coded_shuffle.math.assignment import random_assignment, shuffle_matrix
    from coded_shuffle.math.schemes.cycle_plan import pair_cycles
    from coded_shuffle.math.schemes.cycles import programmed_cycles, searched_cycles

    _warm()
    rng = np.random.default_rng(seed)
    shuffle = shuffle_matrix(
        random_assignment(points, workers, rng), random_assignment(points, workers, rng), workers
    )
    pairs, omega = pair_cycles(shuffle)
    t0 = time.perf_counter()
    rest = searched_cycles(omega)
    t1 = time.perf_counter()
    small = programmed_cycles(omega)
    t2 = time.perf_counter()
    off = int(shuffle.sum() - np.trace(shuffle))
    return {
        "workers": workers,
        "points": points,
        "seed": seed,
        "new_load": off - int(pairs.multiplicity.sum()) - int(rest.multiplicity.sum()),
        "new_s": t1 - t0,
        "small_k_load": off - int(pairs.multiplicity.sum()) - int(small.multiplicity.sum()),
        "small_k_s": t2 - t1,
    }


def child(kind: str, *args: object) -> dict:
    """Runs one measurement in a fresh interpreter (its own peak memory)."""
    code = (
        "import json, sys; sys.path.insert(0, 'scripts'); import bench_scale as b; "
        f"print(json.dumps(b.{kind}(*{list(args)!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if out.returncode:
        raise RuntimeError(f"{kind}{args}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def fitted_exponent(x: list[float], y: list[float]) -> float:
    """Slope of ``log y`` against ``log x`` (least squares)."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def sizes(args: argparse.Namespace) -> list[tuple[int, int]]:
    grid = [(k, k * q) for q in args.per_worker for k in args.workers]
    return grid + [(32, n) for n in args.points_at_32 if (32, n) not in grid]


def print_table(rows: list[dict], markdown: bool) -> None:
    head = (
        "scheme",
        "K",
        "N",
        "place s",
        "plan s",
        "proof s",
        "bound s",
        "peak MB",
        "load",
        "bound",
        "load/bound",
    )
    lines = [head]
    for r in rows:
        bound = f"{r['bound']:.0f}" + ("" if r["bound_exact"] else " (search)")
        lines.append(
            (
                r["scheme"],
                f"{r['workers']}",
                f"{r['points']:,}",
                f"{r['place_s']:.2f}",
                f"{r['plan_s']:.2f}",
                f"{r['proof_s']:.2f}",
                f"{r['bound_s']:.2f}",
                f"{r['peak_mb']:.0f}",
                f"{r['load']:.0f}",
                bound,
                f"{r['ratio']:.4f}",
            )
        )
    if markdown:
        print("| " + " | ".join(lines[0]) + " |")
        print("|" + "---|" * len(lines[0]))
        for line in lines[1:]:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))


def exponents(rows: list[dict], args: argparse.Namespace) -> list[tuple[str, float]]:
    out = []
    for scheme in args.schemes:
        for q in args.per_worker:
            pts = [r for r in rows if r["scheme"] == scheme and r["points"] == q * r["workers"]]
            pts = [r for r in pts if r["workers"] in args.workers and r["workers"] > FIT_FROM]
            if len(pts) >= 3:
                x, y = [r["workers"] for r in pts], [max(r["plan_s"], 1e-3) for r in pts]
                text = f"{scheme}: plan s ~ K^e at N/K = {q}, K > {FIT_FROM}"
                out.append((text, fitted_exponent(x, y)))
        pts = [r for r in rows if r["scheme"] == scheme and r["workers"] == 32]
        pts = sorted({r["points"]: r for r in pts}.values(), key=lambda r: r["points"])
        if len(pts) >= 3:
            x, y = [r["points"] for r in pts], [max(r["plan_s"], 1e-3) for r in pts]
            out.append((f"{scheme}: plan s ~ N^e at K = 32", fitted_exponent(x, y)))
    return out


def targets(rows: list[dict]) -> list[tuple[str, bool]]:
    def find(scheme: str, k: int, n: int) -> dict | None:
        return next(
            (r for r in rows if (r["scheme"], r["workers"], r["points"]) == (scheme, k, n)), None
        )

    checks = []
    for scheme in ("cycles", "attia-tandon"):
        for (k, n), limit in (((1024, 1_024_000), "plan_1024"), ((128, 12_800), "plan_128")):
            r = find(scheme, k, n)
            if r:
                checks.append(
                    (
                        f"{scheme} K={k} N={n:,}: plan {r['plan_s']:.2f} s <= {TARGETS[limit]} s",
                        r["plan_s"] <= TARGETS[limit],
                    )
                )
    r = find("cycles", 32, 10_000_000)
    if r:
        checks.append(
            (
                f"cycles K=32 N=10^7: plan {r['plan_s']:.2f} s <= {TARGETS['plan_n']} s, "
                f"peak {r['peak_mb']:.0f} MB <= {TARGETS['memory_n_mb']:.0f} MB",
                r["plan_s"] <= TARGETS["plan_n"] and r["peak_mb"] <= TARGETS["memory_n_mb"],
            )
        )
    r = find("cycles", 1024, 1_024_000)
    if r:
        checks.append(
            (f"cycles K=1,024 N=1,024,000: load/bound {r['ratio']:.4f} <= 1.02", r["ratio"] <= 1.02)
        )
    return checks


def plot(rows: list[dict], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_k, by_n) = plt.subplots(1, 2, figsize=(11, 4.2))
    for scheme in args.schemes:
        for q, style in zip(args.per_worker, ("-o", "--s"), strict=False):
            pts = [r for r in rows if r["scheme"] == scheme and r["points"] == q * r["workers"]]
            pts = [r for r in pts if r["workers"] in args.workers]
            pts.sort(key=lambda r: r["workers"])
            if pts:
                x, y = [r["workers"] for r in pts], [max(r["plan_s"], 1e-3) for r in pts]
                fit = [(a, b) for a, b in zip(x, y, strict=True) if a > FIT_FROM]
                e = fitted_exponent(*zip(*fit, strict=True)) if len(fit) >= 3 else float("nan")
                by_k.loglog(x, y, style, label=f"{scheme}, N/K={q} (K^{e:.2f})")
        pts = sorted(
            {r["points"]: r for r in rows if r["scheme"] == scheme and r["workers"] == 32}.values(),
            key=lambda r: r["points"],
        )
        if pts:
            x, y = [r["points"] for r in pts], [max(r["plan_s"], 1e-3) for r in pts]
            e = fitted_exponent(x, y) if len(pts) >= 3 else float("nan")
            by_n.loglog(x, y, "-o", label=f"{scheme} (N^{e:.2f})")
    title = f"plan time against K (fit: K > {FIT_FROM})"
    by_k.set(xlabel="workers K", ylabel="plan seconds", title=title)
    by_n.set(xlabel="points N", ylabel="plan seconds", title="plan time against N at K = 32")
    for ax in (by_k, by_n):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    parser.add_argument("--workers", type=int, nargs="+", default=list(WORKERS))
    parser.add_argument("--per-worker", type=int, nargs="+", default=list(PER_WORKER))
    parser.add_argument("--points-at-32", type=int, nargs="*", default=list(POINTS_AT_32))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", action="store_true", help="the table as markdown")
    parser.add_argument("--json", type=Path, help="also write every row to this file")
    parser.add_argument("--plot", type=Path, help="log-log plot of plan time against K and N")
    parser.add_argument(
        "--against-small-k",
        type=int,
        nargs="*",
        metavar="K",
        help="compare cycles' loads with the small-K decomposition at these K (N/K = 100)",
    )
    args = parser.parse_args(argv)
    from coded_shuffle.math.schemes import REGISTRY

    bad = [s for s in args.schemes if s not in REGISTRY]
    if bad or min(args.workers) < 2 or min(args.per_worker) < 1:
        print(
            f"error: schemes must be among {', '.join(sorted(REGISTRY))} (got {bad}), "
            f"--workers >= 2, --per-worker >= 1",
            file=sys.stderr,
        )
        return 2
    rows = []
    for k, n in sizes(args):
        for scheme in args.schemes:
            print(f"... {scheme} K={k} N={n:,}", file=sys.stderr, flush=True)
            rows.append(child("measure", scheme, k, n, args.seed))
    print_table(rows, args.markdown)
    print()
    for text, e in exponents(rows, args):
        print(f"fitted exponent, {text}: {e:.2f}")
    for text, ok in targets(rows):
        print(f"target {'met' if ok else 'NOT met'}: {text}")
    for k in args.against_small_k or []:
        for seed in (args.seed, args.seed + 1):
            print(f"... against small K: K={k} seed {seed}", file=sys.stderr, flush=True)
            r = child("against_small_k", k, 100 * k, seed)
            print(
                f"cycles K={k} N={100 * k:,} seed {seed}: load {r['new_load']} "
                f"in {r['new_s']:.2f} s (small-K decomposition: {r['small_k_load']} "
                f"in {r['small_k_s']:.1f} s)"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.plot:
        plot(rows, args, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
