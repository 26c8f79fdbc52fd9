"""The master's loop: full-batch gradient descent under elastic events, coded and baselines.

Methods (Yang et al. 2018 sec. 4): ``coded`` (sec. 3.2: cyclic use of stored coded blocks, exact
gradient, nothing moves on a departure), ``nofailure`` (uncoded, all ``P`` workers, scheduled
events ignored), ``ignore`` (uncoded; a departed worker's rows are dropped from the gradient
until a joiner receives them) and ``repartition`` (uncoded; the rows of departed workers are
re-sent to survivors, with the fewest rows moved).

The loop talks to workers only through a :class:`~.protocol.WorkerChannel`, so the same code runs
simulated workers in one process and real ones over torch.distributed. Every step writes one
record; every step is checkpointed, and a restarted master resumes from the checkpoint, treats
the workers lost in the crash as departed and first verifies every survivor's stored data.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from coded_shuffle.codec.blockstore import array_digest
from coded_shuffle.elastic.encoding import block_rows
from coded_shuffle.elastic.methods import RUNS
from coded_shuffle.elastic.problem import Problem
from coded_shuffle.elastic.protocol import WorkerChannel
from coded_shuffle.elastic.settings import METHODS, Settings, make_settings
from coded_shuffle.elastic.sinks import (
    Checkpoint,
    FileCheckpoint,
    JsonlSink,
    ListSink,
    MemoryCheckpoint,
    Sink,
)
from coded_shuffle.errors import UsageError


class ElasticMaster:
    """Runs every configured method in turn; resumes from ``checkpoint`` after a crash."""

    def __init__(
        self,
        problem: Problem,
        settings: Settings,
        transport: WorkerChannel,
        sink: Sink | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        self.problem = problem
        self.settings = settings
        self.transport = transport
        self.sink = sink if sink is not None else ListSink()
        self.checkpoint = checkpoint if checkpoint is not None else MemoryCheckpoint()
        self.lr = problem.step_size(settings.lr)
        self.lost: list[int] = []
        self.restarts = 0
        self.state: dict[str, Any] = {}
        self.fingerprint = fingerprint(problem, settings)

    def run(self, killed: Sequence[int] | None = None) -> None:
        """All methods from the checkpoint on; ``killed``: workers that died since it was saved.

        A restarted master learns of losses from the transport when it can tell (``killed``:
        ranks whose process died without an exit record); otherwise from the checkpoint's
        ``pending_lost``, the worker whose connection failed mid-step. The first is
        authoritative: when the launcher tears the job down, a survivor's connection may fail
        before the dead worker's does.
        """
        saved = self.checkpoint.load()
        if saved is not None and (
            saved.get("finished") or saved.get("fingerprint") != self.fingerprint
        ):
            saved = None  # a finished run, or another configuration: start afresh
        if saved is None:
            self.sink.truncate(lambda r: False)
        start = 0
        self.lost = sorted(set(killed or ()))
        if saved is not None:
            self.restarts = int(saved["restarts"]) + 1
            losses = saved["pending_lost"] if killed is None else killed
            saved = {**saved, "pending_lost": sorted(set(losses))}
            self.lost = sorted({*saved["lost"], *saved["pending_lost"]})
            start = int(saved["method_index"])
            order = self.settings.methods
            done = (start, int(saved["step"]))
            self.sink.truncate(
                lambda r: (
                    (order.index(r["method"]), r["step"]) < done
                    if r.get("method") in order
                    else True
                )
            )
        try:
            for index in range(start, len(self.settings.methods)):
                resume = saved if saved is not None and index == start else None
                RUNS[self.settings.methods[index]](self, index, resume).loop()
        except UsageError as exc:  # too few workers left: the run is over, even if restarted
            self.state = {"finished": True, "stopped": str(exc), "fingerprint": self.fingerprint}
            self.checkpoint.save(self.state)
            raise
        self.state = {"finished": True, "fingerprint": self.fingerprint}
        self.checkpoint.save(self.state)

    def save(self, state: dict[str, Any], pending: Sequence[int] = ()) -> None:
        self.state = {**state, "lost": self.lost, "pending_lost": list(pending)}
        self.state["fingerprint"] = self.fingerprint
        self.state["restarts"] = self.restarts
        self.checkpoint.save(self.state)

    def summary(self) -> dict[str, Any]:
        p = self.problem
        return {
            "points": p.num_points,
            "features": p.features,
            "workers": self.settings.workers,
            "recovery_threshold": self.settings.recovery_threshold,
            "block_rows": block_rows(p.num_points, self.settings.recovery_threshold),
            "lr": self.lr,
            "ridge": p.ridge,
            "methods": list(self.settings.methods),
            "events": [{"step": e.step, "text": e.describe()} for e in self.settings.events],
        }


def fingerprint(problem: Problem, settings: Settings) -> str:
    """What a checkpoint must match to be resumed: the settings and the data."""
    h = array_digest(np.column_stack([problem.X, problem.y]))
    return f"{settings!r}|ridge={problem.ridge!r}|{h.hex()}"


def simulate(
    problem: Problem,
    settings: Settings,
    root: str | os.PathLike[str],
    checkpoint: Checkpoint | None = None,
) -> list[dict[str, Any]]:
    """Single-process run with simulated workers (stores under ``root``); returns the records."""
    from coded_shuffle.elastic.protocol import LocalChannel

    master = ElasticMaster(problem, settings, LocalChannel(root), ListSink(), checkpoint)
    master.run()
    assert isinstance(master.sink, ListSink)
    return master.sink.records


__all__ = [
    "METHODS",
    "ElasticMaster",
    "FileCheckpoint",
    "JsonlSink",
    "ListSink",
    "MemoryCheckpoint",
    "Settings",
    "make_settings",
    "simulate",
]
