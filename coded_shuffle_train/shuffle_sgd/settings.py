"""The job's checks and the library's settings built from its typed config: one
:class:`~coded_shuffle.distributed.settings.ShuffleSettings` (named as the job's Hydra keys),
whose own checks are the library's, and the job's keys around it."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

from coded_shuffle.distributed.settings import ShuffleSettings
from coded_shuffle.distributed.transports import JOB_NAMES, transport_class
from coded_shuffle.errors import UsageError

from .. import data, models
from ..config import Config, DistConf
from ..device import check_device
from .start import FRESH, Resized, RunStart


def transport_options(dist: DistConf) -> dict[str, Any]:
    """The configured transport's own options (``dist.<name>``: the field holding its options
    dataclass, which transports of one mechanism share: ``peer-multicast`` reads
    ``dist.multicast``), as plain values."""
    kind = transport_class(dist.transport, JOB_NAMES).Options
    for f in dataclasses.fields(dist):
        options = getattr(dist, f.name)
        if type(options) is kind and dataclasses.is_dataclass(options):
            return dataclasses.asdict(options)
    return {}


def shuffle_settings(
    cfg: Config, store_dir: Path | None = None, start: RunStart = FRESH
) -> ShuffleSettings:
    """The coded shuffle of ``cfg`` (checked: one line naming the first bad key) for a run
    that starts as ``start`` says: its chain of assignments begins at the run's last placement,
    and a change in the number of workers now offers what the workers before held."""
    return ShuffleSettings(
        scheme=cfg.scheme.name,
        storage=float(cfg.storage),
        seed=int(cfg.seed),
        shuffle=cfg.shuffle.name,
        fraction=float(cfg.shuffle.fraction),
        placement=cfg.data.placement,
        transport=cfg.dist.transport,
        transport_options=transport_options(cfg.dist),
        chunk_bytes=int(cfg.dist.chunk_bytes),
        epochs=int(cfg.epochs),
        timeout=timedelta(seconds=float(cfg.dist.timeout_seconds)),
        store_dir=store_dir,
        keep_batch=store_dir is not None and int(cfg.job.checkpoint_steps) > 0,
        first_epoch=start.first_epoch,
        previous_workers=start.workers_before if isinstance(start, Resized) else None,
        master_rank=int(cfg.dist.master_rank),
        prefetch=bool(cfg.dist.prefetch),
        names=JOB_NAMES,
    )


def validate(cfg: Config) -> None:
    """Everything that can be checked before a process starts (raises :class:`UsageError`)."""
    workers = int(cfg.workers)
    if workers < 1:
        raise UsageError(f"workers={workers} out of range (must be >= 1)")
    if int(cfg.epochs) < 1:
        raise UsageError(f"epochs={cfg.epochs} out of range (must be >= 1)")
    if not 1 <= float(cfg.storage) <= workers:
        raise UsageError(f"storage={cfg.storage:g} out of range 1..{workers} (workers)")
    _check_dist(cfg.dist, workers)
    check_device(cfg.device)
    settings = shuffle_settings(cfg)
    info = data.describe(cfg.data)
    if info.train_points < workers:
        raise UsageError(
            f"workers={workers} exceeds the {info.train_points} training points of "
            f"data.source={cfg.data.source} (valid: 1..{info.train_points})"
        )
    settings.check_job(workers, data.kept(info.train_points, workers), info.point_bytes)
    models.check(cfg.model, info.input_shape)
    _check_optim(cfg)
    _check_debug(cfg, workers)
    steps = int(cfg.job.checkpoint_steps)
    if steps < 0:
        raise UsageError(
            f"job.checkpoint_steps={steps} out of range (must be >= 0; 0: epoch checkpoints only)"
        )
    if steps and not cfg.job.checkpoint:
        raise UsageError(f"job.checkpoint_steps={steps} needs job.checkpoint=true")


def _check_debug(cfg: Config, workers: int) -> None:
    """Every ``debug.*`` key: a fault that could never fire is refused, not ignored."""
    debug, epochs = cfg.debug, int(cfg.epochs)
    die, step, master = debug.die_rank, debug.die_step, int(cfg.dist.master_rank)
    if die is not None and not 0 <= int(die) <= workers:
        raise UsageError(f"debug.die_rank={die} out of range 0..{workers}")
    if step is not None and (int(step) < 1 or (die is not None and int(die) == master)):
        raise UsageError(
            f"debug.die_step={step}: a step >= 1 of a worker's epoch (debug.die_rank a worker's "
            f"rank: 0..{workers} but {master}, the master's)"
        )
    if die is not None and not 1 <= int(debug.die_epoch) <= epochs:
        raise UsageError(f"debug.die_epoch={debug.die_epoch} out of range 1..{epochs} (epochs)")
    if debug.die_mode not in ("exit", "hang"):
        raise UsageError(f"debug.die_mode={debug.die_mode!r} unknown; valid: exit, hang")
    corrupt = debug.corrupt_epoch
    if corrupt is not None and not 1 <= int(corrupt) <= epochs:
        raise UsageError(
            f"debug.corrupt_epoch={corrupt} out of range 1..{epochs} (1: the placement)"
        )
    if float(debug.step_delay) < 0:
        raise UsageError(f"debug.step_delay={debug.step_delay} out of range (must be >= 0)")


def _check_optim(cfg: Config) -> None:
    o = cfg.optim
    if float(o.lr) <= 0:
        raise UsageError(f"optim.lr={o.lr} out of range (must be > 0)")
    if int(o.average_every) < 0:
        raise UsageError(
            f"optim.average_every={o.average_every} out of range (must be >= 0; 0: "
            "gradients averaged every step, H >= 1: local SGD, models averaged every H steps)"
        )
    if int(o.batch_size) < 1:
        raise UsageError(f"optim.batch_size={o.batch_size} out of range (must be >= 1)")


def _check_dist(d: DistConf, workers: int) -> None:
    if not 0 <= int(d.master_rank) <= workers:
        raise UsageError(
            f"dist.master_rank={d.master_rank} out of range 0..{workers} (the job's ranks)"
        )
    for key in ("timeout_seconds", "heartbeat_seconds", "progress_seconds"):
        if float(getattr(d, key)) <= 0:
            raise UsageError(f"dist.{key}={getattr(d, key)} out of range (must be > 0)")
