"""Run records: ``metrics.jsonl`` (one object per epoch), ``summary.json``, console progress
lines and optional TensorBoard scalars (skipped when tensorboard is not installed)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from coded_shuffle.tools.records import metrics_path

log = logging.getLogger("train")

# Keys every epoch object carries (docs/training.md explains each one).
EPOCH_KEYS = (
    "epoch",
    "epoch_seconds",
    "elapsed_seconds",
    "phase",
    "scheme",
    "workers",
    "storage",
    "storage_used",
    "points",
    "point_bytes",
    "train_loss",
    "test_loss",
    "test_accuracy",
    "broadcast_bytes",
    "payload_bytes",
    "header_bytes",
    "messages",
    "uncoded_bytes",
    "lower_bound_bytes",
    "lower_bound_points",
    "lower_bound_exact",
    "load_points",
    "uncoded_points",
    "saved_percent",
    "transport",
    "master_egress_bytes",
    "host_ingress_bytes_max",
    "host_egress_bytes_max",
    "network_bytes",
    "host_cpu_seconds",
    "cpu_seconds_per_gb_max",
    "param_bytes",
    "allreduce_payload_bytes",
    "delivery_seconds",
    "plan_seconds",
    "encode_seconds",
    "decode_seconds",
    "verified",
    "stored_points_max",
    "worker_stored_bytes_max",
    "coverage_min",
    "label_tv_max",
)

# an epoch's record after a restart: after the epoch before it, or inside it at a step
RESUMED_KEYS = {"resumed_after_epoch", "resumed_at_step"}

# what the record of the placement after a change in the number of workers says of it
RESIZE_KEYS = (
    "epoch",
    "workers_before",
    "workers_after",
    "resize_bytes",
    "fresh_placement_bytes",
    "reused_points",
)

SCALARS = ("train_loss", "test_loss", "test_accuracy", "broadcast_bytes", "uncoded_bytes")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def progress_line(row: dict[str, Any], epochs: int) -> str:
    """One console line per epoch: loss, accuracy, link bytes coded vs uncoded, delivery time."""
    what = "placement (uncoded)" if row["phase"] == "placement" else row["scheme"]
    what = f"{what} over {row['transport']}"
    foreign, refused = row.get("foreign_datagrams", 0), row.get("refused_connections", 0)
    away = (
        f" | turned away {foreign} datagrams, {refused} connections" if foreign or refused else ""
    )
    return (
        f"epoch {row['epoch']:>3}/{epochs} {what}: train_loss {row['train_loss']:.4f} "
        f"test_loss {row['test_loss']:.4f} acc {row['test_accuracy']:.3f} | link "
        f"{human_bytes(row['broadcast_bytes'])} vs uncoded {human_bytes(row['uncoded_bytes'])} "
        f"({row['saved_percent']:.1f}% saved) | master sent "
        f"{human_bytes(row['master_egress_bytes'])} | delivery {row['delivery_seconds']:.3f} s"
        f"{away}{'' if row['verified'] else ' NOT VERIFIED'}"
    )


class MetricsWriter:
    """Writes the run directory's records (master only)."""

    def __init__(self, run_dir: Path, epochs: int, tensorboard: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.epochs = epochs
        self.path = metrics_path(self.run_dir)
        self.path.write_text("")
        self.rows: list[dict[str, Any]] = []
        self.tb = _tensorboard(self.run_dir) if tensorboard else None

    def resume(self, rows: list[dict[str, Any]]) -> None:
        """After a restart: the records of the epochs already done, as they were."""
        self.rows = list(rows)
        self.path.write_text("".join(json.dumps(r, sort_keys=False) + "\n" for r in rows))

    def epoch(self, row: dict[str, Any]) -> None:
        missing = [k for k in EPOCH_KEYS if k not in row]
        if missing:
            raise KeyError(f"epoch metrics lack {missing}")
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row, sort_keys=False) + "\n")
        log.info(progress_line(row, self.epochs))
        if self.tb is not None:
            for key in SCALARS:
                self.tb.add_scalar(key, row[key], row["epoch"])
            self.tb.flush()

    def summary(self, extra: dict[str, Any]) -> dict[str, Any]:
        rows = self.rows
        coded = [r for r in rows if r["phase"] == "coded"]

        def total(key: str, of: list[dict[str, Any]]) -> float:
            return sum(r[key] for r in of)

        coded_bytes, uncoded_bytes = total("broadcast_bytes", coded), total("uncoded_bytes", coded)
        out = {
            "epochs": len(rows),
            "broadcast_bytes_total": total("broadcast_bytes", rows),
            "uncoded_bytes_total": total("uncoded_bytes", rows),
            "lower_bound_bytes_total": total("lower_bound_bytes", rows),
            "placement_bytes": total("broadcast_bytes", rows) - coded_bytes,
            "coded_epochs_broadcast_bytes": coded_bytes,
            "coded_epochs_uncoded_bytes": uncoded_bytes,
            "coded_epochs_lower_bound_bytes": total("lower_bound_bytes", coded),
            "coded_epochs_saved_percent": saved_percent(coded_bytes, uncoded_bytes),
            "transport": rows[0]["transport"] if rows else None,
            "master_egress_bytes_total": total("master_egress_bytes", rows),
            "network_bytes_total": total("network_bytes", rows),
            "coded_epochs_network_bytes": total("network_bytes", coded),
            "coded_epochs_master_egress_bytes": total("master_egress_bytes", coded),
            "coded_epochs_delivery_seconds": total("delivery_seconds", coded),
            "param_bytes_total": total("param_bytes", rows),
            "allreduce_payload_bytes_total": total("allreduce_payload_bytes", rows),
            "delivery_seconds_total": total("delivery_seconds", rows),
            "all_verified": all(r["verified"] for r in rows),
            "restarts": sum(1 for r in rows if RESUMED_KEYS & r.keys()),
            "resizes": [{k: r.get(k) for k in RESIZE_KEYS} for r in rows if "workers_before" in r],
            "replacement_bytes_total": sum(
                r.get("replacement_bytes", 0) + r.get("rebatch_bytes", 0) for r in rows
            ),
            "stored_points_max": max((r["stored_points_max"] for r in rows), default=0.0),
            "final_train_loss": rows[-1]["train_loss"] if rows else None,
            "final_test_loss": rows[-1]["test_loss"] if rows else None,
            "final_test_accuracy": rows[-1]["test_accuracy"] if rows else None,
            **extra,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(out, indent=2) + "\n")
        if self.tb is not None:
            self.tb.close()
        return out


def saved_percent(coded: float, uncoded: float) -> float:
    """Percent of the uncoded bytes that the coded delivery saves."""
    return 100.0 * (1.0 - coded / uncoded) if uncoded else 0.0


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.info("tensorboard is not installed: TensorBoard scalars skipped")
        return None
    return SummaryWriter(str(run_dir / "tb"))
