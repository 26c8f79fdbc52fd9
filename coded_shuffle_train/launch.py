"""``coded-shuffle-train``: a Hydra app that validates the config and starts ``workers + 1``
local processes through torch's elastic launcher (the machinery behind ``torchrun``).

``coded-shuffle-train -m scheme=uncoded,attia-tandon,cycles`` sweeps; every run writes
``metrics.jsonl``, ``summary.json`` and ``config.yaml`` into its Hydra run directory.
Invalid configs stop before any process starts, with one line on stderr; a rank that fails
makes the job fail with one line naming the rank.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from coded_shuffle.errors import UsageError

from . import forkserver
from .compose import (
    CONF_DIR,
    check_group_overrides,
    compose_argv,
    config_error_line,
    fail,
    register_configs,
)
from .start_methods import DEFAULT_START_METHOD, START_METHODS

QUIET_LOGGERS = ("torch.distributed.elastic", "torch.multiprocessing", "torch.distributed")


def failure_line(exc: Any, master: int = 0) -> str:
    """The first failed rank of a ``ChildFailedError`` and why, in one line (``master``: the
    master's rank, as the line names it)."""
    rank, failure = exc.get_first_failure()
    detail = failure.message
    if isinstance(detail, dict):
        detail = str(detail.get("message", ""))
    if not detail or detail.startswith("To enable traceback"):
        detail = (
            f"killed by {failure.signal_name()}"
            if failure.exitcode < 0
            else f"exited with code {failure.exitcode}"
        )
    detail = detail.strip().splitlines()[0] if detail.strip() else detail
    from coded_shuffle.distributed.liveness import rank_label

    return f"{rank_label(rank, master)} failed: {detail}"


def start_method_of(argv: list[str]) -> str:
    """The ``dist.start_method`` the command line asks for (the first value of a sweep), else
    the schema's default (:class:`~coded_shuffle_train.config.DistConf`)."""
    for arg in reversed(argv):
        m = re.fullmatch(r"\+{0,2}dist\.start_method=([^,]*).*", arg)
        if m:
            return m.group(1)
    return DEFAULT_START_METHOD


@contextlib.contextmanager
def own_temporary_files() -> Iterator[None]:
    """The elastic agent's log folders and the ranks' error files (``torch`` makes them in
    the system's temporary folder and leaves them there) in a folder of this launch's own,
    removed when it ends."""
    with tempfile.TemporaryDirectory(prefix="coded-shuffle-train-") as own:
        before, tempfile.tempdir = tempfile.tempdir, own
        try:
            yield
        finally:
            tempfile.tempdir = before


def launch(composed: DictConfig, run_dir: str) -> None:
    """Validate, write ``config.yaml``, start the processes, report a failed rank."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from .entry import rank_main, typed, validate, write_config

    try:
        cfg = typed(composed)
        job = validate(cfg)
        nproc = job.processes(cfg)
        restarts = job.max_restarts(cfg)
        start_method = str(cfg.dist.start_method)
        if start_method not in START_METHODS:
            raise UsageError(
                f"dist.start_method={start_method!r} unknown; valid: {', '.join(START_METHODS)}"
            )
    except UsageError as exc:
        fail(str(exc), 2)
    except OmegaConfBaseException as exc:  # a key missing or mistyped in the config
        fail(f"config: {str(exc).strip().splitlines()[0]}", 2)
    write_config(cfg, run_dir)
    os.environ["OMP_NUM_THREADS"] = str(int(cfg.threads))
    if start_method == "forkserver":
        forkserver.start_standard()  # running already, unless a sweep switched to it
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        with own_temporary_files():  # LaunchConfig makes the agent's log folder
            config = LaunchConfig(
                min_nodes=1,
                max_nodes=1,
                nproc_per_node=nproc,
                run_id=f"coded-shuffle-{uuid.uuid4().hex[:8]}",
                rdzv_backend="c10d",
                rdzv_endpoint="localhost:0",
                max_restarts=restarts,
                monitor_interval=float(cfg.dist.monitor_interval),
                start_method=start_method,
            )
            elastic_launch(config, rank_main)(cfg, run_dir)
    except ChildFailedError as exc:
        fail(f"{failure_line(exc, int(cfg.dist.master_rank))} (run directory {run_dir})", 1)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _app(cfg: DictConfig) -> None:
    launch(cfg, HydraConfig.get().runtime.output_dir)


def sweep_choices(argv: list[str]) -> list[list[str]]:
    """One argv per value of every ``key=a,b,c`` sweep (the other keys at their first value):
    enough to check every value once."""
    plain = [a for a in argv if a not in ("-m", "--multirun")]
    swept = [i for i, a in enumerate(plain) if re.fullmatch(r"[\w.]+=[^()\[\]{}*$]*,.*", a)]
    first = [a.split(",", 1)[0] if i in swept else a for i, a in enumerate(plain)]
    out = [first]
    for i in swept:
        key, values = plain[i].split("=", 1)
        out += [[*first[:i], f"{key}={v}", *first[i + 1 :]] for v in values.split(",")[1:]]
    return out


def check_overrides(argv: list[str]) -> None:
    """Every override composes against the typed schema (:mod:`coded_shuffle_train.config`); a
    mistyped
    value fails in one line naming the key, before Hydra starts the app."""
    for choice in sweep_choices(argv):
        try:
            compose_argv(choice)
        except Exception as exc:  # Hydra's and OmegaConf's composition errors
            fail(config_error_line(exc), 2)


def main() -> None:
    """Console script ``coded-shuffle-train``."""
    forkserver.run_command(lambda: run_app(sys.argv[1:]))


def run_app(argv: list[str]) -> None:
    """The overrides checked in one line each, then the Hydra app (one job, or a sweep)."""
    from .entry import stacks_on_signal

    if start_method_of(argv) == "forkserver":
        forkserver.start()  # first: its imports run beside the checks below and Hydra's app
    stacks_on_signal()
    try:
        check_group_overrides(argv)
    except UsageError as exc:
        fail(str(exc), 2)
    register_configs()
    if not any(a.startswith(("--", "hydra/")) for a in argv if a != "--multirun"):
        check_overrides(argv)
    _app()


if __name__ == "__main__":
    main()
