"""A run's records on disk, read back: ``metrics.jsonl``, one JSON object per line (an epoch of
the training job, a step and method of the elastic ones), as the jobs write it. The cluster
command, the scripts and the tests read it here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS = "metrics.jsonl"


def metrics_path(run_dir: Path) -> Path:
    """Where a run directory's records are."""
    return Path(run_dir) / METRICS


def read_metrics(where: Path) -> list[dict[str, Any]]:
    """The records of a run directory (or of a ``metrics.jsonl`` file itself), in order."""
    path = Path(where)
    path = path if path.name == METRICS else metrics_path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def recorded_lines(path: Path | None) -> int:
    """Records written so far (0 before the file exists): a running job's progress."""
    try:
        return path.read_bytes().count(b"\n") if path is not None else 0
    except FileNotFoundError:
        return 0


def verified_records(run_dir: Path, caller: str) -> list[dict[str, Any]]:
    """A finished job's records; ``SystemExit`` naming ``caller`` unless every epoch was
    verified."""
    rows = read_metrics(run_dir)
    if not all(r["verified"] for r in rows):
        raise SystemExit(f"{caller}: error: {run_dir}: an epoch not verified")
    return rows
