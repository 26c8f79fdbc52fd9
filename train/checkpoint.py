"""The master's checkpoint of ``job=shuffle_sgd``: ``RUN_DIR/checkpoint.pt`` after every epoch.

It holds the epoch, the model's parameters, the optimiser's momentum, the metrics so far and
torch's RNG state, written to a temporary file and renamed (a kill mid-write leaves the old
one). The workers' stores live beside it (``RUN_DIR/stores``, :class:`~coded_shuffle.CodedShuffle`
``store_dir``). A restart with the same run directory, by the launcher's ``dist.max_restarts``
or by running the same command again, resumes after the last epoch it holds.
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
# what must not change for a checkpoint to be resumed (the transport may: bit-identical)
IDENTITY_KEYS = ("scheme", "storage", "seed", "workers", "data", "model", "optim")


def identity(cfg: Config) -> str:
    """The run's identity: the config that decides batches, model and optimiser."""
    keys = {k: getattr(cfg, k) for k in IDENTITY_KEYS}
    plain = {
        k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in keys.items()
    }
    return json.dumps(plain, sort_keys=True, default=str)


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def load(run_dir: str | os.PathLike[str], cfg: Config) -> dict[str, Any] | None:
    """The checkpoint in ``run_dir``, or None; :class:`UsageError` if it is another run's."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved.get("identity") != identity(cfg):
        raise UsageError(
            f"{path} is the checkpoint of another run (different scheme, storage, seed, "
            "workers, data, model or optim): use another hydra.run.dir, or delete it"
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
) -> None:
    """Writes the checkpoint after ``epoch`` atomically."""
    path = Path(run_dir) / FILE
    tmp = path.with_suffix(".pt.tmp")
    state = {
        "identity": identity(cfg),
        "epoch": epoch,
        "params": params.clone(),
        "momentum": momentum.clone(),
        "rows": rows,
        "rng": torch.get_rng_state(),
    }
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
