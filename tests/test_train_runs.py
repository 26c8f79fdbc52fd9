"""Real multi-process jobs (at most 5 processes): every scheme and transport verified and
recorded, with bit-identical parameters, and the comparison script on their outputs."""

from __future__ import annotations

import json
import re
import sys
from importlib.util import module_from_spec, spec_from_file_location

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from coded_shuffle.costs.wire import REACH_DTYPE
from coded_shuffle.tools.records import read_metrics
from coded_shuffle_train.metrics import EPOCH_KEYS
from tests.helpers import (
    REPO,
    RUNS,
    read_summary,
)


@pytest.mark.distributed
@pytest.mark.parametrize("scheme", RUNS)
def test_every_epoch_is_verified_and_recorded(runs, scheme):
    rows = read_metrics(runs[scheme])
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert [r["phase"] for r in rows] == ["placement", "coded", "coded"]
    for row in rows:
        assert set(EPOCH_KEYS) <= set(row), set(EPOCH_KEYS) - set(row)
        assert row["verified"] is True
        assert row["broadcast_bytes"] == row["payload_bytes"] + row["header_bytes"]
        assert row["lower_bound_bytes"] <= row["payload_bytes"]
        check_host_bytes(row)
        assert np.isfinite(row["train_loss"]) and 0 <= row["test_accuracy"] <= 1
    coverage = [r["coverage_min"] for r in rows]  # full reshuffles: about 1 - (3/4)^e
    assert coverage[0] == 0.25 and coverage == sorted(coverage) and coverage[-1] > 0.5
    assert all(0 <= r["label_tv_max"] < 0.2 for r in rows)  # random batches of 359 points
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
    summary = read_summary(runs[scheme])
    assert summary["all_verified"] and summary["workers_params_agree"]
    assert len(summary["final_params_sha256"]) == 64
    assert summary["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")  # auto
    config = OmegaConf.load(runs[scheme] / "config.yaml")
    assert config.seed == 3 and config.workers == 4


def check_host_bytes(row: dict) -> None:
    """Each transport's counts against its model (5 processes: the master and 4 workers).
    A placement that puts every point at one worker goes by ``unicast`` whatever the epochs'
    transport (each point only where it goes)."""
    link, egress, ingress = (
        row["broadcast_bytes"],
        row["host_egress_bytes"],
        row["host_ingress_bytes"],
    )
    assert row["master_egress_bytes"] == egress[0] and row["network_bytes"] == sum(egress)
    assert sum(egress) == sum(ingress)
    carrier = row.get("placement_transport", row["transport"])
    if row["phase"] == "placement" and row["transport"] in ("chain", "tree", "multicast"):
        assert (carrier == "unicast") == (row["storage"] == 1), row  # T > 1: points twice
    if carrier == "chain":  # 0 -> 1 -> 2 -> 3 -> 4, each message as far as it is kept
        table = REACH_DTYPE.itemsize * row["messages"]  # the reach table, on every link
        assert egress[0] == link + table and egress[4] == 0 and ingress[0] == 0
        assert ingress[1:] == egress[:4]  # what a rank sent, its next one received
        assert all(e <= i for e, i in zip(egress[1:], ingress[1:], strict=True))
        assert row["control_bytes"] == 4 * table
        assert row["network_bytes"] == row["network_bytes_model"]  # from the plan's keep sets
    elif carrier == "tree":  # gloo's binomial tree: 0 -> 1, 2, 4; 1 -> 3
        assert egress == [3 * link, link, 0, 0, 0] and ingress == [0, link, link, link, link]
    elif row["phase"] == "coded" and carrier in ("p2p", "peer-unicast"):
        assert egress[0] == 0  # the workers send (what leaves them; their symbols), the master
        # nothing; a symbol for d workers crosses d links: the uncoded bytes at least
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
    hashes = {name: read_summary(path)["final_params_sha256"] for name, path in runs.items()}
    assert len(set(hashes.values())) == 1, hashes
    losses = {name: [r["test_loss"] for r in read_metrics(path)] for name, path in runs.items()}
    assert len({tuple(v) for v in losses.values()}) == 1


@pytest.mark.distributed
def test_excess_storage_sends_fewer_bytes_than_no_excess(runs):
    """Issue 4: storage=2 logs fewer bytes per coded epoch than storage=1, same parameters."""
    excess, plain = runs["elmahdy-mohajer T=2"], runs["cycles"]
    coded = [r for r in read_metrics(excess) if r["phase"] == "coded"]
    base = [r for r in read_metrics(plain) if r["phase"] == "coded"]
    assert [r["epoch"] for r in coded] == [r["epoch"] for r in base] == [2, 3]
    for ours, theirs in zip(coded, base, strict=True):
        assert ours["storage"] == 2 and theirs["storage"] == 1
        assert ours["broadcast_bytes"] < theirs["broadcast_bytes"]
        assert ours["stored_points_max"] <= 2 * ours["points"] / ours["workers"]
    assert read_summary(excess)["final_params_sha256"] == read_summary(plain)["final_params_sha256"]


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


def test_the_epoch_line_says_what_was_turned_away_only_when_something_was():
    from coded_shuffle_train.metrics import progress_line

    row = {
        "epoch": 2,
        "phase": "coded",
        "scheme": "cycles",
        "transport": "multicast",
        "train_loss": 0.5,
        "test_loss": 0.4,
        "test_accuracy": 0.9,
        "broadcast_bytes": 2048,
        "uncoded_bytes": 4096,
        "saved_percent": 50.0,
        "master_egress_bytes": 2100,
        "delivery_seconds": 0.1,
        "verified": True,
    }
    assert "turned away" not in progress_line({**row, "foreign_datagrams": 0}, 3)
    line = progress_line({**row, "foreign_datagrams": 7, "refused_connections": 1}, 3)
    assert line.endswith("| turned away 7 datagrams, 1 connections")
