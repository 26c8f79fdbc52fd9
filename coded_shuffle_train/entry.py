"""Per-rank entry point: set up the process group, then run the job
(:mod:`coded_shuffle_train.jobs`) on the typed config (:class:`~coded_shuffle_train.config.Config`,
``OmegaConf.to_object`` of the composed one).

``python -m coded_shuffle_train --check [overrides]`` composes and validates only (``coded-shuffle
cluster`` runs it before it builds any host); ``torchrun ... -m coded_shuffle_train [overrides]``
runs one rank."""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from coded_shuffle.distributed.launcher_env import agent_store
from coded_shuffle.distributed.liveness import first_line, is_peer_loss
from coded_shuffle.errors import UsageError

from .compose import check_group_overrides, compose_argv, config_error_line
from .config import Config
from .dist import (
    PEER_LOSS_GRACE_SECONDS,
    deterministic,
    return_freed_arrays,
    setup,
    stalled_ranks,
    teardown,
)
from .jobs import Job, job

log = logging.getLogger("train")


class CollectiveFailed(RuntimeError):
    """A collective failed because another rank died or stalled."""


def typed(cfg: DictConfig) -> Config:
    """The composed config as the job reads it: :class:`~coded_shuffle_train.config.Config` and its
    groups' dataclasses (every default in one place: the schema)."""
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]


def validate(cfg: Config) -> Job:
    """The job, after its ``validate`` and its restart setting (``dist.max_restarts``, every
    job's) passed."""
    found = job(str(cfg.job.name))
    found.validate(cfg)
    found.max_restarts(cfg)
    return found


def write_config(cfg: Config, run_dir: str | Path) -> None:
    """The resolved config beside the metrics (``RUN_DIR/config.yaml``)."""
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))


def _logging(run_dir: str | Path, master: bool) -> None:
    """Console (and ``train.log`` on the master) when the process did not inherit handlers."""
    logger = logging.getLogger("train")
    logger.setLevel(logging.INFO if master else logging.WARNING)
    if logging.getLogger().handlers:
        return
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s] %(message)s", datefmt="%X")
    if master:
        handler = logging.FileHandler(Path(run_dir) / "train.log")
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
        logger.addHandler(handler)


def stacks_on_signal() -> None:
    """``kill -USR1 <pid>`` prints every thread's Python stack to stderr (a hung process)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)


def run_rank(cfg: Config, run_dir: str) -> None:
    """One rank: deterministic torch, process group, the job's ``run(cfg)``."""
    rank = int(os.environ.get("RANK", "0"))
    stacks_on_signal()
    return_freed_arrays()
    deterministic(int(cfg.threads))
    _logging(run_dir, rank == int(cfg.dist.master_rank))
    found = job(str(cfg.job.name))
    try:
        setup(cfg, run_dir)
        found.run(cfg)
    except Exception as exc:
        if not is_peer_loss(exc):
            raise
        time.sleep(PEER_LOSS_GRACE_SECONDS)  # let the rank that failed first be reported
        reason = stalled_ranks() or "no rank is behind"
        raise CollectiveFailed(f"{first_line(exc)}; {reason}") from exc
    teardown()


@record
def rank_main(cfg: Config, run_dir: str) -> None:
    """What the local launcher starts in every process (picklable, module level; the typed
    config travels pickled)."""
    run_rank(cfg, run_dir)


def _config_error(exc: BaseException) -> None:
    print(
        f"python -m coded_shuffle_train: error: {config_error_line(exc)}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(2) from None


def check_main(argv: list[str]) -> None:
    """``python -m coded_shuffle_train --check [overrides]``: compose and validate, nothing else."""
    try:
        check_group_overrides(argv)
        composed, _ = compose_argv(argv)
        validate(typed(composed))
    except UsageError as exc:
        _config_error(exc)
    except Exception as exc:  # Hydra's and OmegaConf's composition errors
        _config_error(exc)


def profile_main(argv: list[str]) -> None:
    """``python -m coded_shuffle_train --profile [overrides]``: the validated job's profile as one
    JSON
    line (:mod:`coded_shuffle_train.profile`)."""
    from .profile import as_dict, check_priced, profile

    try:
        check_group_overrides(argv)
        composed, _ = compose_argv(argv)
        cfg = typed(composed)
        check_priced(cfg)
        validate(cfg)
        print(json.dumps(as_dict(profile(cfg))), flush=True)
    except UsageError as exc:
        _config_error(exc)
    except Exception as exc:  # Hydra's and OmegaConf's composition errors
        _config_error(exc)


def follow_world(cfg: Config, world: int, rank: int) -> None:
    """``dist.elastic``: ``workers`` becomes what the launcher started, ``world - 1`` (rank 0
    says so when that is not the configured number); a world without a worker is refused."""
    if agent_store() and "RANK" in os.environ:
        raise UsageError(
            "dist.elastic needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment: "
            "after a host is lost the agents count restarts differently, and a store shared "
            "across attempts would mix their keys (rank 0 then hosts each attempt's store)"
        )
    if world < 2:
        raise UsageError(
            f"dist.elastic: the launcher started {world} process; the job needs a master and "
            "at least one worker (2 or more)"
        )
    if world - 1 != cfg.workers and rank == int(cfg.dist.master_rank):
        print(
            f"dist.elastic: {world} processes: workers={world - 1} (the config said {cfg.workers})",
            file=sys.stderr,
            flush=True,
        )
    cfg.workers = world - 1


@record
def torchrun_main(argv: list[str]) -> None:
    """``torchrun ... -m coded_shuffle_train [overrides]``: compose the config here, run this
    rank."""
    composed, run_dir = compose_argv(argv)
    cfg = typed(composed)
    rank = int(os.environ.get("RANK", "0"))
    try:
        if cfg.dist.elastic:
            follow_world(cfg, int(os.environ.get("WORLD_SIZE", cfg.workers + 1)), rank)
        if rank == int(cfg.dist.master_rank):
            validate(cfg)
            write_config(cfg, run_dir)
    except UsageError as exc:
        _config_error(exc)
    run_rank(cfg, run_dir)
