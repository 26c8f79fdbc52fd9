"""The training harness: records, data sources, the worker's own-store protocol for every
scheme (in process), config validation, and real multi-process jobs (at most 5 processes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from coded_shuffle.costs.wire import REACH_DTYPE
from coded_shuffle.distributed.delivery import Delivery
from coded_shuffle.distributed.epochs import EpochChain, placement_points, store_from_points
from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import batches
from coded_shuffle.math.schemes import get_scheme
from train import checkpoint, data, shuffle_sgd
from train.compose import CONF_DIR
from train.metrics import EPOCH_KEYS, RESIZE_KEYS

REPO = Path(__file__).resolve().parent.parent
SCHEMES = ("uncoded", "attia-tandon", "cycles")  # bit-identity across these (when registered)
# excess storage: memory sharing over two byte parts, and an integer corner
# (T = 2 is two byte parts between A-T's corners 1.75 and 2.5 at K = 4; E-M's corner t = 2)
EXCESS = (("attia-tandon-excess", 2), ("elmahdy-mohajer", 2))
JOB = ["workers=4", "epochs=3", "seed=3", "model=mlp", "model.hidden=16", "dist.timeout_seconds=60"]


def compose(*overrides: str):
    """The typed config (:class:`train.config.Config`) the jobs receive."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from train.compose import register_configs
    from train.entry import typed

    register_configs()  # the typed schemas the YAMLs name
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return typed(hydra_compose("config", overrides=list(overrides)))


# --- records and data ------------------------------------------------------------------------


def test_digits_are_trimmed_to_a_multiple_of_the_workers():
    cfg = compose("data=digits").data
    ds = data.load(cfg, workers=7, seed=0)
    assert ds.num_points % 7 == 0 and 0 <= ds.dropped < 7
    assert ds.num_points + ds.dropped + len(ds.test) == 1797
    assert abs(float(ds.train.tensors[0].mean())) < 1e-3  # standardised with the statistics
    assert data.describe(cfg).train_points == ds.num_points + ds.dropped


@pytest.mark.parametrize("suffix", [".npz", ".pt"])
def test_file_source(tmp_path, suffix):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 3, 3)).astype(np.float32), rng.integers(0, 4, 50)
    path = tmp_path / f"d{suffix}"
    if suffix == ".npz":
        np.savez(path, X=x, y=y)
    else:
        torch.save({"X": torch.from_numpy(x), "y": torch.from_numpy(y)}, path)
    cfg = compose("data=file", f"data.path={path}", "data.test_fraction=0.2").data
    assert data.describe(cfg) == data.DataInfo(40, 9, 4)
    ds = data.load(cfg, workers=3, seed=1)
    assert (ds.num_points, ds.dropped, ds.features) == (39, 1, 9)


def test_synthetic_sizes_come_from_the_config():
    cfg = compose("data=synthetic", "data.points=101", "data.features=5", "data.classes=3").data
    ds = data.load(cfg, workers=4, seed=0)
    assert (ds.num_points, ds.dropped, ds.features, ds.classes) == (100, 1, 5, 3)


# --- the worker's protocol for every scheme, in process ------------------------------------


CASES = [(s, 1.0) for s in ("uncoded", "attia-tandon", "cycles", "best")] + [
    ("attia-tandon-excess", 2.0),
    ("attia-tandon-excess", 1.5),
    ("elmahdy-mohajer", 2.0),
    ("elmahdy-mohajer", 2.5),
]


@pytest.mark.parametrize(("name", "storage"), CASES)
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_workers_decode_from_their_own_store_every_epoch(name, storage, seed):
    """Placement keep-set, own-program decode, store update: what every worker rank does."""
    k_workers, n, b, epochs = 4, 24, 72, 4
    scheme = get_scheme(name)
    scheme.check(n, k_workers, storage)
    gen = torch.Generator().manual_seed(seed)
    records = torch.randint(0, 256, (n, b), dtype=torch.uint8, generator=gen)
    chain = EpochChain(scheme, n, k_workers, storage, seed)
    transitions = list(chain.transitions(epochs))
    firsts = batches(chain.first, k_workers)
    stores = []
    for k in range(k_workers):  # epoch 1: each worker keeps only what it places
        delivery = Delivery.prepare_worker(transitions[0].plan, b, k)
        keep = placement_points(scheme, chain.initial, k)
        assert np.isin(firsts[k], keep).all()
        stores.append(store_from_points(delivery, k, keep, records[torch.from_numpy(keep)]))
    for tr in transitions:
        symbols = Delivery.prepare(tr.plan, b).encode(records)
        for k in range(k_workers):
            mine = Delivery.prepare_worker(tr.plan, b, k)
            heard = [
                s.index_select(0, torch.from_numpy(mine.programs[p][k].symbol_ids))
                for p, s in enumerate(symbols)
            ]
            batch, work = mine.decode(k, heard, stores[k])
            want = records[torch.from_numpy(tr.plans[0].new_batches[k])]
            assert torch.equal(batch, want), f"{name} epoch {tr.epoch} worker {k}"
            stores[k] = stores[k].updated(work, scheme.part_caches(tr.next_state, k))


# --- validation: before any process starts -------------------------------------------------


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
        (["dist.transport=smoke"], "dist.transport='smoke' unknown; valid: chain, multicast"),
        (["dist.transport=p2p"], "dist.transport=p2p carries uncoded deliveries only"),
        (["dist.transport=unicast", "scheme=best"], "scheme=best is coded"),
        (["dist.transport=multicast"], "dist.multicast.rate is required"),
        (["dist.transport=multicast", "dist.multicast.rate=9x"], "rate '9x' cannot be parsed"),
        (["dist.chain.order=[1,2,2,3]"], "must list every worker rank 1..4 once"),
        (["shuffle=partial", "shuffle.fraction=0"], "shuffle.fraction=0.0 out of range (0, 1]"),
        (["shuffle=partial", "shuffle.fraction=1.5"], "shuffle.fraction=1.5 out of range"),
        (["shuffle.name=sometimes"], "shuffle='sometimes' unknown; valid: full, partial, none"),
        (["data.placement=sorted"], "data.placement='sorted' unknown; valid: random, by_label"),
    ],
)
def test_invalid_configs_raise_one_usage_error(overrides, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(".", r"\.")):
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
    from train.launch import start_method_of

    assert start_method_of(argv) == method
    assert compose().dist.start_method == "forkserver"


def test_unknown_scheme_is_a_usage_error():
    cfg = compose()
    cfg.scheme.name = "no-such-scheme"
    with pytest.raises(UsageError, match="unknown scheme 'no-such-scheme'; valid: "):
        shuffle_sgd.validate(cfg)


def _command() -> list[str]:
    exe = shutil.which("coded-shuffle-train")
    return [exe] if exe else [sys.executable, "-m", "train.launch"]


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        _command() + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


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
    out = _run([*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert not (tmp_path / "run" / "config.yaml").exists()  # stopped before any process


# --- real multi-process jobs ---------------------------------------------------------------


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


TRANSPORTS = ("tree", "unicast", "p2p")  # besides the default chain; multicast: test_cluster


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Sweeps over the SCHEMES (on the default chain), over the other TCP transports
    (uncoded, as unicast and p2p require) and chain on the gloo data plane (unicast's gloo
    plane: test_transports.py), and over the excess-storage schemes; same seed."""
    root = tmp_path_factory.mktemp("train")
    found = {}
    (storage,) = {t for _, t in EXCESS}
    for name, sweep in (
        ("schemes", ["-m", f"scheme={','.join(SCHEMES)}"]),
        (
            "transports",
            [
                "-m",
                "scheme=uncoded",
                f"dist.transport={','.join(TRANSPORTS)},chain",
                "dist.chain.plane=gloo",
            ],
        ),
        ("excess", ["-m", f"scheme={','.join(n for n, _ in EXCESS)}", f"storage={storage}"]),
    ):
        out = _run([*sweep, *JOB, f"hydra.sweep.dir={root / name}"], root)
        assert out.returncode == 0, out.stderr[-3000:]
        for metrics in (root / name).rglob("metrics.jsonl"):
            first = _metrics(metrics.parent)[0]
            key = {
                "schemes": first["scheme"],
                "transports": f"uncoded/{first['transport']}",
                "excess": f"{first['scheme']} T={storage}",
            }[name]
            key += "/gloo" if key == "uncoded/chain" else ""
            found[key] = metrics.parent
    return found


RUNS = [
    *SCHEMES,
    *(f"uncoded/{t}" for t in TRANSPORTS),
    *(f"{n} T={t}" for n, t in EXCESS),
    "uncoded/chain/gloo",  # the gloo data plane
]


@pytest.mark.distributed
@pytest.mark.parametrize("scheme", RUNS)
def test_every_epoch_is_verified_and_recorded(runs, scheme):
    rows = _metrics(runs[scheme])
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert [r["phase"] for r in rows] == ["placement", "coded", "coded"]
    for row in rows:
        assert set(EPOCH_KEYS) <= set(row), set(EPOCH_KEYS) - set(row)
        assert row["verified"] is True
        assert row["broadcast_bytes"] == row["payload_bytes"] + row["header_bytes"]
        assert row["lower_bound_bytes"] <= row["payload_bytes"]
        check_host_bytes(row)
        assert np.isfinite(row["train_loss"]) and 0 <= row["test_accuracy"] <= 1
    elapsed = [r["elapsed_seconds"] for r in rows]
    assert all(r["epoch_seconds"] > 0 for r in rows) and elapsed == sorted(elapsed)
    assert elapsed[-1] >= sum(r["epoch_seconds"] for r in rows) - 1e-6  # epochs in sequence
    first = rows[0]
    assert first["broadcast_bytes"] == first["uncoded_bytes"]  # the placement is uncoded
    assert first["payload_bytes"] >= first["points"] * first["point_bytes"]
    for row in rows[1:]:
        if row["scheme"] == "uncoded":
            assert row["broadcast_bytes"] == row["uncoded_bytes"]  # same framing, same bytes
        else:
            assert row["broadcast_bytes"] < row["uncoded_bytes"]
    summary = _summary(runs[scheme])
    assert summary["all_verified"] and summary["workers_params_agree"]
    assert len(summary["final_params_sha256"]) == 64
    assert summary["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")  # auto
    config = OmegaConf.load(runs[scheme] / "config.yaml")
    assert config.seed == 3 and config.workers == 4


def check_host_bytes(row: dict) -> None:
    """Each transport's counts against its model (5 processes: the master and 4 workers)."""
    link, egress, ingress = (
        row["broadcast_bytes"],
        row["host_egress_bytes"],
        row["host_ingress_bytes"],
    )
    assert row["master_egress_bytes"] == egress[0] and row["network_bytes"] == sum(egress)
    assert sum(egress) == sum(ingress)
    if row["transport"] == "chain":  # 0 -> 1 -> 2 -> 3 -> 4, each message as far as it is kept
        table = REACH_DTYPE.itemsize * row["messages"]  # the reach table, on every link
        assert egress[0] == link + table and egress[4] == 0 and ingress[0] == 0
        assert ingress[1:] == egress[:4]  # what a rank sent, its next one received
        assert all(e <= i for e, i in zip(egress[1:], ingress[1:], strict=True))
        assert row["control_bytes"] == 4 * table
        assert row["network_bytes"] == row["network_bytes_model"]  # from the plan's keep sets
    elif row["transport"] == "tree":  # gloo's binomial tree: 0 -> 1, 2, 4; 1 -> 3
        assert egress == [3 * link, link, 0, 0, 0] and ingress == [0, link, link, link, link]
    elif row["phase"] == "coded" and row["transport"] == "p2p":
        assert egress[0] == 0  # the workers send what leaves them, the master nothing
        assert row["network_bytes"] >= row["uncoded_points"] * row["point_bytes"]
    else:  # unicast (and p2p's placement): the master sends each worker its own rows once
        assert ingress[0] == 0 and egress[1:] == [0, 0, 0, 0]
        assert egress[0] >= row["uncoded_points"] * row["point_bytes"]
    check_host_cpu(row)


def check_host_cpu(row: dict) -> None:
    """Every host's CPU seconds in the delivery: the workers at least decoded and hashed."""
    busy, system = row["host_cpu_seconds"], row["host_cpu_system_seconds"]
    assert len(busy) == len(system) == row["workers"] + 1
    assert all(0 <= s <= b for s, b in zip(system, busy, strict=True))
    assert all(b > 0 for b in busy[1:])  # a worker's digest alone takes CPU time
    moved = [sum(b) for b in zip(row["host_egress_bytes"], row["host_ingress_bytes"], strict=True)]
    worst = max(b / (m / 1e9) for b, m in zip(busy, moved, strict=True) if m)
    assert row["cpu_seconds_per_gb_max"] == pytest.approx(worst)


@pytest.mark.distributed
def test_every_scheme_and_transport_trains_bit_identical_parameters(runs):
    hashes = {name: _summary(path)["final_params_sha256"] for name, path in runs.items()}
    assert len(set(hashes.values())) == 1, hashes
    losses = {name: [r["test_loss"] for r in _metrics(path)] for name, path in runs.items()}
    assert len({tuple(v) for v in losses.values()}) == 1


@pytest.mark.distributed
def test_excess_storage_sends_fewer_bytes_than_no_excess(runs):
    """Issue 4: storage=2 logs fewer bytes per coded epoch than storage=1, same parameters."""
    excess, plain = runs["elmahdy-mohajer T=2"], runs["cycles"]
    coded = [r for r in _metrics(excess) if r["phase"] == "coded"]
    base = [r for r in _metrics(plain) if r["phase"] == "coded"]
    assert [r["epoch"] for r in coded] == [r["epoch"] for r in base] == [2, 3]
    for ours, theirs in zip(coded, base, strict=True):
        assert ours["storage"] == 2 and theirs["storage"] == 1
        assert ours["broadcast_bytes"] < theirs["broadcast_bytes"]
        assert ours["stored_points_max"] <= 2 * ours["points"] / ours["workers"]
    assert _summary(excess)["final_params_sha256"] == _summary(plain)["final_params_sha256"]


@pytest.mark.distributed
def test_compare_script_writes_the_plots(runs, tmp_path):
    spec = spec_from_file_location("compare", REPO / "scripts" / "compare.py")
    compare = module_from_spec(spec)
    sys.modules["compare"] = compare  # dataclasses look their module up
    spec.loader.exec_module(compare)
    assert compare.main([*(str(p) for p in runs.values()), "--out", str(tmp_path)]) == 0
    for name in ("loss.png", "bytes.png", "cumulative.png", "time.png", "traffic.png"):
        png = (tmp_path / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_compare_tables_what_each_run_took_to_reach_a_target(tmp_path, capsys):
    """The time-to-target table from metrics written here: the first epoch at or above the
    target, its elapsed seconds, the shuffle bytes summed up to it; or ``not reached``."""
    spec = spec_from_file_location("compare", REPO / "scripts" / "compare.py")
    compare = module_from_spec(spec)
    sys.modules["compare"] = compare
    spec.loader.exec_module(compare)
    acc = {"fast": [0.5, 0.91, 0.95], "slow": [0.4, 0.6, 0.7]}
    for name, accuracies in acc.items():
        (tmp_path / name).mkdir()
        rows = [
            {
                "epoch": e + 1,
                "scheme": "cycles",
                "transport": "chain",
                "shuffle": "partial",
                "fraction": 0.25,
                "test_accuracy": a,
                "test_loss": 1 - a,
                "train_loss": 1 - a,
                "elapsed_seconds": 10.0 * (e + 1),
                "network_bytes": 1000 * (e + 1),
                "master_egress_bytes": 100,
                "broadcast_bytes": 1,
                "uncoded_bytes": 2,
                "lower_bound_bytes": 1,
                "delivery_seconds": 0.1,
                "phase": "coded",
                "storage": 1,
                "workers": 4,
                "verified": True,
            }
            for e, a in enumerate(accuracies)
        ]
        text = "\n".join(json.dumps(r) for r in rows)
        (tmp_path / name / "metrics.jsonl").write_text(text)
    args = [str(tmp_path / "fast"), str(tmp_path / "slow"), "--out", str(tmp_path / "plots")]
    assert compare.main([*args, "--target-accuracy", "0.9"]) == 0
    out = capsys.readouterr().out
    table = out.split("to test accuracy 0.9:")[1].splitlines()
    fast = next(ln for ln in table if ln.startswith("partial0.25/cycles/chain fast"))
    assert fast.split()[2:] == ["2", "20.00", "3,000", "200"]  # epoch 2: 1000 + 2000 bytes
    assert re.search(r"partial0\.25/cycles/chain slow +not reached \(best 0\.700\)", out)


@pytest.mark.distributed
def test_a_dead_worker_fails_the_job_naming_its_rank_and_the_same_command_resumes(runs, tmp_path):
    """The job fails in one line naming the rank; the same command again (same run
    directory) resumes after the last epoch, re-places the one damaged store only, and ends
    with the unbroken run's parameters."""
    t0 = time.perf_counter()
    args = ["scheme=uncoded", *JOB, "debug.die_rank=2", "debug.die_epoch=2"]
    out = _run([*args, "dist.timeout_seconds=20", f"hydra.run.dir={tmp_path}"], tmp_path)
    elapsed = time.perf_counter() - t0
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("coded-shuffle-train: error: rank 2 (worker 1) failed"), out.stderr
    assert "Traceback" not in out.stderr
    assert elapsed < 60
    assert [r["epoch"] for r in _metrics(tmp_path)] == [1]  # epoch 1 finished, then the death
    store = tmp_path / "stores" / "worker-2" / "e1-part0.npy"
    store.write_bytes(store.read_bytes()[:-1] + bytes([store.read_bytes()[-1] ^ 1]))
    again = _run([*args, "debug.die_rank=null", f"hydra.run.dir={tmp_path}"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed after epoch 1 (attempt 0)" in again.stderr + again.stdout
    rows = _metrics(tmp_path)
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert rows[1]["resumed_after_epoch"] == 1 and rows[1]["replaced_workers"] == [2]
    assert 0 < rows[1]["replacement_bytes"] < rows[0]["broadcast_bytes"]  # one worker's batch
    summary = _summary(tmp_path)
    assert summary["final_params_sha256"] == _summary(runs["uncoded"])["final_params_sha256"]
    assert summary["restarts"] == 1 and summary["all_verified"] is True


def test_the_checkpoint_of_another_run_is_refused_in_one_line(tmp_path):
    cfg = compose("scheme=cycles", *JOB)
    checkpoint.save(tmp_path, cfg, 2, torch.zeros(3), torch.zeros(0), [])
    assert checkpoint.load(tmp_path, cfg)["epoch"] == 2
    with pytest.raises(UsageError, match="is the checkpoint of another run"):
        checkpoint.load(tmp_path, compose("scheme=cycles", *JOB, "seed=4"))
    with pytest.raises(UsageError, match="holds epoch 2, beyond epochs=1"):
        checkpoint.load(tmp_path, compose("scheme=cycles", *JOB, "epochs=1"))
    transport = compose("scheme=cycles", *JOB, "dist.transport=tree")  # bit-identical: fine
    assert checkpoint.load(tmp_path, transport)["epoch"] == 2


@pytest.mark.distributed
def test_a_restarted_job_resumes_with_every_store_and_the_same_parameters(runs, tmp_path):
    """``dist.max_restarts=1``: the launcher restarts every process after a worker died in
    epoch 3; the job resumes after epoch 2 with every store intact (nothing re-placed)."""
    args = ["scheme=cycles", *JOB, "debug.die_rank=3", "debug.die_epoch=3"]
    out = _run([*args, "dist.max_restarts=1", f"hydra.run.dir={tmp_path}"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = _metrics(tmp_path)
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert rows[2]["resumed_after_epoch"] == 2 and rows[2]["attempt"] == 1
    assert rows[2]["replaced_workers"] == [] and rows[2]["replacement_bytes"] == 0
    # the restarted attempt's clock continues the first's, the restart's own seconds included
    gap = rows[2]["elapsed_seconds"] - rows[1]["elapsed_seconds"]
    assert abs(gap - (rows[2]["time"] - rows[1]["time"])) < 0.5, rows
    assert gap > rows[2]["epoch_seconds"]
    summary = _summary(tmp_path)
    assert summary["final_params_sha256"] == _summary(runs["cycles"])["final_params_sha256"]


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("scheme", "transport", "damage"), [("cycles", "chain", False), ("uncoded", "unicast", True)]
)
def test_a_worker_killed_mid_epoch_resumes_at_its_last_checkpointed_step(
    runs, tmp_path, scheme, transport, damage
):
    """``job.checkpoint_steps=4``: worker 1 dies at step 7 of epoch 2 (23 steps); the restart
    (the launcher's, or the same command again after a worker's kept batch was damaged)
    resumes at step 4 of epoch 2 without a new delivery (the damaged batch sent again, alone)
    and ends with the unbroken run's parameters."""
    args = [f"scheme={scheme}", f"dist.transport={transport}", *JOB, "job.checkpoint_steps=4",
            "debug.die_rank=2", "debug.die_epoch=2", "debug.die_step=7",
            f"hydra.run.dir={tmp_path}"]  # fmt: skip
    if damage:
        assert _run(args, tmp_path).returncode == 1
        kept = tmp_path / "stores" / "worker-0" / "batch-e2.npy"
        kept.write_bytes(kept.read_bytes()[:-1] + bytes([kept.read_bytes()[-1] ^ 1]))
        out = _run([*args, "debug.die_rank=null"], tmp_path)
    else:
        out = _run([*args, "dist.max_restarts=1"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed inside epoch 2 at step 4 of 23" in out.stderr + out.stdout
    reference = runs[scheme if transport == "chain" else f"{scheme}/{transport}"]
    rows, unbroken = _metrics(tmp_path), _metrics(reference)
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    second = rows[1]
    assert second["resumed_at_step"] == 4 and second["resumed_inside_epoch"] == 2
    assert second["attempt"] == (0 if damage else 1) and second["replaced_workers"] == []
    assert second["rebatched_workers"] == ([0] if damage else [])
    assert (second["rebatch_bytes"] > 0) == damage
    assert second["rebatch_bytes"] < rows[0]["broadcast_bytes"] / 3  # one worker's batch
    assert second["broadcast_bytes"] == unbroken[1]["broadcast_bytes"]  # the first delivery
    assert second["verified"] and "resumed_at_step" not in rows[2]
    summary = _summary(tmp_path)
    assert summary["final_params_sha256"] == _summary(reference)["final_params_sha256"]
    assert summary["restarts"] == 1 and summary["all_verified"] is True


@pytest.mark.distributed
@pytest.mark.parametrize(("before", "after", "epochs"), [(4, 3, 5), (3, 4, 4)])
def test_a_run_goes_on_with_another_number_of_workers(tmp_path, before, after, epochs):
    """The same command with another ``workers``: the model goes on from the checkpoint, the
    next epoch places the data for the new number (only what the workers that remain do not
    hold crosses the link), every epoch verified, and (``4 -> 3``) the accuracy is an unbroken
    run's at the new number, within 0.01. ``4 -> 3`` after epoch 3, killed again after epoch
    4: the run resumes at the new number from its stores (its assignments start at epoch 4's
    placement)."""
    run = tmp_path / "run"
    args = [f"epochs={epochs}", *JOB[2:], f"hydra.run.dir={run}"]  # JOB's, but workers
    at = 4  # the epoch at whose start worker 1 dies
    die = ["debug.die_rank=2", f"debug.die_epoch={at}"]
    assert _run([f"workers={before}", *args, *die], tmp_path).returncode == 1
    again = epochs > at  # dies again at the next epoch's start, then resumes after it
    twice = [die[0], f"debug.die_epoch={at + 1}"] if again else []
    out = _run([f"workers={after}", *args, *twice], tmp_path)
    assert out.returncode == (1 if again else 0), out.stderr[-3000:]
    assert f"with {after} workers instead of {before}" in out.stderr + out.stdout
    if again:
        out = _run([f"workers={after}", *args], tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"resumed after epoch {at} (attempt 0): stores of {after} of {after}" in out.stderr
    rows = _metrics(run)
    assert [(r["epoch"], r["workers"]) for r in rows] == [
        (e, before if e < at else after) for e in range(1, epochs + 1)
    ]
    resized = rows[at - 1]
    assert resized["phase"] == "placement" and resized["verified"]
    assert (resized["workers_before"], resized["workers_after"]) == (before, after)
    assert resized["resize_bytes"] == resized["broadcast_bytes"] > 0
    assert resized["resize_bytes"] < resized["fresh_placement_bytes"] == resized["uncoded_bytes"]
    assert resized["reused_points"] > 0 and resized["resumed_after_epoch"] == at - 1
    summary = _summary(run)
    assert summary["all_verified"] and summary["workers"] == after
    assert summary["resizes"] == [{k: resized[k] for k in RESIZE_KEYS}]
    if not again:  # the accuracy against an unbroken run's: once (4 -> 3), for time
        return
    unbroken = tmp_path / "unbroken"
    done = _run([f"workers={after}", *args[:-1], f"hydra.run.dir={unbroken}"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = _summary(unbroken)
    assert abs(summary["final_test_accuracy"] - reference["final_test_accuracy"]) <= 0.01


@pytest.mark.distributed
def test_a_wrong_decode_fails_loudly(tmp_path):
    """The master corrupts one symbol (its message digest still matches what it sends), so
    the worker decodes a wrong batch; the master compares the batch digests and fails."""
    args = ["scheme=uncoded", *JOB, "debug.corrupt_epoch=2", f"hydra.run.dir={tmp_path}"]
    out = _run(args, tmp_path)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert "failed: VerificationError: epoch 2: worker" in last, out.stderr
    assert "the master's is" in last
    assert [r["epoch"] for r in _metrics(tmp_path)] == [1]


def test_local_sgd_averages_every_h_steps_and_at_the_epochs_end():
    assert shuffle_sgd.averaging_steps(10, 0) == []
    assert shuffle_sgd.averaging_steps(10, 3) == [3, 6, 9, 10]
    assert shuffle_sgd.averaging_steps(9, 3) == [3, 6, 9]
    assert shuffle_sgd.averaging_steps(2, 5) == [2]
    with pytest.raises(UsageError, match=r"optim\.average_every=-1 out of range"):
        shuffle_sgd.validate(compose("optim.average_every=-1"))


@pytest.mark.distributed
def test_local_sgd_trains_the_same_model_whatever_the_scheme(tmp_path):
    """``optim.average_every=5`` on a partial reshuffle from skewed shards (``by_label``):
    coded and uncoded delivery end with the same parameters; the all-reduce carries the
    parameters and momentum per averaging; the first shards were dealt by label (after one
    epoch on a few classes each, the averaged model is far from the random placement's)."""
    shas = {}
    for scheme in ("cycles", "uncoded"):
        run_dir = tmp_path / scheme
        args = [f"scheme={scheme}", *JOB, "optim.average_every=5", "shuffle=partial"]
        args += ["shuffle.fraction=0.5", "data.placement=by_label"]
        out = _run([*args, f"hydra.run.dir={run_dir}"], tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        rows, summary = _metrics(run_dir), _summary(run_dir)
        assert summary["average_every"] == 5 and summary["shuffle"] == "partial"
        assert summary["placement"] == "by_label"
        steps = -(-(rows[0]["points"] // 4) // 16)  # batch_size 16 per worker
        model = rows[0]["param_bytes"] - 16  # the flat parameters (the loss pair is 16 bytes)
        averagings = len(shuffle_sgd.averaging_steps(steps, 5))
        assert all(r["allreduce_payload_bytes"] == averagings * 2 * model for r in rows)
        shas[scheme] = summary["final_params_sha256"]
    assert shas["cycles"] == shas["uncoded"]


def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def _tiny_loss(model: torch.nn.Module, step: int, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(9, 7, generator=gen), torch.randint(0, 3, (9,), generator=gen)
    return torch.nn.functional.cross_entropy(model(x), y)


def _ddp_step(rank: int, world: int, steps: int) -> list[bytes]:
    """A small model in DDP with the job's hook; every rank its own data. Returns the
    gradients after each step (a second step runs on the buckets DDP rebuilt)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = _tiny_model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=1)
    order = {id(p): i for i, p in enumerate(model.parameters())}
    ddp.register_comm_hook((None, order), shuffle_sgd.mean_in_model_order)
    grads = []
    for step in range(steps):
        model.zero_grad()
        _tiny_loss(ddp, step, rank).backward()
        grads.append(b"".join(p.grad.numpy().tobytes() for p in model.parameters()))
    dist.barrier()
    return grads


def _manual_mean_grads(world: int, steps: int) -> list[bytes]:
    """The same steps without DDP: every rank's gradients, summed in rank order, / world."""
    model = _tiny_model()
    out = []
    for step in range(steps):
        per_rank = []
        for rank in range(world):
            model.zero_grad()
            _tiny_loss(model, step, rank).backward()
            per_rank.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        out.append(torch.stack(per_rank).sum(0) / world)
    return [g.numpy().tobytes() for g in out]


@pytest.mark.distributed
def test_the_jobs_ddp_hook_averages_every_gradient_in_the_models_order():
    """DDP with the job's communication hook: every rank ends each step with the mean of the
    ranks' gradients (close to a plain sum; bit-identical across ranks), the first step and
    the one after DDP rebuilt its buckets alike."""
    from tests.ranks import run_ranks

    world, steps = 3, 2
    results = run_ranks(world, _ddp_step, steps)
    assert all(r == results[0] for r in results)  # the same bits on every rank
    want = _manual_mean_grads(world, steps)
    for got, expected in zip(results[0], want, strict=True):
        a, b = np.frombuffer(got, np.float32), np.frombuffer(expected, np.float32)
        assert np.allclose(a, b, rtol=1e-5, atol=1e-7)


def _averaged(rank: int, world: int) -> list[list[float]]:
    """Every rank's own parameters and momentum (made unlike the others'), then local SGD's
    average over the world: the parameters and momentum buffers after it."""
    import torch.distributed as dist

    model = _tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _tiny_loss(model, 0, rank).backward()
    opt.step()  # momentum buffers exist now
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(rank + i)
            opt.state[p]["momentum_buffer"].mul_(rank + 1)
    before = [torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist(),
              torch.cat([opt.state[p]["momentum_buffer"].reshape(-1)
                         for p in model.parameters()]).tolist()]  # fmt: skip
    shuffle_sgd.average_state(list(model.parameters()), opt, dist.group.WORLD, world)
    after = [torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist(),
             torch.cat([opt.state[p]["momentum_buffer"].reshape(-1)
                        for p in model.parameters()]).tolist()]  # fmt: skip
    return [before, after]


@pytest.mark.distributed
def test_local_sgd_averages_the_parameters_and_the_momentum_of_every_worker():
    """After an averaging every worker holds the mean of the workers' parameters *and* of
    their momentum buffers (computed here from what each held before)."""
    from tests.ranks import run_ranks

    results = run_ranks(3, _averaged)
    for which in (0, 1):  # parameters, momentum
        mean = np.mean([np.array(r[0][which]) for r in results], axis=0)
        assert not np.allclose(results[0][0][which], results[1][0][which])  # they differed
        for r in results:
            assert np.allclose(r[1][which], mean, rtol=1e-6, atol=1e-6)


def _same_start(rank: int, world: int, differ: bool) -> str:
    """The worker's start check on a drawn model (rank 1's nudged when ``differ``)."""
    from types import SimpleNamespace

    model = _tiny_model()
    if differ and rank == 1:
        with torch.no_grad():
            next(model.parameters())[0, 0] += 1e-6
    try:
        shuffle_sgd.Worker.same_start(SimpleNamespace(model=model, model_group=None))
    except RuntimeError as exc:
        return str(exc)
    return "same"


@pytest.mark.distributed
def test_workers_start_from_one_model_checked_by_digest_not_broadcast():
    """DDP does not broadcast the model at start (``init_sync=False``): the workers compare
    digests instead, and a worker whose model differs by one bit of one weight stops every
    worker in one line."""
    from tests.ranks import run_ranks

    assert run_ranks(3, _same_start, False) == ["same"] * 3
    for line in run_ranks(3, _same_start, True):
        assert line.startswith("the workers drew different models from one seed"), line
        assert "\n" not in line


def test_the_job_hands_its_placement_and_policy_to_the_coded_shuffle():
    """``data.placement=by_label`` (and the shuffle policy) reach the library's settings."""
    from train.shuffle_sgd.settings import shuffle_settings

    settings = shuffle_settings(
        compose("data.placement=by_label", "shuffle=partial", "shuffle.fraction=0.5")
    )
    assert (settings.placement, settings.shuffle, settings.fraction) == ("by_label", "partial", 0.5)
    assert shuffle_settings(compose()).placement == "random"


def test_the_master_evaluates_the_test_split_transformed_once():
    """data=dataset with a transform that is not idempotent (``x / 255 - 0.5``): the master's
    evaluation reads the raw test inputs and transforms them once."""
    from train.shuffle_sgd.master import Master

    cfg = compose("data=dataset", "+data.transform.mean=0.5", "model=logreg")
    ds = data.load(cfg.data, workers=4, seed=0)
    assert ds.test.tensors[0].dtype == torch.uint8  # raw, as the records carry them
    master = object.__new__(Master)
    master.device = torch.device("cpu")
    torch.manual_seed(0)
    master.model, master.data = torch.nn.Linear(64, 10), ds
    loss, accuracy = master.evaluate()
    x, y = ds.test.tensors[0], ds.test.tensors[1].long()
    with torch.no_grad():
        once = master.model(shuffle_sgd.model_inputs(ds.transform, x))
        twice = master.model(shuffle_sgd.model_inputs(ds.transform, ds.transform(x)))
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(once, y)), rel=1e-6)
    assert loss != pytest.approx(float(torch.nn.functional.cross_entropy(twice, y)), rel=1e-3)
    assert accuracy == pytest.approx(float((once.argmax(1) == y).double().mean()))


def test_the_epoch_line_says_what_was_turned_away_only_when_something_was():
    from train.metrics import progress_line

    row = {"epoch": 2, "phase": "coded", "scheme": "cycles", "transport": "multicast",
           "train_loss": 0.5, "test_loss": 0.4, "test_accuracy": 0.9, "broadcast_bytes": 2048,
           "uncoded_bytes": 4096, "saved_percent": 50.0, "master_egress_bytes": 2100,
           "delivery_seconds": 0.1, "verified": True}  # fmt: skip
    assert "turned away" not in progress_line({**row, "foreign_datagrams": 0}, 3)
    line = progress_line({**row, "foreign_datagrams": 7, "refused_connections": 1}, 3)
    assert line.endswith("| turned away 7 datagrams, 1 connections")


def test_an_elastic_job_takes_its_workers_from_the_world(monkeypatch, capsys):
    """``dist.elastic``: ``workers`` becomes WORLD_SIZE - 1 (rank 0 says so); a world without
    a worker, or torch's store shared across attempts, stops with one line."""
    from train.compose import compose_argv
    from train.entry import follow_world, typed

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
