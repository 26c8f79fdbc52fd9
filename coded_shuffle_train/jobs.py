"""The training jobs: one object per job, with declared hooks (``job=<name>`` picks it).

A job is a :class:`Job` in ``coded_shuffle_train/<name>.py`` (or a package of that name) as ``JOB``;
its config schema is ``coded_shuffle_train.config.SCHEMAS["job"][<name>]`` and
``coded_shuffle_train/conf/job/<name>.yaml``. The launcher calls :meth:`Job.validate` before any
process starts (a :class:`~coded_shuffle.errors.UsageError` is one line, no traceback), starts
:meth:`Job.processes` processes and restarts them :meth:`Job.max_restarts` times after a failure;
every rank then sets up gloo and calls :meth:`Job.run`."""

from __future__ import annotations

import importlib
import re

from coded_shuffle.errors import UsageError

from .compose import available_jobs
from .config import Config


class Job:
    """A job's hooks; every one takes the typed config
    (:class:`~coded_shuffle_train.config.Config`)."""

    name = ""

    def validate(self, cfg: Config) -> None:
        """Everything that can be checked before a process starts."""
        del cfg

    def processes(self, cfg: Config) -> int:
        """How many processes the job runs (rank 0 is the master)."""
        return int(cfg.workers) + 1

    default_restarts = 0  # what a null dist.max_restarts means for this job

    def max_restarts(self, cfg: Config) -> int:
        """How often the launcher restarts every process after a failure:
        ``dist.max_restarts``, else the job's :attr:`default_restarts`."""
        value = cfg.dist.max_restarts
        restarts = self.default_restarts if value is None else int(value)
        if restarts < 0:
            raise UsageError(f"dist.max_restarts={value} out of range (must be >= 0)")
        return restarts

    def run(self, cfg: Config) -> None:
        """Every rank's body, once the process group is set up
        (``coded_shuffle_train.dist.context()``)."""
        raise NotImplementedError


def job(name: str) -> Job:
    """The job ``name``; :class:`UsageError` naming the valid jobs if there is none."""
    valid = ", ".join(available_jobs())
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise UsageError(f"job {name!r} unknown; valid: {valid}")
    try:
        module = importlib.import_module(f"coded_shuffle_train.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"coded_shuffle_train.{name}":
            raise UsageError(f"job {name!r} unknown; valid: {valid}") from None
        raise
    found = getattr(module, "JOB", None)
    if not isinstance(found, Job):
        raise UsageError(f"job {name!r}: train.{name} has no JOB (a coded_shuffle_train.jobs.Job)")
    return found
