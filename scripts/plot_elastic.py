"""Plots an ``elastic_gd`` run directory: ``python scripts/plot_elastic.py RUN_DIR [-o OUT.png]``.

Four panels from ``RUN_DIR/metrics.jsonl``: training loss against step for every method with
the elastic events marked; the gradient's relative error against the exact full gradient;
rows used per worker against the number ``n`` of available workers (coded beside ``N/n``); and
the bytes each method moved at every event. Default output: ``RUN_DIR/elastic.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from coded_shuffle.tools.records import metrics_path, read_metrics

STYLE = {  # method: (label, colour, line style, width, z-order)
    "nofailure": ("no failure (uncoded)", "0.55", "-", 5.0, 1),
    "coded": ("coded elastic", "tab:blue", "--", 1.8, 4),
    "ignore": ("ignore lost part", "tab:red", "-", 1.8, 3),
    "repartition": ("uncoded re-partition", "tab:green", ":", 2.2, 2),
    "distr_bgd": ("Elastic Distr-BGD", "tab:purple", "-.", 1.6, 2),
}


def load(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    path = metrics_path(run_dir)
    if not path.exists():
        raise SystemExit(f"plot_elastic: error: {path} not found (is it an elastic_gd run?)")
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in read_metrics(path):
        if "method" in r:
            runs.setdefault(r["method"], []).append(r)
    if not runs:
        raise SystemExit(f"plot_elastic: error: {path} has no elastic_gd records")
    return runs


def events(runs: dict[str, list[dict[str, Any]]]) -> list[tuple[int, str]]:
    """(step, text) of every event, from the first method that applied events."""
    for method in ("coded", "repartition", "ignore", "nofailure"):
        found = [(r["step"], "; ".join(r["events"])) for r in runs.get(method, []) if r["events"]]
        if found:
            return found
    return []


def mark_events(ax: plt.Axes, marks: list[tuple[int, str]], labels: bool) -> None:
    for step, text in marks:
        ax.axvline(step, color="k", lw=0.8, ls="-.", alpha=0.6)
        if labels:
            ax.annotate(
                text,
                (step, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -3),
                textcoords="offset points",
                va="top",
                fontsize=8,
                rotation=90,
            )


def plot_loss(ax: plt.Axes, runs: dict[str, list[dict[str, Any]]]) -> None:
    for method, rs in runs.items():
        label, colour, ls, lw, z = STYLE.get(method, (method, None, "-", 1.5, 2))
        steps, loss = [r["step"] for r in rs], [r["train_loss"] for r in rs]
        ax.plot(steps, loss, ls, color=colour, lw=lw, label=label, zorder=z)
    tail = [r["train_loss"] for rs in runs.values() for r in rs if r["step"] >= 3]
    if tail:  # the first steps' steep drop would flatten everything after it
        low, top = min(tail), max(tail)
        pad = 0.06 * (top - low) or 0.05 * abs(top) or 1.0
        ax.set_ylim(low - pad, top + 2 * pad)
    ax.set_xlabel("gradient-descent step")
    ax.set_ylabel("training loss (full data)")
    ax.set_title("Training loss (steps 0-2 above the top edge)")
    ax.legend(fontsize=8, loc="upper right")


def plot_error(ax: plt.Axes, runs: dict[str, list[dict[str, Any]]]) -> None:
    for method, rs in runs.items():
        label, colour, ls, lw, _ = STYLE.get(method, (method, None, "-", 1.5, 2))
        err = np.maximum([r["grad_rel_error"] for r in rs], 1e-17)
        ax.semilogy([r["step"] for r in rs], err, ls, color=colour, lw=min(lw, 2.5), label=label)
    ax.axhline(1e-9, color="k", lw=0.8, ls=":")
    ax.annotate("1e-9", (0, 1e-9), xytext=(2, 2), textcoords="offset points", fontsize=8)
    ax.set_xlabel("gradient-descent step")
    ax.set_ylabel("|g - g_exact| / |g_exact|")
    ax.set_title("Gradient error against the exact full gradient")


def plot_rows(ax: plt.Axes, runs: dict[str, list[dict[str, Any]]], points: int | None) -> None:
    for method in ("coded", "repartition", "ignore"):
        rs = runs.get(method)
        if not rs:
            continue
        label, colour, _, _, _ = STYLE[method]
        seen = sorted({(r["workers_available"], r["rows_used_max"]) for r in rs})
        marker = {"coded": "o", "repartition": "x", "ignore": "s"}[method]
        size = {"coded": 9, "repartition": 9, "ignore": 6}[method]
        xs, ys = zip(*seen, strict=True)
        ax.plot(xs, ys, marker, color=colour, ms=size, mfc="none", mew=2, label=label)
    if points:
        every_n = [r["workers_available"] for rs in runs.values() for r in rs]
        n = np.arange(max(1, min(every_n) - 1), max(every_n) + 2)
        ax.plot(n, points / n, "-", color="0.3", lw=1, label="N / n", zorder=0)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("available workers n")
    ax.set_ylabel("rows used per worker (max)")
    ax.set_title("Work per worker")
    ax.legend(fontsize=8)


def plot_bytes(ax: plt.Axes, runs: dict[str, list[dict[str, Any]]]) -> None:
    marks = events(runs)
    methods = [m for m in ("coded", "repartition", "ignore") if m in runs]
    if not marks or not methods:
        ax.text(0.5, 0.5, "no elastic events", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    width = 0.8 / len(methods)
    for k, method in enumerate(methods):
        label, colour, _, _, _ = STYLE[method]
        by_step = {r["step"]: r["moved_bytes"] for r in runs[method]}
        heights = [by_step.get(step, 0) / 1024 for step, _ in marks]
        xs = np.arange(len(marks)) + (k - (len(methods) - 1) / 2) * width
        bars = ax.bar(xs, heights, width, color=colour, label=label)
        ax.bar_label(bars, [f"{h:.1f}" for h in heights], fontsize=7)
    ax.set_xticks(np.arange(len(marks)), [f"step {s}\n{t}" for s, t in marks], fontsize=8)
    ax.set_ylabel("bytes moved (KiB)")
    ax.set_title("Data moved at each event")
    ax.legend(fontsize=8)


def plot(run_dir: Path, out: Path) -> Path:
    runs = load(run_dir)
    summary_path = run_dir / "elastic_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    marks = events(runs)
    plot_loss(axes[0, 0], runs)
    mark_events(axes[0, 0], marks, labels=True)
    plot_error(axes[0, 1], runs)
    mark_events(axes[0, 1], marks, labels=False)
    plot_rows(axes[1, 0], runs, summary.get("points"))
    plot_bytes(axes[1, 1], runs)
    if summary:
        fig.suptitle(
            f"Coded elastic gradient descent: P={summary['workers']} workers, "
            f"L={summary['recovery_threshold']}, N={summary['points']}, d={summary['features']}"
        )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args(argv)
    out = plot(args.run_dir, args.output or args.run_dir / "elastic.png")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
