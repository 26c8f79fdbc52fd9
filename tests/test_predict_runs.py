"""``predict --job`` against the measured runs (``docs/measured_runs.json``): every run, of the
set its constants were fitted on and of the set that checks them, within 15% of its measured
seconds, from the job's profile recorded when it was measured (no timing here); the check set
holds what the fit set does not (other minibatches, records, media, prefetching or not); every
term of the run model is load-bearing (without it some measured run is beyond 15%; the shares
of the digests' CPU that overlap the network excepted: the digests are a small cost, and the
shares move the mean error, not any run beyond 15%); and every
constant sits where the fitted runs put it (``scripts/fit_run_model.py``): a third more or
less of any of them makes the fitted runs' mean error larger."""

from __future__ import annotations

from pathlib import Path

import pytest

from coded_shuffle.costs import run as run_model
from coded_shuffle.tools import measured

RUNS = Path(__file__).resolve().parent.parent / "docs" / "measured_runs.json"
TABLES = measured.load(RUNS)
FIT = [t for t in TABLES if t.set == "fit"]
CONSTANTS = sorted(measured.model_constants())
PLANS: dict[str, dict] = {}  # every table's planned loads (they do not depend on the constants)


def outside() -> list[str]:
    """The runs whose prediction is beyond 15% of their measured seconds."""
    return [
        f"{table.title}: {run.label} {ratio:.2f}"
        for table, run, ratio in measured.ratios(TABLES, PLANS)
        if abs(ratio - 1) > measured.TARGET
    ]


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


@pytest.mark.parametrize("name", sorted(set(CONSTANTS) - set(measured.SHARES)))
def test_without_any_term_of_the_model_some_run_is_beyond_15_percent(name, monkeypatch):
    monkeypatch.setattr(run_model, name, measured.scaled(name, getattr(run_model, name), 0.0))
    assert outside(), f"{name} = 0: every run still within 15%"


@pytest.mark.parametrize("factor", [2 / 3, 4 / 3])
@pytest.mark.parametrize("name", CONSTANTS)
def test_a_third_more_or_less_of_any_constant_fits_the_fitted_runs_worse(name, factor, monkeypatch):
    fitted = measured.mean_error(FIT, PLANS)
    monkeypatch.setattr(run_model, name, measured.scaled(name, getattr(run_model, name), factor))
    assert measured.mean_error(FIT, PLANS) > fitted, (
        f"{name} x {factor:.2f} fits the fitted runs as well"
    )
