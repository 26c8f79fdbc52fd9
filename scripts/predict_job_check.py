#!/usr/bin/env python3
"""``coded-shuffle predict --job`` against every training run measured on the emulated cluster
(``docs/measured_runs.json``: the docs' tables as data, each with the job's profile recorded
when it was measured): per run the predicted seconds to the epoch it was timed at beside the
measured ones, their ratio, and per table whether the prediction names the same fastest run;
the runs the model's constants were fitted on (``fit``) apart from those that check them
(``check``).

    python scripts/predict_job_check.py            # the check, from the recorded profiles
    python scripts/predict_job_check.py --record   # profile every table's job on this machine
                                                   # anew (quiet!), then the check

A row is within the target when the ratio is within 0.85..1.15.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from coded_shuffle.tools.measured import SETS, TARGET, Table, load, predicted, save
from coded_shuffle.tools.predict_job import profile_of

RUNS = Path(__file__).resolve().parent.parent / "docs" / "measured_runs.json"


def record(tables: list[Table]) -> list[Table]:
    """Every table with its job profiled on this machine now."""
    out = []
    for t in tables:
        out.append(replace(t, profile=profile_of(list(t.overrides))))
        print(f"recorded: {t.title}", file=sys.stderr, flush=True)
    return out


def check(table: Table) -> tuple[int, int, bool | None]:
    """Prints the table's rows; returns (rows within the target, rows, same fastest: None for
    a table of one run)."""
    print(f"\n[{table.set}] {table.title}")
    print(f"{'run':46s} {'epoch':>5s} {'measured':>9s} {'predicted':>9s} {'ratio':>6s}")
    within, guesses, measured, plans = 0, {}, {}, {}
    for m in table.runs:
        seconds = predicted(table, m, plans)  # plans: the table's loads, made once
        ratio = seconds / m.seconds
        label = m.label + ("" if m.prefetch else " blocking")
        guesses[label], measured[label] = seconds, m.seconds
        within += abs(ratio - 1) <= TARGET
        flag = "" if abs(ratio - 1) <= TARGET else "  outside 15%"
        print(f"{label:46s} {m.epochs:5d} {m.seconds:9.2f} {seconds:9.2f} {ratio:6.2f}{flag}")
    if len(table.runs) < 2:
        return within, 1, None
    fastest, guess = min(measured, key=measured.get), min(guesses, key=guesses.get)
    same = fastest == guess
    print(f"fastest measured: {fastest}; predicted: {guess}{'' if same else '  (differs)'}")
    return within, len(table.runs), same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="profile every job anew first")
    parser.add_argument("--runs", type=Path, default=RUNS, help="the measured runs (JSON)")
    args = parser.parse_args(argv)
    tables = load(args.runs)
    if args.record:
        tables = record(tables)
        save(args.runs, tables)
    print("predict --job against the measured runs (ratio: predicted / measured seconds)")
    for name in SETS:
        total = rows = 0
        fastest = []
        for table in (t for t in tables if t.set == name):
            w, n, same = check(table)
            total, rows = total + w, rows + n
            fastest += [] if same is None else [same]
        print(
            f"\n{name}: {total} of {rows} runs within 15%; the same fastest run in "
            f"{sum(fastest)} of the {len(fastest)} tables of two runs or more\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
