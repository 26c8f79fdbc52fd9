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


def summary(label: str, tables: list[measured.Table], plans: dict) -> str:
    r = np.array([ratio for _, _, ratio in measured.ratios(tables, plans)])
    within = int(np.sum(np.abs(r - 1) <= measured.TARGET))
    return (
        f"{label:24s} {within:3d} of {r.size:3d} within 15%   {r.min():.2f}-{r.max():.2f}   "
        f"mean |log| {measured.mean_error(tables, plans):.4f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default=str(RUNS), help="the measured runs (JSON)")
    args = ap.parse_args(argv)
    tables = measured.load(args.runs)
    fit = [t for t in tables if t.set == "fit"]
    check = [t for t in tables if t.set == "check"]
    plans: dict[str, dict] = {}
    start = measured.model_constants()
    print(summary("fit, the code's", fit, plans))
    print(summary("check, the code's", check, plans))

    def put(x: np.ndarray) -> None:
        for (name, value), factor in zip(start.items(), np.exp(x), strict=True):
            setattr(run_model, name, measured.scaled(name, value, float(factor)))

    def loss(x: np.ndarray) -> float:
        put(x)
        return measured.mean_error(fit, plans)

    best = minimize(loss, np.zeros(len(start)), method="Powell", options={"xtol": 1e-3})
    put(best.x)
    print(summary("fit, fitted", fit, plans))
    print(summary("check, fitted", check, plans))
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
