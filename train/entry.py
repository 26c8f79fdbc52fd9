"""Per-rank entry point: set up the process group, then dispatch to ``train.<job>.run(cfg)``.

Contract for a job module ``train/<name>.py`` (selected by ``job=<name>``, whose
``conf/job/<name>.yaml`` holds ``name: <name>``):

* ``run(cfg)`` runs on every rank after gloo is set up; ``train.dist.context()`` gives the
  :class:`~train.dist.RankContext` (rank, world size, workers' subgroup, run directory).
* optional ``validate(cfg)`` raises :class:`~coded_shuffle.errors.UsageError`; the launcher
  calls it before any process starts (one clear line, no traceback).
* optional ``num_processes(cfg)``; default ``workers + 1``.
* optional ``max_restarts(cfg)``: how often the launcher restarts all processes after a
  failure; default 0 (the job fails with one line naming the failed rank).
* optional ``collective_timeout(cfg)``: a ``timedelta`` that collectives may wait, for jobs
  that watch liveness themselves (:func:`train.dist.start_liveness`); default
  ``dist.timeout_seconds``.
"""

from __future__ import annotations

import faulthandler
import importlib
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from coded_shuffle.distributed.liveness import first_line, is_peer_loss
from coded_shuffle.errors import UsageError

from .compose import available_jobs, check_group_overrides, compose_argv, config_error_line
from .dist import (
    PEER_LOSS_GRACE_SECONDS,
    deterministic,
    return_freed_arrays,
    setup,
    stalled_ranks,
    teardown,
)

log = logging.getLogger("train")


class CollectiveFailed(RuntimeError):
    """A collective failed because another rank died or stalled."""


def job_module(name: str) -> ModuleType:
    """``train.<name>``; :class:`UsageError` naming the valid jobs if it does not exist."""
    valid = ", ".join(available_jobs())
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise UsageError(f"job {name!r} unknown; valid: {valid}")
    try:
        module = importlib.import_module(f"train.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"train.{name}":
            raise UsageError(f"job {name!r} unknown; valid: {valid}") from None
        raise
    if not callable(getattr(module, "run", None)):
        raise UsageError(f"job {name!r}: train.{name} has no run(cfg)")
    return module


def num_processes(cfg: Any, module: ModuleType) -> int:
    hook = getattr(module, "num_processes", None)
    return int(hook(cfg)) if hook else int(cfg.workers) + 1


def max_restarts(cfg: Any, module: ModuleType) -> int:
    hook = getattr(module, "max_restarts", None)
    return int(hook(cfg)) if hook else 0


def validate(cfg: Any) -> ModuleType:
    """The job module, after its ``validate(cfg)`` passed."""
    module = job_module(str(cfg.job.name))
    hook = getattr(module, "validate", None)
    if hook:
        hook(cfg)
    return module


def write_config(cfg: Any, run_dir: str | Path) -> None:
    """The resolved config beside the metrics (``RUN_DIR/config.yaml``)."""
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))


def _logging(run_dir: str | Path, rank: int) -> None:
    """Console (and ``train.log`` on rank 0) when the process did not inherit handlers."""
    logger = logging.getLogger("train")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    if logging.getLogger().handlers:
        return
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s] %(message)s", datefmt="%X")
    if rank == 0:
        handler = logging.FileHandler(Path(run_dir) / "train.log")
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
        logger.addHandler(handler)


def stacks_on_signal() -> None:
    """``kill -USR1 <pid>`` prints every thread's Python stack to stderr (a hung process)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)


def run_rank(cfg: DictConfig, run_dir: str) -> None:
    """One rank: deterministic torch, process group, the job's ``run(cfg)``."""
    rank = int(os.environ.get("RANK", "0"))
    stacks_on_signal()
    return_freed_arrays()
    deterministic(int(cfg.threads))
    _logging(run_dir, rank)
    module = job_module(str(cfg.job.name))
    try:
        hook = getattr(module, "collective_timeout", None)
        setup(cfg, run_dir, hook(cfg) if hook else None)
        module.run(cfg)
    except Exception as exc:
        if not is_peer_loss(exc):
            raise
        time.sleep(PEER_LOSS_GRACE_SECONDS)  # let the rank that failed first be reported
        reason = stalled_ranks() or "no rank is behind"
        raise CollectiveFailed(f"{first_line(exc)}; {reason}") from exc
    teardown()


@record
def rank_main(cfg_yaml: str, run_dir: str) -> None:
    """What the local launcher starts in every process (picklable, module level)."""
    run_rank(OmegaConf.create(cfg_yaml), run_dir)


def _config_error(exc: BaseException) -> None:
    print(f"python -m train: error: {config_error_line(exc)}", file=sys.stderr, flush=True)
    raise SystemExit(2) from None


def check_main(argv: list[str]) -> None:
    """``python -m train --check [overrides]``: compose and validate, nothing else."""
    try:
        check_group_overrides(argv)
        cfg, _ = compose_argv(argv)
        validate(cfg)
    except UsageError as exc:
        _config_error(exc)
    except Exception as exc:  # Hydra's and OmegaConf's composition errors
        _config_error(exc)


@record
def torchrun_main(argv: list[str]) -> None:
    """``torchrun ... -m train [overrides]``: compose the config here, run this rank."""
    cfg, run_dir = compose_argv(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        if rank == 0:
            validate(cfg)
            write_config(cfg, run_dir)
    except UsageError as exc:
        _config_error(exc)
    run_rank(cfg, run_dir)
