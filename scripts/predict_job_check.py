#!/usr/bin/env python3
"""``coded-shuffle predict --job`` against every training run measured in docs/benchmarks.md
and docs/decentralized.md: for each run, the predicted seconds to the epoch the run was
timed at (the target accuracy's epoch, or the end) beside the measured seconds, their ratio,
and per table whether the prediction names the same fastest run.

The measured figures are the docs' tables, copied here as data (each table's command is in
the docs); the predictions are computed now, on this machine (the model's step time is
measured here). A row is within the issue's target when the ratio is within 0.85..1.15.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

from coded_shuffle.tools.predict_job import Loads as PlannedLoads
from coded_shuffle.tools.predict_job import Option, network, price, profile_job

TARGET = 0.15  # within 15% of each run's seconds
UNMIXED = {"coverage_min": float("nan"), "label_tv_max": float("nan")}  # seconds only here


@dataclass(frozen=True)
class Measured:
    label: str  # policy/scheme[@T]/transport, as the docs' tables write it
    epochs: int  # the epoch the seconds were taken at
    seconds: float


@dataclass(frozen=True)
class Table:
    title: str
    medium: str
    rate: str
    master_rate: str | None
    overrides: tuple[str, ...]
    runs: tuple[Measured, ...]


DIGITS = (
    "data.placement=by_label",
    "epochs=10",
    "dist.chunk_bytes=8192",
    "dist.multicast.rate=3800kbit",
)


def digits_runs(seconds: list[float], epochs: list[int]) -> tuple[Measured, ...]:
    """The digits tables' nine rows, in their order."""
    labels = (
        "full/cycles/chain",
        "full/cycles/multicast",
        "full/uncoded/unicast",
        "full/uncoded/p2p",
        "partial0.25/cycles/chain",
        "partial0.25/cycles/multicast",
        "partial0.25/uncoded/unicast",
        "partial0.25/uncoded/p2p",
        "none/uncoded/unicast",
    )
    return tuple(Measured(a, e, s) for a, e, s in zip(labels, epochs, seconds, strict=True))


K8_MLP = (
    "workers=8",
    "data=synthetic",
    "data.points=40000",
    "data.features=500",
    "model=mlp",
    "epochs=4",
    "optim.average_every=20",
    "dist.multicast.rate=99mbit",
)

TABLES = (
    Table(
        "digits, shared 4 Mbit/s, H = 0 (docs/benchmarks.md)",
        "shared",
        "4mbit",
        None,
        (*DIGITS, "optim.average_every=0"),
        digits_runs(
            [30.14, 27.82, 29.22, 29.47, 20.99, 20.56, 20.70, 20.88, 26.87],
            [4, 4, 4, 4, 3, 3, 3, 3, 4],
        ),
    ),
    Table(
        "digits, shared 4 Mbit/s, H = 1000",
        "shared",
        "4mbit",
        None,
        (*DIGITS, "optim.average_every=1000"),
        digits_runs(
            [6.71, 4.53, 5.29, 6.30, 4.35, 3.97, 3.94, 4.12, 4.87], [4, 4, 4, 4, 4, 4, 4, 4, 6]
        ),
    ),
    Table(
        "digits, switch 4 Mbit/s, H = 0",
        "switch",
        "4mbit",
        None,
        (*DIGITS, "optim.average_every=0"),
        digits_runs(
            [8.58, 8.50, 9.25, 8.12, 6.09, 6.08, 6.14, 5.97, 7.56], [4, 4, 4, 4, 3, 3, 3, 3, 4]
        ),
    ),
    Table(
        "digits, switch 4 Mbit/s, H = 1000",
        "switch",
        "4mbit",
        None,
        (*DIGITS, "optim.average_every=1000"),
        digits_runs(
            [2.86, 2.83, 3.54, 2.41, 2.23, 2.11, 2.19, 1.93, 2.38], [4, 4, 4, 4, 4, 4, 4, 4, 6]
        ),
    ),
    Table(
        "reshuffle-bound 1 GB, shared 400 Mbit/s (docs/benchmarks.md)",
        "shared",
        "400mbit",
        None,
        (
            "data=synthetic",
            "data.points=124937",
            "data.features=2000",
            "model=logreg",
            "epochs=6",
            "optim.batch_size=512",
            "optim.lr=0.01",
        ),
        tuple(
            Measured(a, 6, s)
            for a, s in (
                ("full/cycles/multicast", 75.1),
                ("full/uncoded/unicast", 114.2),
                ("full/uncoded/p2p", 118.8),
                ("full/uncoded/multicast", 113.6),
                ("partial0.25/cycles/multicast", 44.6),
                ("partial0.25/uncoded/unicast", 56.0),
                ("none/uncoded/unicast", 36.9),
            )
        ),
    ),
    Table(
        "remote store: shared 200 Mbit/s, master 50 Mbit/s (docs/decentralized.md)",
        "shared",
        "200mbit",
        "50mbit",
        (
            "data=synthetic",
            "data.points=20000",
            "data.features=500",
            "model=logreg",
            "epochs=6",
            "optim.batch_size=1024",
            "dist.multicast.rate=198mbit",
        ),
        tuple(
            Measured(a, 6, s)
            for a, s in (
                ("full/decentralized@2/peer-multicast", 11.6),
                ("full/decentralized@2/peer-unicast", 33.1),
                ("full/uncoded/p2p", 14.1),
                ("full/cycles/multicast", 20.7),
                ("full/uncoded/unicast", 32.8),
            )
        ),
    ),
    Table(
        "0.5 GB, switch 400 Mbit/s (docs/benchmarks.md, Predicting a run: not calibrated on)",
        "switch",
        "400mbit",
        None,
        (
            "data=synthetic",
            "data.points=62500",
            "data.features=2000",
            "model=logreg",
            "epochs=4",
            "optim.batch_size=512",
            "optim.lr=0.01",
            "dist.multicast.rate=396mbit",
        ),
        tuple(
            Measured(a, 4, s)
            for a, s in (
                ("full/cycles/multicast", 27.22),
                ("full/uncoded/unicast", 38.17),
                ("full/uncoded/p2p", 22.23),
            )
        ),
    ),
    Table(
        "MLP, local SGD H = 20, shared 100 Mbit/s (Predicting a run: not calibrated on)",
        "shared",
        "100mbit",
        None,
        (
            "data=synthetic",
            "data.points=20000",
            "data.features=500",
            "model=mlp",
            "epochs=5",
            "optim.average_every=20",
            "dist.multicast.rate=99mbit",
        ),
        tuple(
            Measured(a, 5, s)
            for a, s in (
                ("full/cycles/multicast", 21.54),
                ("full/uncoded/unicast", 26.28),
                ("partial0.25/cycles/multicast", 17.58),
            )
        ),
    ),
    Table(
        "K = 8, MLP, local SGD H = 20, shared 100 Mbit/s (not calibrated on)",
        "shared",
        "100mbit",
        None,
        K8_MLP,
        tuple(
            Measured(a, 4, s)
            for a, s in (("full/cycles/multicast", 39.98), ("full/uncoded/unicast", 47.63))
        ),
    ),
    Table(
        "K = 8, the same job on a switch of 100 Mbit/s (not calibrated on)",
        "switch",
        "100mbit",
        None,
        K8_MLP,
        (Measured("full/uncoded/p2p", 4, 16.76),),
    ),
)


def option_of(label: str) -> tuple[Option, float]:
    """``policy/scheme[@T]/transport`` as an option and its storage."""
    policy, scheme, transport = label.split("/")
    name, _, storage = scheme.partition("@")
    shuffle = "partial" if policy.startswith("partial") else policy
    fraction = float(policy.removeprefix("partial")) if shuffle == "partial" else 1.0
    return Option(name, transport, shuffle, fraction), float(storage or 1)


def check(table: Table) -> tuple[int, int, bool | None]:
    """Prints the table's rows; returns (rows within the target, rows, same fastest: None for
    a table of one run)."""
    base = profile_job(list(table.overrides))
    print(f"\n{table.title}")
    print(f"{'run':40s} {'epoch':>5s} {'measured':>9s} {'predicted':>9s} {'ratio':>6s}")
    within, predicted = 0, {}
    for m in table.runs:
        option, storage = option_of(m.label)
        job = replace(
            base,
            storage=storage,
            scheme=option.scheme,
            transport=option.transport,
            shuffle=option.shuffle,
            fraction=option.fraction,
        )
        net = network(table.medium, table.rate, table.master_rate, 1500, job)
        run = price(option, job, net, PlannedLoads(job, net), UNMIXED)
        seconds = sum(run.epoch_seconds[: m.epochs])
        predicted[m.label] = seconds
        ratio = seconds / m.seconds
        within += abs(ratio - 1) <= TARGET
        flag = "" if abs(ratio - 1) <= TARGET else "  outside 15%"
        print(f"{m.label:40s} {m.epochs:5d} {m.seconds:9.2f} {seconds:9.2f} {ratio:6.2f}{flag}")
    if len(table.runs) < 2:
        return within, 1, None
    fastest = min(table.runs, key=lambda m: m.seconds).label
    guess = min(predicted, key=predicted.__getitem__)
    same = fastest == guess
    print(f"fastest measured: {fastest}; predicted: {guess}{'' if same else '  (differs)'}")
    return within, len(table.runs), same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    print("predict --job against the measured runs (ratio: predicted / measured seconds)")
    total = rows = 0
    fastest = []
    for table in TABLES:
        w, n, same = check(table)
        total, rows = total + w, rows + n
        fastest += [] if same is None else [same]
    print(
        f"\n{total} of {rows} runs within 15%; the same fastest run in {sum(fastest)} of the "
        f"{len(fastest)} tables of two runs or more"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
