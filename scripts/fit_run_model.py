#!/usr/bin/env python3
"""Fits the run model's constants (:mod:`coded_shuffle.costs.run`) on the ``fit`` runs of
``docs/measured_runs.json`` and prints how both sets come out: the constants that minimise the
fitted runs' mean ``|log(predicted / measured)|`` (scipy's Powell search over a factor per
constant, from the values in the code; a share that overlaps stays within 0..1), then per set
the runs within 15%, the range of predicted / measured and the mean error, with the code's
constants and with the fitted ones. The ``check`` runs take no part in the fit.

    python scripts/fit_run_model.py

The code keeps the fitted values rounded (docs/benchmarks.md, "Predicting a run").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from coded_shuffle.costs import run as run_model
from coded_shuffle.tools import measured

RUNS = Path(__file__).resolve().parent.parent / "docs" / "measured_runs.json"
SHARES = ("CPU_OVERLAP", "PACED_CPU_OVERLAP")  # fractions: at most 1


def constants() -> dict[str, float | dict]:
    """The run model's constants (upper-case floats and dicts of floats)."""
    return {
        name: value
        for name, value in vars(run_model).items()
        if name.isupper() and isinstance(value, float | dict) and not name.startswith("_")
    }


def scaled(name: str, value: float | dict, factor: float) -> float | dict:
    if isinstance(value, dict):
        return {k: v * factor for k, v in value.items()}
    return min(1.0, value * factor) if name in SHARES else value * factor


class Runs:
    """The measured runs of one set, priced with whatever constants the model holds."""

    def __init__(self, tables: list[measured.Table], which: str) -> None:
        self.tables = [t for t in tables if t.set == which]
        self.plans: dict[str, dict] = {t.title: {} for t in self.tables}

    def ratios(self) -> np.ndarray:
        return np.array(
            [
                measured.predicted(t, r, self.plans[t.title]) / r.seconds
                for t in self.tables
                for r in t.runs
            ]
        )

    def error(self) -> float:
        return float(np.mean(np.abs(np.log(self.ratios()))))


def summary(label: str, runs: Runs) -> str:
    r = runs.ratios()
    within = int(np.sum(np.abs(r - 1) <= measured.TARGET))
    return (
        f"{label:24s} {within:3d} of {r.size:3d} within 15%   {r.min():.2f}-{r.max():.2f}   "
        f"mean |log| {np.mean(np.abs(np.log(r))):.4f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default=str(RUNS), help="the measured runs (JSON)")
    args = ap.parse_args(argv)
    tables = measured.load(args.runs)
    fit, check = Runs(tables, "fit"), Runs(tables, "check")
    start = constants()
    print(summary("fit, the code's", fit))
    print(summary("check, the code's", check))

    def put(x: np.ndarray) -> None:
        for (name, value), factor in zip(start.items(), np.exp(x), strict=True):
            setattr(run_model, name, scaled(name, value, float(factor)))

    def loss(x: np.ndarray) -> float:
        put(x)
        return fit.error()

    best = minimize(loss, np.zeros(len(start)), method="Powell", options={"xtol": 1e-3})
    put(best.x)
    print(summary("fit, fitted", fit))
    print(summary("check, fitted", check))
    print(f"\n{'constant':22s} {'code':>12s} {'fitted':>12s}")
    for name, value in start.items():
        now = getattr(run_model, name)
        if isinstance(value, dict):
            for key in value:
                print(f"{name + '.' + key:22s} {value[key]:12.4g} {now[key]:12.4g}")
        else:
            print(f"{name:22s} {value:12.4g} {now:12.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
