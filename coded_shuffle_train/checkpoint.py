"""The master's checkpoint of ``job=shuffle_sgd``: ``RUN_DIR/checkpoint.pt`` after every epoch.

It holds a :class:`Checkpoint` (the epoch, the model's parameters, the optimiser's state,
the metrics so far and torch's RNG state) stamped with the run's identity, written to a
temporary file and renamed (a kill mid-write leaves the old one). The workers' stores live
beside it (``RUN_DIR/stores``, :class:`~coded_shuffle.CodedShuffle` ``store_dir``). A restart
with the same run directory, by the launcher's ``dist.max_restarts`` or by running the same
command again, resumes after the last epoch it holds.

With ``job.checkpoint_steps=S`` every worker also writes its own training state every ``S``
optimiser steps (:func:`save_step`: ``RUN_DIR/steps/worker-K.pt``, the one before it kept as
``worker-K.prev.pt``), and a restart resumes at the last step every worker holds.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch

from coded_shuffle.errors import UsageError

from .config import Config

FILE = "checkpoint.pt"
DELIVERY_FILE = "delivery.pt"
# what must not change for a checkpoint to be resumed (the transport may: bit-identical; the
# number of workers may: the run goes on with the new one, from a new placement)
IDENTITY_KEYS = ("scheme", "storage", "shuffle", "seed", "data", "model", "optim")


def identity(cfg: Config) -> dict[str, str]:
    """The run's identity: the config that decides batches (the scheme, its storage, the
    shuffle policy, the seed, the data and its placement), model and optimiser, key by key."""
    out = {}
    for key in IDENTITY_KEYS:
        value = getattr(cfg, key)
        plain = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        out[key] = json.dumps(plain, sort_keys=True, default=str)
    return out


def differing_keys(state: dict[str, Any], cfg: Config) -> list[str]:
    """The identity keys on which an artefact's stamp and this run differ (every key, for a
    stamp without them)."""
    saved = state.get("identity")
    if not isinstance(saved, dict):
        return list(IDENTITY_KEYS)
    mine = identity(cfg)
    return [k for k in IDENTITY_KEYS if saved.get(k) != mine[k]]


def stamp(cfg: Config) -> dict[str, Any]:
    """What every artefact of the run carries to be matched: the run's :func:`identity` and
    its number of workers."""
    return {"identity": identity(cfg), "workers": int(cfg.workers)}


def same_run(state: dict[str, Any], cfg: Config, any_workers: bool = False) -> bool:
    """Whether an artefact's :func:`stamp` is this run's (with ``any_workers``: whatever its
    number of workers, as the master's checkpoint after which a run is resized)."""
    mine = stamp(cfg)
    if any_workers:
        return state.get("identity") == mine["identity"]
    return all(state.get(k) == v for k, v in mine.items())


class SavedParts:
    """A dataclass saved as the dict of its fields (its ``state_dict()``) and read back by
    name."""

    def state_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def lacking(cls, state: dict[str, Any]) -> list[str]:
        """The parts without a default value that ``state`` lacks (written by another
        version)."""
        fields = dataclasses.fields(cls)
        return [f.name for f in fields if f.default is dataclasses.MISSING and f.name not in state]

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Self:
        """The parts ``state`` holds (see :meth:`lacking` first)."""
        fields = dataclasses.fields(cls)
        return cls(**{f.name: state[f.name] for f in fields if f.name in state})


@dataclass
class Checkpoint(SavedParts):
    """The master's state after an epoch, what a restart resumes from: the parts' own
    ``state_dict()``s (the coded shuffle's, the optimiser's) beside the model's parameters,
    built in one place (the master's epoch) and read by attribute."""

    shuffle: dict[str, Any]  # CodedShuffle.state_dict(): the epoch, its placement, workers
    params: torch.Tensor  # the model's, flat
    optimizer: dict[str, Any] | None  # the optimiser's state_dict() (worker 0's)
    rows: list[dict[str, Any]]  # the metrics so far
    rng: torch.Tensor = field(default_factory=torch.get_rng_state)
    mixing_seen: np.ndarray | None = None  # what every worker has trained on (Mixing)

    @property
    def epoch(self) -> int:
        return int(self.shuffle["epoch"])

    @property
    def workers(self) -> int:  # of the run that wrote it
        return int(self.shuffle["workers"])

    @property
    def first_epoch(self) -> int:  # the epoch of the run's last placement (> 1 after a resize)
        return int(self.shuffle["first_epoch"])


def load(run_dir: str | os.PathLike[str], cfg: Config) -> Checkpoint | None:
    """The checkpoint in ``run_dir``, or None; :class:`UsageError` if it is another run's."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if not same_run(saved, cfg, any_workers=True):
        keys = ", ".join(differing_keys(saved, cfg))
        raise UsageError(
            f"{path} is the checkpoint of another run (it differs in {keys}): use another "
            "hydra.run.dir, or delete it"
        )
    lacking = Checkpoint.lacking(saved)
    if lacking:
        raise UsageError(
            f"{path} lacks {', '.join(lacking)} (written by another version): delete it"
        )
    state = Checkpoint.from_state_dict(saved)
    if state.epoch > int(cfg.epochs):
        raise UsageError(
            f"{path} holds epoch {state.epoch}, beyond epochs={cfg.epochs}: raise epochs"
        )
    return state


def save(run_dir: str | os.PathLike[str], cfg: Config, state: Checkpoint) -> None:
    """Writes ``state`` atomically, stamped with the run's identity (:func:`stamp`: its
    number of workers is the config's)."""
    plain = state.state_dict()
    plain.update(params=state.params.clone())
    _write(Path(run_dir) / FILE, {**plain, **stamp(cfg)})


def _write(path: Path, state: dict[str, Any]) -> None:
    """``state`` to ``path`` atomically (a temporary file, flushed, renamed)."""
    tmp = path.with_suffix(".pt.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class StepCheckpoint(SavedParts):
    """A worker's training state after ``step`` optimiser steps of ``epoch``
    (``job.checkpoint_steps``): what a restart inside the epoch resumes from, built in one
    place (the worker's steps) and read by attribute."""

    epoch: int
    step: int
    params: torch.Tensor  # the model's, flat, in host memory
    optimizer: dict[str, Any]  # the optimiser's own state_dict(), in host memory
    loss_sum: float  # the training loss summed over the epoch's steps so far
    count: int  # the points those steps saw
    rng: torch.Tensor = field(default_factory=torch.get_rng_state)


def step_files(run_dir: str | os.PathLike[str], worker: int) -> tuple[Path, Path]:
    """Worker ``worker``'s (0-based) last step checkpoint and the one before it."""
    folder = Path(run_dir) / "steps"
    return folder / f"worker-{worker}.pt", folder / f"worker-{worker}.prev.pt"


def save_step(
    run_dir: str | os.PathLike[str], cfg: Config, worker: int, state: StepCheckpoint
) -> None:
    """Worker ``worker``'s ``state``, stamped with the run's identity, keeping the one before
    it."""
    last, prev = step_files(run_dir, worker)
    last.parent.mkdir(parents=True, exist_ok=True)
    if last.is_file():
        os.replace(last, prev)
    _write(last, {**state.state_dict(), **stamp(cfg)})


def load_steps(
    run_dir: str | os.PathLike[str], cfg: Config, worker: int
) -> dict[tuple[int, int], StepCheckpoint]:
    """Worker ``worker``'s step checkpoints of this run, by ``(epoch, step)`` (one of another
    run, or written by another version, is not this run's)."""
    found = {}
    for path in step_files(run_dir, worker):
        saved = _read(path)
        if saved is None or not same_run(saved, cfg) or StepCheckpoint.lacking(saved):
            continue
        state = StepCheckpoint.from_state_dict(saved)
        found[(state.epoch, state.step)] = state
    return found


def save_delivery(
    run_dir: str | os.PathLike[str], cfg: Config, epoch: int, report: dict[str, Any]
) -> None:
    """The master's record of the delivery of ``epoch`` (its bytes, seconds, verification),
    for the record of an epoch resumed inside after a restart."""
    _write(Path(run_dir) / DELIVERY_FILE, {**stamp(cfg), "epoch": epoch, "report": report})


def load_delivery(
    run_dir: str | os.PathLike[str], cfg: Config, epoch: int
) -> dict[str, Any] | None:
    """This run's record of the delivery of ``epoch``, if it is the last one saved."""
    saved = _read(Path(run_dir) / DELIVERY_FILE)
    if saved is None or not same_run(saved, cfg) or saved.get("epoch") != epoch:
        return None
    return saved["report"]


def _read(path: Path) -> dict[str, Any] | None:
    """What :func:`_write` wrote to ``path``; None if it is missing or cut short."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError):
        return None
