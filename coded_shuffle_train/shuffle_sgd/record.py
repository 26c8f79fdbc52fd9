"""The record of one epoch of the job (a line of ``metrics.jsonl``: docs/training.md,
"Outputs"), typed and built in one place (``Master.epoch``) from its parts: the delivery's
report, what the shuffles have mixed, what a restart cost, what the training added."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coded_shuffle.distributed.delivery_report import Report, flat


@dataclass(frozen=True, kw_only=True, eq=False)
class Trained(Report):
    """What the epoch's training and the master's evaluation add: the slowest worker's
    seconds of steps and of waiting for its batch, the test loss and accuracy, the training
    loss, the bytes of the parameters sent to the master and of the workers' all-reduce."""

    train_seconds: float
    wait_seconds: float  # the slowest worker's wait for its batch (the master's is replaced)
    test_loss: float
    test_accuracy: float
    train_loss: float
    param_bytes: int
    allreduce_payload_bytes: int


@dataclass(frozen=True, kw_only=True, eq=False)
class EpochRecord(Report):
    """One epoch's record: the delivery's keys (``cs.report``, or the saved report of an
    epoch resumed inside), the attempt, the mixing (``coverage_min``, ``label_tv_max``), what
    a restart cost (``resumed_after_epoch``, ``replaced_workers``, ...), the training's keys,
    and the clocks: the epoch's seconds (delivery, training, evaluation), the seconds since
    the run's first epoch began (restarts included) and when the record was made (Unix)."""

    delivery: Mapping[str, Any] = flat()
    attempt: int
    mixing: Mapping[str, float] = flat()
    restart: Mapping[str, Any] = flat()
    trained: Trained
    epoch_seconds: float
    elapsed_seconds: float
    time: float
