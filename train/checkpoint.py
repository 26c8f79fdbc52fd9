"""The master's checkpoint of ``job=shuffle_sgd``: ``RUN_DIR/checkpoint.pt`` after every epoch.

It holds the epoch, the model's parameters, the optimiser's momentum, the metrics so far and
torch's RNG state, written to a temporary file and renamed (a kill mid-write leaves the old
one). The workers' stores live beside it (``RUN_DIR/stores``, :class:`~coded_shuffle.CodedShuffle`
``store_dir``). A restart with the same run directory, by the launcher's ``dist.max_restarts``
or by running the same command again, resumes after the last epoch it holds.

With ``job.checkpoint_steps=S`` every worker also writes its own training state every ``S``
optimiser steps (:func:`save_step`: ``RUN_DIR/steps/worker-K.pt``, the one before it kept as
``worker-K.prev.pt``), and a restart resumes at the last step every worker holds.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from coded_shuffle.errors import UsageError

from .config import Config

FILE = "checkpoint.pt"
DELIVERY_FILE = "delivery.pt"
# what must not change for a checkpoint to be resumed (the transport may: bit-identical; the
# number of workers may: the run goes on with the new one, from a new placement)
IDENTITY_KEYS = ("scheme", "storage", "seed", "data", "model", "optim")


def identity(cfg: Config) -> str:
    """The run's identity: the config that decides batches, model and optimiser."""
    keys = {k: getattr(cfg, k) for k in IDENTITY_KEYS}
    plain = {
        k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in keys.items()
    }
    return json.dumps(plain, sort_keys=True, default=str)


def load(run_dir: str | os.PathLike[str], cfg: Config) -> dict[str, Any] | None:
    """The checkpoint in ``run_dir``, or None; :class:`UsageError` if it is another run's."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved.get("identity") != identity(cfg):
        raise UsageError(
            f"{path} is the checkpoint of another run (different scheme, storage, seed, "
            "data, model or optim): use another hydra.run.dir, or delete it"
        )
    if saved["epoch"] > int(cfg.epochs):
        raise UsageError(
            f"{path} holds epoch {saved['epoch']}, beyond epochs={cfg.epochs}: raise epochs"
        )
    return saved


def save(
    run_dir: str | os.PathLike[str],
    cfg: Config,
    epoch: int,
    params: torch.Tensor,
    momentum: torch.Tensor,
    rows: list[dict[str, Any]],
    first_epoch: int = 1,
) -> None:
    """Writes the checkpoint after ``epoch`` atomically (``first_epoch``: the epoch of the
    run's last placement, later than 1 once its number of workers changed)."""
    path = Path(run_dir) / FILE
    state = {
        "identity": identity(cfg),
        "workers": int(cfg.workers),
        "first_epoch": first_epoch,
        "epoch": epoch,
        "params": params.clone(),
        "momentum": momentum.clone(),
        "rows": rows,
        "rng": torch.get_rng_state(),
    }
    _write(path, state)


def _write(path: Path, state: dict[str, Any]) -> None:
    """``state`` to ``path`` atomically (a temporary file, flushed, renamed)."""
    tmp = path.with_suffix(".pt.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def step_identity(cfg: Config) -> str:
    """A worker's step checkpoint belongs to the run and to its number of workers."""
    return f"{identity(cfg)} workers={int(cfg.workers)}"


def step_files(run_dir: str | os.PathLike[str], worker: int) -> tuple[Path, Path]:
    """Worker ``worker``'s (0-based) last step checkpoint and the one before it."""
    folder = Path(run_dir) / "steps"
    return folder / f"worker-{worker}.pt", folder / f"worker-{worker}.prev.pt"


def save_step(
    run_dir: str | os.PathLike[str], cfg: Config, worker: int, state: dict[str, Any]
) -> None:
    """Worker ``worker``'s training state after step ``state["step"]`` of ``state["epoch"]``
    (its parameters, momentum, loss so far and RNG), keeping the one before it."""
    last, prev = step_files(run_dir, worker)
    last.parent.mkdir(parents=True, exist_ok=True)
    if last.is_file():
        os.replace(last, prev)
    _write(last, {**state, "identity": step_identity(cfg), "rng": torch.get_rng_state()})


def load_steps(
    run_dir: str | os.PathLike[str], cfg: Config, worker: int
) -> dict[tuple[int, int], dict[str, Any]]:
    """Worker ``worker``'s step checkpoints of this run, by ``(epoch, step)``."""
    found = {}
    for path in step_files(run_dir, worker):
        state = _read(path)
        if state is not None and state.get("identity") == step_identity(cfg):
            found[(int(state["epoch"]), int(state["step"]))] = state
    return found


def save_delivery(run_dir: str | os.PathLike[str], epoch: int, report: dict[str, Any]) -> None:
    """The master's record of the delivery of ``epoch`` (its bytes, seconds, verification),
    for the record of an epoch resumed inside after a restart."""
    _write(Path(run_dir) / DELIVERY_FILE, {"epoch": epoch, "report": report})


def load_delivery(run_dir: str | os.PathLike[str], epoch: int) -> dict[str, Any] | None:
    """The record of the delivery of ``epoch``, if it is the last one saved."""
    saved = _read(Path(run_dir) / DELIVERY_FILE)
    return saved["report"] if saved is not None and saved.get("epoch") == epoch else None


def _read(path: Path) -> dict[str, Any] | None:
    """What :func:`_write` wrote to ``path``; None if it is missing or cut short."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError):
        return None
