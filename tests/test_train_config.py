"""The job's config: validation before any process starts, one-line errors, and what the
config hands the coded shuffle and the launcher."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from omegaconf import OmegaConf

from coded_shuffle.distributed.fault_kinds import FAULTS, fault_kinds
from coded_shuffle.errors import UsageError
from coded_shuffle.tools.cli import build_parser
from coded_shuffle_train import shuffle_sgd
from coded_shuffle_train.compose import CONF_DIR
from coded_shuffle_train.config import DebugConf
from tests.helpers import (
    compose,
    run_job,
)

# --- validation: before any process starts -------------------------------------------------


MULTICAST = ["dist.transport=multicast", "dist.multicast.rate=1gbit"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=synthetic", "data.points=3"], "workers=4 exceeds the 3 training points"),
        (["storage=9"], "out of range 1..4"),
        (["storage=0.5"], "out of range 1..4"),
        (["workers=0"], "workers=0 out of range"),
        (["optim.batch_size=0"], "optim.batch_size=0"),
        (["model=cnn", "data=synthetic", "data.features=10"], "square"),
        (
            ["data=file", "data.path=/no/such.npz"],
            "is neither a directory of .npy files nor a file",
        ),
        (["debug.die_rank=7"], "debug.die_rank=7 out of range 0..4"),
        (["device=tpu"], "device=tpu is not one of auto | cpu | cuda"),
        (["job.checkpoint_steps=-1"], "job.checkpoint_steps=-1 out of range (must be >= 0"),
        (["job.checkpoint_steps=4", "job.checkpoint=false"], "needs job.checkpoint=true"),
        (["debug.die_rank=0", "debug.die_step=3"], "debug.die_step=3: a step >= 1 of a worker"),
        (["debug.die_rank=1", "debug.die_step=0"], "debug.die_step=0: a step >= 1 of a worker"),
        (["debug.die_rank=1", "debug.die_epoch=11"], "debug.die_epoch=11 out of range 1..10"),
        (["debug.die_mode=sleep"], "debug.die_mode='sleep' unknown; valid: exit, hang"),
        (["debug.corrupt_epoch=0"], "debug.corrupt_epoch=0 out of range 1..10 (1: the placement)"),
        (["epochs=3", "debug.corrupt_epoch=4"], "debug.corrupt_epoch=4 out of range 1..3"),
        (["debug.step_delay=-1"], "debug.step_delay=-1.0 out of range (must be >= 0"),
        (["dist.transport=smoke"], "dist.transport='smoke' unknown; valid: chain, multicast"),
        (["dist.transport=p2p"], "dist.transport=p2p carries uncoded deliveries only"),
        (["dist.transport=unicast", "scheme=best"], "scheme=best is coded"),
        (["dist.transport=multicast"], "dist.multicast.rate is required"),
        (  # peer-multicast reads the options under multicast's key, and names them so
            ["scheme=decentralized", "storage=2", "dist.transport=peer-multicast"],
            "dist.multicast.rate is required",
        ),
        (["dist.transport=multicast", "dist.multicast.rate=9x"], "rate '9x' cannot be parsed"),
        (["dist.chain.order=[1,2,2,3]"], "must list every worker rank 1..4 once"),
        (
            [*MULTICAST, "dist.multicast.receiver_rates=[1gbit,1gbit]"],
            "dist.multicast.receiver_rates has 2 rates, expected one per worker (4)",
        ),
        (
            [*MULTICAST, "dist.multicast.receiver_rates=[1gbit,1gbit,1gbit,2x]"],
            "dist.multicast.receiver_rates '2x' cannot be parsed",
        ),
        (["shuffle=partial", "shuffle.fraction=0"], "shuffle.fraction=0.0 out of range (0, 1]"),
        (["shuffle=partial", "shuffle.fraction=1.5"], "shuffle.fraction=1.5 out of range"),
        (["shuffle.name=sometimes"], "shuffle='sometimes' unknown; valid: full, partial, none"),
        (["data.placement=sorted"], "data.placement='sorted' unknown; valid: random, by_label"),
    ],
)
def test_invalid_configs_raise_one_usage_error(overrides, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        shuffle_sgd.validate(compose(*overrides))


@pytest.mark.parametrize(
    ("argv", "method"),
    [
        ([], "forkserver"),  # the default: ranks never forked from the threaded launcher
        (["scheme=cycles", "dist.start_method=spawn"], "spawn"),
        (["-m", "dist.start_method=spawn,forkserver"], "spawn"),
    ],
)
def test_the_launcher_reads_the_start_method_before_composing(argv, method):
    from coded_shuffle_train.launch import start_method_of

    assert start_method_of(argv) == method
    assert compose().dist.start_method == "forkserver"


def test_unknown_scheme_is_a_usage_error():
    cfg = compose()
    cfg.scheme.name = "no-such-scheme"
    with pytest.raises(UsageError, match="scheme='no-such-scheme' unknown; valid: "):
        shuffle_sgd.validate(cfg)


@pytest.mark.parametrize(  # one per stage; every message itself: the in-process tests above
    ("args", "message"),
    [
        (["scheme=no-such-scheme"], "unknown scheme 'no-such-scheme'; valid:"),  # composing
        (["workers=5000"], "workers=5000 exceeds the 1438 training points"),  # the data
        pytest.param(  # the device, in the launcher
            ["device=cuda"],
            "device=cuda but CUDA is not available on this host",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA"),
        ),
    ],
)
def test_command_line_errors_are_one_line_and_start_nothing(tmp_path, args, message):
    out = run_job([*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert not (tmp_path / "run" / "config.yaml").exists()  # stopped before any process


def test_the_job_hands_its_placement_and_policy_to_the_coded_shuffle():
    """``data.placement=by_label`` (and the shuffle policy) reach the library's settings."""
    from coded_shuffle_train.shuffle_sgd.settings import shuffle_settings

    settings = shuffle_settings(
        compose("data.placement=by_label", "shuffle=partial", "shuffle.fraction=0.5")
    )
    assert (settings.placement, settings.shuffle, settings.fraction) == ("by_label", "partial", 0.5)
    assert shuffle_settings(compose()).placement == "random"


def test_an_elastic_job_takes_its_workers_from_the_world(monkeypatch, capsys):
    """``dist.elastic``: ``workers`` becomes WORLD_SIZE - 1 (rank 0 says so); a world without
    a worker, or torch's store shared across attempts, stops with one line."""
    from coded_shuffle_train.compose import compose_argv
    from coded_shuffle_train.entry import follow_world, typed

    cfg = typed(compose_argv(["dist.elastic=true"])[0])
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    follow_world(cfg, 3, 0)
    assert cfg.workers == 2
    assert "dist.elastic: 3 processes: workers=2 (the config said 4)" in capsys.readouterr().err
    with pytest.raises(UsageError, match="started 1 process; the job needs a master"):
        follow_world(cfg, 1, 0)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UsageError, match="needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        follow_world(cfg, 3, 0)


def test_the_composed_default_config_is_the_dataclasses_defaults():
    """One home for every default: the typed schema. The YAMLs only select (the default
    groups, the scheme's name); what they compose is the dataclasses' own defaults."""
    from coded_shuffle_train.config import (
        Config,
        DigitsConf,
        MLPConf,
        SchemeConf,
        SGDConf,
        ShuffleJobConf,
        ShufflePolicyConf,
    )

    expected = Config(
        job=ShuffleJobConf(),
        scheme=SchemeConf(name="cycles"),
        shuffle=ShufflePolicyConf(),
        data=DigitsConf(),
        model=MLPConf(),
        optim=SGDConf(),
    )
    assert compose() == expected


def _overrides(node, schema, path=""):
    """``(key, value, schema default)`` of every leaf a group file sets."""
    for key, value in node.items():
        where = f"{path}{key}"
        if OmegaConf.is_dict(value) and key in schema and OmegaConf.is_dict(schema[key]):
            yield from _overrides(value, schema[key], where + ".")
        else:
            missing = key not in schema or OmegaConf.is_missing(schema, key)
            yield where, value, None if missing else OmegaConf.to_container(schema)[key]


def test_every_group_file_sets_only_what_its_option_changes():
    """A group option's file names its schema and sets only keys whose value differs from
    the schema's default (no default written twice: ``max_restarts`` has one home)."""
    from coded_shuffle_train.config import SCHEMAS

    schema_of = {f"schema_{o}": c for options in SCHEMAS.values() for o, c in options.items()}
    files = sorted(CONF_DIR.glob("*/*.yaml"))
    assert len(files) >= 15
    for path in files:
        node = OmegaConf.load(path)
        (schema_name,) = [d for d in node.pop("defaults") if d != "_self_"]
        schema = OmegaConf.structured(schema_of[schema_name])
        for key, value, default in _overrides(node, schema):
            assert value != default, f"{path.name}: {key}={value} repeats the schema's default"


@pytest.mark.parametrize(
    ("overrides", "restarts"),
    [
        ([], 0),
        (["dist.max_restarts=2"], 2),
        (["job=elastic_gd", "workers=8"], 1),  # a worker that dies is survived unless told
        (["job=elastic_gd", "workers=8", "dist.max_restarts=0"], 0),  # one key for every job
        (["job=elastic_matmul", "workers=8"], 0),
    ],
)
def test_one_restart_setting_for_every_job(overrides, restarts):
    from coded_shuffle_train.entry import validate

    cfg = compose(*overrides)
    assert validate(cfg).max_restarts(cfg) == restarts


def test_a_negative_restart_count_is_one_usage_error():
    from coded_shuffle_train.entry import validate

    cfg = compose("dist.max_restarts=-1")
    with pytest.raises(UsageError, match=r"dist\.max_restarts=-1 out of range \(must be >= 0\)"):
        validate(cfg).max_restarts(cfg)


def test_every_debug_key_is_a_fault_kind_of_the_one_registry():
    """The job's ``debug.*`` keys are exactly the keys the registry's ``job`` kinds name;
    every cluster kind is a ``coded-shuffle cluster`` flag."""
    keys = [key for name in fault_kinds("job") for key in FAULTS[name].keys]
    assert sorted(keys) == sorted(f.name for f in dataclasses.fields(DebugConf))
    cluster = build_parser()._subparsers._group_actions[0].choices["cluster"]
    flags = {opt for action in cluster._actions for opt in action.option_strings}
    assert {f"--{name}" for name in fault_kinds("cluster")} <= flags
    assert not [name for name in FAULTS if FAULTS[name].by == "cluster" and FAULTS[name].keys]
