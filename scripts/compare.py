#!/usr/bin/env python3
"""Comparison plots of training runs: ``compare.py PATH... --out DIR``.

Every ``PATH`` is a run directory (with ``metrics.jsonl``) or a directory that holds runs below
it (a Hydra sweep directory); anything else a shell glob brings along (Hydra's
``multirun.yaml``, a directory without runs) is skipped with one line. Writes ``loss.png``
(train/test loss and test accuracy against epoch), ``bytes.png`` (bytes on the shared link per
epoch: coded, uncoded, lower bound), ``cumulative.png`` (the same, summed over epochs),
``seconds.png`` (delivery seconds per epoch), ``hosts.png`` (bytes every host sent and
received over the coded epochs), ``time.png`` (test accuracy and test loss against the
seconds since the first epoch began) and ``traffic.png`` (the same against the cumulative
shuffle bytes on the network and out of the master), one line or bar group per run, labelled
``policy/scheme/transport``; prints a one-line summary per run, and with
``--target-accuracy A`` a table of the epochs, seconds and bytes each run took to reach ``A``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from coded_shuffle.tools.records import METRICS, metrics_path, read_metrics


@dataclass
class Run:
    path: Path
    rows: list[dict]
    label: str = ""

    def series(self, key: str) -> np.ndarray:
        return np.array([float(r.get(key, np.nan)) for r in self.rows])

    @property
    def epochs(self) -> np.ndarray:
        return self.series("epoch")


def find_runs(paths: list[str]) -> list[Run]:
    """Runs under the given paths; what holds no run is skipped with one line on stderr."""
    runs = []
    for arg in paths:
        root = Path(arg)
        if not root.exists():
            print(f"compare.py: skipped {arg!r}: does not exist", file=sys.stderr)
            continue
        if root.is_file():
            files = [root] if root.name == METRICS else []
        elif metrics_path(root).is_file():
            files = [metrics_path(root)]
        else:
            files = sorted(root.rglob(METRICS))
        rows = [(f, read_metrics(f)) for f in files]
        rows = [(f, r) for f, r in rows if r]
        if not rows:
            print(f"compare.py: skipped {arg!r}: not a run directory", file=sys.stderr)
            continue
        runs += [Run(f.parent, r) for f, r in rows]
    if not runs:
        raise SystemExit("compare.py: error: no run directory among the paths given")
    return runs


def policy_of(run: Run) -> str:
    """``full``, ``partial0.25`` or ``none`` (runs from before the policies: ``full``)."""
    first = run.rows[0]
    name = first.get("shuffle", "full")
    return f"partial{first.get('fraction', 1.0):g}" if name == "partial" else name


def run_summary(run: Run) -> dict:
    path = run.path / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def label_runs(runs: list[Run]) -> None:
    """``policy/scheme/transport``; local SGD, storage, workers and run directory added where
    needed."""
    for run in runs:
        first = run.rows[0]
        run.label = f"{policy_of(run)}/{first['scheme']}/{first.get('transport', 'tree')}"
    for extra in (
        lambda r: f"H={run_summary(r).get('average_every', 0)}",
        lambda r: run_summary(r).get("placement", "random"),
        lambda r: f"T={r.rows[0]['storage']:g}",
        lambda r: f"K={r.rows[0]['workers']}",
        lambda r: r.path.name,
    ):
        groups: dict[str, list[Run]] = {}
        for run in runs:
            groups.setdefault(run.label, []).append(run)
        for group in groups.values():
            if len(group) > 1 and len({extra(r) for r in group}) > 1:
                for run in group:
                    run.label = f"{run.label} {extra(run)}"


def byte_unit(values: list[float]) -> tuple[float, str]:
    top = max([v for v in values if np.isfinite(v)] or [1.0])
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if top >= scale:
            return float(scale), unit
    return 1.0, "bytes"


def shared(runs: list[Run], key: str) -> np.ndarray | None:
    """The series if every run has the same one (same seed and shuffles), else None."""
    first = runs[0].series(key)
    same = all(
        r.series(key).shape == first.shape and np.allclose(r.series(key), first) for r in runs
    )
    return first if same else None


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def styles(n: int) -> list[dict]:
    """Colour, marker and width per run: earlier runs wider, so identical curves stay visible."""
    cmap = plt.get_cmap("tab10")
    widths = np.linspace(3.2, 1.2, n) if n > 1 else [1.8]
    return [
        {
            "color": cmap(i % 10),
            "marker": MARKERS[i % len(MARKERS)],
            "lw": float(widths[i]),
            "ms": 4 + 2 * (n - 1 - i) / max(n - 1, 1),
        }
        for i in range(n)
    ]


def plot_loss(runs: list[Run], out: Path) -> Path:
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2))
    for run, st in zip(runs, styles(len(runs)), strict=True):
        e = run.epochs
        ax_loss.plot(e, run.series("train_loss"), "-", **st, label=f"{run.label} train")
        ax_loss.plot(e, run.series("test_loss"), "--", **st, label=f"{run.label} test")
        ax_acc.plot(e, 100 * run.series("test_accuracy"), "-", **st, label=run.label)
    title = "Loss (solid: train, dashed: test)"
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy loss", title=title)
    ax_loss.set_yscale("log")
    ax_acc.set(xlabel="epoch", ylabel="test accuracy (%)", title="Test accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if len({tuple(r.series("train_loss")) for r in runs}) == 1 and len(runs) > 1:
        fig.suptitle(
            "identical curves: the scheme changes the bytes on the link, not the model", fontsize=9
        )
    return save(fig, out / "loss.png")


def plot_bytes(runs: list[Run], out: Path, cumulative: bool) -> Path:
    keys = ("broadcast_bytes", "uncoded_bytes", "lower_bound_bytes")
    values = {(id(r), k): r.series(k) for r in runs for k in keys}
    if cumulative:
        values = {key: np.cumsum(v) for key, v in values.items()}
    scale, unit = byte_unit([float(v.max()) for v in values.values()])
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    common = {k: shared(runs, k) for k in keys[1:]}
    for run, st in zip(runs, styles(len(runs)), strict=True):
        e, c = run.epochs, st["color"]
        ax.plot(e, values[(id(run), keys[0])] / scale, "-", **st, label=f"{run.label}")
        if common["uncoded_bytes"] is None:
            uncoded = values[(id(run), keys[1])] / scale
            ax.plot(e, uncoded, "--", color=c, label=f"{run.label} uncoded")
        if common["lower_bound_bytes"] is None:
            bound = values[(id(run), keys[2])] / scale
            ax.plot(e, bound, ":", color=c, label=f"{run.label} bound")
    e = runs[0].epochs
    if common["uncoded_bytes"] is not None:
        ax.plot(
            e,
            values[(id(runs[0]), keys[1])] / scale,
            "--",
            color="black",
            lw=1.2,
            zorder=5,
            label="uncoded (same shuffles)",
        )
    if common["lower_bound_bytes"] is not None:
        ax.plot(
            e,
            values[(id(runs[0]), keys[2])] / scale,
            ":",
            color="black",
            lw=1.5,
            marker="x",
            ms=6,
            zorder=6,
            label="lower bound (payload only)",
        )
    what = "Cumulative bytes on the shared link" if cumulative else "Bytes on the shared link"
    ax.set(xlabel="epoch", ylabel=f"{unit}", title=f"{what} (epoch 1 = uncoded placement)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, out / ("cumulative.png" if cumulative else "bytes.png"))


def plot_seconds(runs: list[Run], out: Path) -> Path:
    """Delivery seconds per epoch (wall clock: first byte out until every worker verified)."""
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    for run, st in zip(runs, styles(len(runs)), strict=True):
        ax.plot(run.epochs, run.series("delivery_seconds"), "-", **st, label=run.label)
    ax.set(xlabel="epoch", ylabel="seconds", title="Delivery time per epoch (epoch 1 = placement)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, out / "seconds.png")


def host_totals(run: Run, key: str) -> np.ndarray:
    """Bytes per host summed over the coded epochs (rank 0 = the master first)."""
    rows = [r for r in run.rows if r.get("phase") == "coded" and key in r]
    if not rows:
        return np.zeros(0)
    return np.sum([np.asarray(r[key], dtype=float) for r in rows], axis=0)


def plot_hosts(runs: list[Run], out: Path) -> Path:
    """Bytes every host sent (and received) over the coded epochs, one bar group per run."""
    fig, (ax_out, ax_in) = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    sent = [host_totals(r, "host_egress_bytes") for r in runs]
    got = [host_totals(r, "host_ingress_bytes") for r in runs]
    scale, unit = byte_unit([float(v.max()) for v in sent + got if v.size])
    width = 0.8 / max(len(runs), 1)
    for i, (run, st) in enumerate(zip(runs, styles(len(runs)), strict=True)):
        for ax, values in ((ax_out, sent[i]), (ax_in, got[i])):
            x = np.arange(values.size) + (i - (len(runs) - 1) / 2) * width
            ax.bar(x, values / scale, width, color=st["color"], label=run.label)
    hosts = max((v.size for v in sent), default=0)
    for ax, what in ((ax_out, "sent (egress)"), (ax_in, "received (ingress)")):
        ax.set_xticks(range(hosts), ["master" if h == 0 else f"w{h - 1}" for h in range(hosts)])
        ax.set(title=f"Bytes each host {what}, coded epochs", xlabel="host")
        ax.grid(alpha=0.3, axis="y")
    ax_out.set_ylabel(unit)
    ax_in.legend(fontsize=8)
    return save(fig, out / "hosts.png")


def cumulative(run: Run, key: str) -> np.ndarray:
    return np.cumsum(np.nan_to_num(run.series(key)))


def plot_time(runs: list[Run], out: Path) -> Path:
    """Test accuracy and test loss against ``elapsed_seconds``."""
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.2))
    for run, st in zip(runs, styles(len(runs)), strict=True):
        t = run.series("elapsed_seconds")
        ax_acc.plot(t, 100 * run.series("test_accuracy"), "-", **st, label=run.label)
        ax_loss.plot(t, run.series("test_loss"), "-", **st, label=run.label)
    ax_acc.set(xlabel="seconds since the first epoch began", ylabel="test accuracy (%)")
    ax_loss.set(xlabel="seconds since the first epoch began", ylabel="test loss")
    ax_loss.set_yscale("log")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, out / "time.png")


def plot_traffic(runs: list[Run], out: Path) -> Path:
    """Test accuracy and test loss against the cumulative shuffle bytes: on the network (every
    host's egress) and out of the master."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    keys = (("network_bytes", "on the network"), ("master_egress_bytes", "out of the master"))
    scale, unit = byte_unit([float(cumulative(r, k)[-1]) for r in runs for k, _ in keys])
    for run, st in zip(runs, styles(len(runs)), strict=True):
        for col, (key, _) in enumerate(keys):
            x = cumulative(run, key) / scale
            axes[0, col].plot(x, 100 * run.series("test_accuracy"), "-", **st, label=run.label)
            axes[1, col].plot(x, run.series("test_loss"), "-", **st, label=run.label)
    for col, (_, where) in enumerate(keys):
        axes[0, col].set(ylabel="test accuracy (%)", title=f"shuffle bytes {where}")
        axes[1, col].set(xlabel=f"cumulative {unit} {where}", ylabel="test loss")
        axes[1, col].set_yscale("log")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, out / "traffic.png")


@dataclass
class ToTarget:
    """What a run took to reach a test accuracy: epochs, seconds, shuffle bytes (or not)."""

    epochs: int | None
    seconds: float = float("nan")
    network_bytes: int = 0
    master_bytes: int = 0


def to_target(run: Run, accuracy: float) -> ToTarget:
    acc = run.series("test_accuracy")
    reached = np.flatnonzero(acc >= accuracy)
    if reached.size == 0:
        return ToTarget(None)
    i = int(reached[0])
    return ToTarget(
        epochs=int(run.epochs[i]),
        seconds=float(run.series("elapsed_seconds")[i]),
        network_bytes=int(cumulative(run, "network_bytes")[i]),
        master_bytes=int(cumulative(run, "master_egress_bytes")[i]),
    )


def target_table(runs: list[Run], accuracy: float) -> list[str]:
    """One line per run: epochs, seconds and bytes to ``accuracy``, or ``not reached``."""
    lines = [
        f"to test accuracy {accuracy:g}:",
        f"{'run':34s} {'epochs':>6s} {'seconds':>9s} {'network bytes':>15s} {'master bytes':>15s}",
    ]
    for run in runs:
        t = to_target(run, accuracy)
        if t.epochs is None:
            best = float(np.nanmax(run.series("test_accuracy")))
            lines.append(f"{run.label:34s} not reached (best {best:.3f})")
            continue
        lines.append(
            f"{run.label:34s} {t.epochs:6d} {t.seconds:9.2f} {t.network_bytes:15,d} "
            f"{t.master_bytes:15,d}"
        )
    return lines


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def summary_line(run: Run) -> str:
    coded = [r for r in run.rows if r.get("phase") == "coded"]
    c = sum(r["broadcast_bytes"] for r in coded)
    u = sum(r["uncoded_bytes"] for r in coded)
    saved = 100 * (1 - c / u) if u else 0.0
    ok = all(r.get("verified") for r in run.rows)
    acc = run.rows[-1].get("test_accuracy", float("nan"))
    seconds = np.median([r["delivery_seconds"] for r in coded]) if coded else float("nan")
    return (
        f"{run.label:28s} coded epochs {c:>12,d} B  uncoded {u:>12,d} B  saved {saved:5.1f}%  "
        f"median delivery {seconds:.3f} s  final acc {acc:.3f}  verified {ok}  ({run.path})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="PATH", help="run or sweep directories")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the PNGs")
    parser.add_argument(
        "--target-accuracy",
        type=float,
        metavar="A",
        help="print the epochs, seconds and bytes every run took to reach test accuracy A",
    )
    args = parser.parse_args(argv)
    if args.target_accuracy is not None and not 0 < args.target_accuracy <= 1:
        parser.error(f"--target-accuracy {args.target_accuracy} out of range (0, 1]")
    runs = find_runs(args.runs)
    label_runs(runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = [
        plot_loss(runs, out),
        plot_bytes(runs, out, False),
        plot_bytes(runs, out, True),
        plot_seconds(runs, out),
        plot_hosts(runs, out),
        plot_time(runs, out),
        plot_traffic(runs, out),
    ]
    for run in runs:
        print(summary_line(run))
    if args.target_accuracy is not None:
        print("\n".join(target_table(runs, args.target_accuracy)))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
