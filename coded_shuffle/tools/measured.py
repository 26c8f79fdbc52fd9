"""The training runs measured on the emulated cluster, as data (``docs/measured_runs.json``):
what ``predict --job`` is fitted on and checked against (docs/benchmarks.md, "Predicting a
run"), read by ``scripts/predict_job_check.py`` and the tests alike.

Each table is one job on one cluster (its medium, rates and MTU; the job's overrides, as
``coded-shuffle predict --job`` takes them) with the job's profile recorded when the runs
were measured (``python -m coded_shuffle_train --profile``: the model's step timed on that
machine, so that the check is the same wherever it runs), and its runs: which option
(``policy/scheme[@T]/transport``), with prefetch or not, and the seconds to the end of which
epoch. A table belongs to the set its constants were fitted on (``fit``) or to the set that
checks them (``check``): no constant of :mod:`coded_shuffle.costs.run` was fitted on a
``check`` run.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from coded_shuffle.costs import run as run_model
from coded_shuffle.errors import UsageError
from coded_shuffle.tools.predict_job import (
    JobRun,
    Loads,
    Option,
    job_from_profile,
    network,
    price,
)

SETS = ("fit", "check")
TARGET = 0.15  # a prediction within 15% of the measured seconds
UNMIXED = {"coverage_min": float("nan"), "label_tv_max": float("nan")}  # seconds only here


@dataclass(frozen=True)
class Measured:
    """One measured run: its option, whether it prefetched, the seconds to ``epochs``."""

    label: str  # policy/scheme[@T]/transport, as the docs' tables write it
    epochs: int
    seconds: float
    prefetch: bool = False

    @property
    def option(self) -> tuple[Option, float]:
        """The option and its storage ``T``."""
        policy, scheme, transport = self.label.split("/")
        name, _, storage = scheme.partition("@")
        shuffle = "partial" if policy.startswith("partial") else policy
        fraction = float(policy.removeprefix("partial")) if shuffle == "partial" else 1.0
        return Option(name, transport, shuffle, fraction), float(storage or 1)


@dataclass(frozen=True)
class Table:
    """One job on one cluster and the runs measured of it."""

    title: str
    set: str  # fit | check
    medium: str
    rate: str
    master_rate: str | None
    mtu: int
    overrides: tuple[str, ...]
    runs: tuple[Measured, ...]
    profile: dict[str, Any] | None = None  # the job's profile when the runs were measured
    source: str = ""

    def job(self) -> JobRun:
        if self.profile is None:
            raise UsageError(f"{self.title}: no recorded profile (--record first)")
        return job_from_profile(self.profile)


def load(path: str | Path) -> list[Table]:
    """The tables of ``path``; one line for a malformed one."""
    raw = json.loads(Path(path).read_text())
    tables = []
    for t in raw["tables"]:
        if t["set"] not in SETS:
            raise UsageError(f"{path}: table {t['title']!r}: set {t['set']!r} not in {SETS}")
        runs = tuple(Measured(**r) for r in t["runs"])
        fields = {**t, "overrides": tuple(t["overrides"]), "runs": runs}
        tables.append(Table(**fields))
    return tables


def save(path: str | Path, tables: list[Table]) -> None:
    """``tables`` to ``path`` (what :func:`load` reads)."""
    out = {"tables": [asdict(t) for t in tables]}
    Path(path).write_text(json.dumps(out, indent=1) + "\n")


def predicted(table: Table, run: Measured, plans: dict[float, Loads] | None = None) -> float:
    """The predicted seconds to ``run.epochs`` of ``run`` (its table's recorded profile, the
    run's option and prefetch; ``plans``: the table's planned loads by storage, kept for the
    next call)."""
    option, storage = run.option
    job = replace(
        table.job(),
        storage=storage,
        scheme=option.scheme,
        transport=option.transport,
        shuffle=option.shuffle,
        fraction=option.fraction,
        prefetch=run.prefetch,
    )
    net = network(table.medium, table.rate, table.master_rate, table.mtu, job)
    plans = {} if plans is None else plans
    if storage not in plans:
        plans[storage] = Loads(job, net)
    priced = price(option, job, net, plans[storage], UNMIXED)
    return sum(priced.epoch_seconds[: run.epochs])


def ratios(
    tables: list[Table], plans: dict[str, dict[float, Loads]] | None = None
) -> list[tuple[Table, Measured, float]]:
    """Every run's predicted over measured seconds (``plans``: every table's planned loads
    by title, kept for the next call: they do not depend on the run model's constants)."""
    plans = {} if plans is None else plans
    return [
        (t, r, predicted(t, r, plans.setdefault(t.title, {})) / r.seconds)
        for t in tables
        for r in t.runs
    ]


def mean_error(tables: list[Table], plans: dict[str, dict[float, Loads]] | None = None) -> float:
    """The runs' mean ``|log(predicted / measured)|``: what ``scripts/fit_run_model.py``
    minimises over the ``fit`` set."""
    found = [abs(math.log(ratio)) for _, _, ratio in ratios(tables, plans)]
    return sum(found) / len(found)


# the run model's constants that are shares of overlap: fractions, so never above 1
SHARES = ("CPU_OVERLAP", "PACED_CPU_OVERLAP")


def model_constants() -> dict[str, float | dict[str, float]]:
    """The run model's constants (:mod:`coded_shuffle.costs.run`'s upper-case floats and
    dicts of floats), by name."""
    return {
        name: value
        for name, value in vars(run_model).items()
        if name.isupper() and isinstance(value, float | dict) and not name.startswith("_")
    }


def scaled(name: str, value: float | dict[str, float], factor: float) -> float | dict[str, float]:
    """Constant ``name``'s ``value`` times ``factor`` (every entry of a dict; a share at most
    1)."""
    if isinstance(value, dict):
        return {k: v * factor for k, v in value.items()}
    return min(1.0, value * factor) if name in SHARES else value * factor
