"""The training config: its directory, the typed schemas and the options of every group, composition
from Hydra overrides outside a Hydra app, and one-line config errors. Shared by the launcher
(:mod:`coded_shuffle_train.launch`) and the per-rank entry point (:mod:`coded_shuffle_train.entry`).
It imports neither torch nor the schemes until a function needs them: the launcher reads the config
directory before it starts the fork server, whose imports then overlap its own."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, open_dict

from coded_shuffle.errors import UsageError

CONF_DIR = Path(__file__).resolve().parent / "conf"  # package data: shipped in the wheel


def available_jobs() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "job").glob("*.yaml"))


PROG = "coded-shuffle-train"


def fail(message: str, code: int) -> None:
    """One line on stderr, then exit (no traceback)."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def register_configs() -> None:
    """The typed schemas (:mod:`coded_shuffle_train.config`), and every registered scheme as a
    ``scheme=`` option, even without a ``conf/scheme`` YAML."""
    from coded_shuffle.math.schemes import REGISTRY

    from .config import SchemeConf, register_schemas

    register_schemas()
    store = ConfigStore.instance()
    for name in REGISTRY:
        if not (CONF_DIR / "scheme" / f"{name}.yaml").exists():
            store.store(group="scheme", name=name, node=SchemeConf(name=name))


GROUPS = ("scheme", "shuffle", "data", "model", "optim", "job")


def group_options(group: str) -> list[str]:
    """Valid ``group=`` values: the YAML files in ``coded_shuffle_train/conf/<group>`` (and
    registered schemes)."""
    names = {p.stem for p in (CONF_DIR / group).glob("*.yaml")}
    if group == "scheme":
        from coded_shuffle.math.schemes import REGISTRY

        names = set(REGISTRY)  # a scheme YAML without a registered scheme is not valid
    return sorted(names)


def check_group_overrides(argv: list[str]) -> None:
    """Unknown ``scheme=``/``data=``/... values: :class:`UsageError` in one line (Hydra's own
    spans many)."""
    for arg in argv:
        m = re.fullmatch(r"[+~]?(\w+)=(.*)", arg)
        if not m or m.group(1) not in GROUPS or re.search(r"[()\[\]{}*$]", m.group(2)):
            continue
        valid = group_options(m.group(1))
        for name in filter(None, m.group(2).split(",")):
            if name not in valid:
                raise UsageError(f"unknown {m.group(1)} {name!r}; valid: {', '.join(valid)}")


def compose_argv(argv: list[str]) -> tuple[DictConfig, str]:
    """The job's config from Hydra overrides, outside a Hydra app; and its run directory."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import setup_globals

    setup_globals()
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train"):
        cfg = compose("config", overrides=argv, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    run_dir = str(cfg.hydra.run.dir)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, run_dir


def config_error_line(exc: BaseException) -> str:
    """One line for a composition error: the key and what is wrong with its value (Hydra
    wraps OmegaConf's typed-schema error, which names the key, in its own)."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    lines = [ln.strip() for ln in str(cause).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), "")
    return f"{key}: {lines[0]}" if key and not lines[0].startswith(key) else lines[0]
