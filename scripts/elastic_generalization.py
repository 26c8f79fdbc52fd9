"""Yang et al. 2018's Fig. 2(c): generalisation (test) error against
iteration under random failures.

Linear regression by full-batch gradient descent on ``P`` machines (the paper: 20 machines,
3,352 features, 10,000 training and 10,000 test points; here synthetic data of that shape,
``coded_shuffle.elastic.make_problem``, heterogeneous sources, one per machine). Every step
each available machine fails with probability ``--failure-rate`` and a replacement arrives
``--repair`` steps later (the paper's scheduler re-schedules machines); failures that would
leave fewer than ``L`` machines are skipped. Methods: ``coded`` (exact gradient),
``nofailure``, ``ignore`` (the lost part dropped) and ``distr_bgd`` (Elastic Distr-BGD: the
lost part's last gradient reused), all with the same events and the same step rule
(backtracking line search, as in the paper; ``--fixed-step`` for ``1/smoothness``), simulated
in this process (``coded_shuffle.elastic.simulate``).

    python scripts/elastic_generalization.py --out docs/img/elastic_generalization.png
    python scripts/elastic_generalization.py --points 10000 --features 3352   # the paper's
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from coded_shuffle.elastic import make_problem, make_settings, simulate
from coded_shuffle.errors import UsageError

METHODS = ("nofailure", "coded", "ignore", "distr_bgd")


def failure_events(
    workers: int, size: int, steps: int, rate: float, repair: int, seed: int
) -> list[dict]:
    """Random departures (never below ``size`` machines) and replacements ``repair`` later."""
    rng = np.random.default_rng(seed)
    up, back, events = set(range(1, workers + 1)), {}, []
    for step in range(1, steps):
        joins = back.pop(step, 0)
        failing = [i for i in sorted(up) if rng.random() < rate]
        failing = failing[: max(len(up) - size, 0)]
        event: dict = {"step": step}
        if failing:
            event["leave"] = failing
            up -= set(failing)
            if step + repair < steps:
                back[step + repair] = back.get(step + repair, 0) + len(failing)
        if joins:
            event["join"] = joins
            free = sorted(set(range(1, workers + 1)) - up)[:joins]
            up |= set(free)
        if len(event) > 1:
            events.append(event)
    return events


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=2000, help="training points (paper: 10000)")
    ap.add_argument("--features", type=int, default=600, help="features (paper: 3352)")
    ap.add_argument("--test-points", type=int, default=None, help="default: --points")
    ap.add_argument("-P", "--workers", type=int, default=20)
    ap.add_argument("-L", "--recovery-threshold", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--failure-rate", type=float, default=0.01, help="per machine and step")
    ap.add_argument("--repair", type=int, default=8, help="steps until a replacement joins")
    ap.add_argument("--heterogeneity", type=float, default=0.2, help="sources' weight spread")
    ap.add_argument("--fixed-step", action="store_true", help="1/smoothness, no line search")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="plot (PNG)")
    args = ap.parse_args(argv)
    try:
        if not 0 <= args.failure_rate <= 1 or args.repair < 1:
            raise UsageError(
                f"--failure-rate={args.failure_rate} must be in 0..1 and --repair={args.repair}"
                " >= 1"
            )
        test = args.points if args.test_points is None else args.test_points
        problem = make_problem(
            args.points,
            args.features,
            args.workers,
            heterogeneity=args.heterogeneity,
            seed=args.seed,
            test_points=test,
        )
        events = failure_events(
            args.workers,
            args.recovery_threshold,
            args.steps,
            args.failure_rate,
            args.repair,
            args.seed,
        )
        settings = make_settings(
            args.workers,
            args.recovery_threshold,
            args.steps,
            events,
            METHODS,
            seed=args.seed,
            line_search=not args.fixed_step,
        )
    except UsageError as exc:
        print(f"elastic_generalization: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"P = {args.workers}, L = {args.recovery_threshold}, {args.points} x {args.features} "
        f"training, {test} test points, {args.steps} steps, "
        f"{'fixed step' if args.fixed_step else 'line search'}; events: "
        + (f"{len(events)} steps with failures or replacements" if events else "none")
    )
    try:
        with tempfile.TemporaryDirectory() as root:
            records = simulate(problem, settings, root)
    except UsageError as exc:
        print(f"elastic_generalization: error: {exc}", file=sys.stderr)
        return 2
    curves = {m: [r for r in records if r["method"] == m] for m in METHODS}
    print(f"\n{'method':<10} {'test loss at steps':>20}")
    marks = sorted({0, args.steps // 4, args.steps // 2, 3 * args.steps // 4, args.steps - 1})
    print(f"{'':<10} " + " ".join(f"{s:>10}" for s in marks) + f" {'max grad err':>13}")
    for method, rows in curves.items():
        err = max(r["grad_rel_error"] for r in rows)
        print(
            f"{method:<10} "
            + " ".join(f"{rows[s]['test_loss']:>10.4g}" for s in marks)
            + f" {err:>13.1e}"
        )
    if args.out:
        plot(
            curves,
            events,
            args.out,
            f"P = {args.workers}, L = {args.recovery_threshold}, "
            f"{args.points} x {args.features} (synthetic)",
        )
    return 0


def plot(curves: dict, events: list[dict], out: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    styles = {
        "nofailure": ("0.55", "-", 5.0),
        "coded": ("tab:blue", "--", 1.8),
        "ignore": ("tab:red", "-", 1.5),
        "distr_bgd": ("tab:green", ":", 2.0),
    }
    for method, rows in curves.items():
        colour, ls, lw = styles[method]
        ax.plot(
            [r["step"] for r in rows],
            [r["test_loss"] for r in rows],
            ls,
            color=colour,
            lw=lw,
            label=method,
        )
    for e in events:
        ax.axvline(e["step"], color="k", lw=0.6, alpha=0.3)
    ax.set_yscale("log")
    ax.set_xlabel("iteration (vertical lines: failures and replacements)")
    ax.set_ylabel("test loss |X w - y|^2 / 2N (held out)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"\nplot: {out}")


if __name__ == "__main__":
    sys.exit(main())
