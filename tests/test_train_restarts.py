"""A job that fails and goes on: a dead worker named, the same command resuming after an
epoch or inside one, with another number of workers, and a wrong decode failing loudly."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from coded_shuffle.errors import UsageError
from coded_shuffle.tools.records import read_metrics
from coded_shuffle_train import checkpoint
from coded_shuffle_train.metrics import RESIZE_KEYS
from tests.helpers import (
    JOB,
    compose,
    read_summary,
    run_job,
)


def after_epoch(epoch: int) -> checkpoint.Checkpoint:
    """A master's checkpoint of a run of 4 workers after ``epoch``, placed in epoch 1."""
    shuffle = {"epoch": epoch, "first_epoch": 1, "workers": 4}
    return checkpoint.Checkpoint(shuffle, torch.zeros(3), torch.zeros(0), [])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("scheme=uncoded", "scheme"),
        ("storage=2", "storage"),
        ("shuffle=partial", "shuffle"),
        ("seed=4", "seed"),
        ("data.placement=by_label", "data"),
        ("model.hidden=32", "model"),
        ("optim.lr=0.5", "optim"),
    ],
)
def test_resuming_with_another_key_that_decides_the_run_names_it(tmp_path, override, key):
    """Every key of the run's identity (what decides the batches, the model and the
    optimiser) refused at load, in one line naming it."""
    checkpoint.save(tmp_path, compose("scheme=cycles", *JOB), after_epoch(2))
    with pytest.raises(UsageError, match=rf"another run \(it differs in {key}\)"):
        checkpoint.load(tmp_path, compose("scheme=cycles", *JOB, override))


@pytest.mark.distributed
def test_a_dead_worker_fails_the_job_naming_its_rank_and_the_same_command_resumes(runs, tmp_path):
    """The job fails in one line naming the rank; the same command again (same run
    directory) resumes after the last epoch, re-places the one damaged store only, and ends
    with the unbroken run's parameters."""
    t0 = time.perf_counter()
    args = ["scheme=uncoded", *JOB, "debug.die_rank=2", "debug.die_epoch=2"]
    out = run_job([*args, "dist.timeout_seconds=20", f"hydra.run.dir={tmp_path}"], tmp_path)
    elapsed = time.perf_counter() - t0
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("coded-shuffle-train: error: rank 2 (worker 1) failed"), out.stderr
    assert "Traceback" not in out.stderr
    assert elapsed < 60
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1]  # epoch 1 finished, then the death
    store = tmp_path / "stores" / "worker-2" / "e1-part0.npy"
    store.write_bytes(store.read_bytes()[:-1] + bytes([store.read_bytes()[-1] ^ 1]))
    again = run_job([*args, "debug.die_rank=null", f"hydra.run.dir={tmp_path}"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed after epoch 1 (attempt 0)" in again.stderr + again.stdout
    rows = read_metrics(tmp_path)
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert rows[1]["resumed_after_epoch"] == 1 and rows[1]["replaced_workers"] == [2]
    assert 0 < rows[1]["replacement_bytes"] < rows[0]["broadcast_bytes"]  # one worker's batch
    summary = read_summary(tmp_path)
    assert summary["final_params_sha256"] == read_summary(runs["uncoded"])["final_params_sha256"]
    assert summary["restarts"] == 1 and summary["all_verified"] is True


def test_the_checkpoint_of_another_run_is_refused_in_one_line(tmp_path):
    cfg = compose("scheme=cycles", *JOB)
    checkpoint.save(tmp_path, cfg, after_epoch(2))
    loaded = checkpoint.load(tmp_path, cfg)
    assert loaded is not None and (loaded.epoch, loaded.workers, loaded.first_epoch) == (2, 4, 1)
    assert torch.equal(loaded.params, torch.zeros(3)) and loaded.mixing_seen is None
    with pytest.raises(UsageError, match="is the checkpoint of another run"):
        checkpoint.load(tmp_path, compose("scheme=cycles", *JOB, "seed=4"))
    with pytest.raises(UsageError, match="holds epoch 2, beyond epochs=1"):
        checkpoint.load(tmp_path, compose("scheme=cycles", *JOB, "epochs=1"))
    transport = compose("scheme=cycles", *JOB, "dist.transport=tree")  # bit-identical: fine
    assert checkpoint.load(tmp_path, transport).epoch == 2
    older = torch.load(tmp_path / checkpoint.FILE, weights_only=False)  # an earlier version's
    torch.save({k: v for k, v in older.items() if k != "shuffle"}, tmp_path / checkpoint.FILE)
    with pytest.raises(
        UsageError, match=r"checkpoint\.pt lacks shuffle \(written by another version\)"
    ):
        checkpoint.load(tmp_path, cfg)


def test_a_workers_step_checkpoints_come_back_typed_and_another_versions_are_ignored(tmp_path):
    """``save_step``/``load_steps``: the last two of a worker's :class:`StepCheckpoint`s, by
    (epoch, step), as saved; a step file that lacks a part (another version's) is none."""
    cfg = compose("scheme=cycles", *JOB)
    for step in (3, 6):
        state = checkpoint.StepCheckpoint(2, step, torch.ones(3) * step, {"state": {}}, 1.5, 9)
        checkpoint.save_step(tmp_path, cfg, 1, state)
    held = checkpoint.load_steps(tmp_path, cfg, 1)
    assert sorted(held) == [(2, 3), (2, 6)] and held[(2, 6)].count == 9
    assert torch.equal(held[(2, 6)].params, torch.full((3,), 6.0))
    last, _ = checkpoint.step_files(tmp_path, 1)
    older = torch.load(last, weights_only=False)
    torch.save({k: v for k, v in older.items() if k != "loss_sum"}, last)
    assert sorted(checkpoint.load_steps(tmp_path, cfg, 1)) == [(2, 3)]


@pytest.mark.distributed
def test_a_restarted_job_resumes_with_every_store_and_the_same_parameters(runs, tmp_path):
    """``dist.max_restarts=1``: the launcher restarts every process after a worker died in
    epoch 3; the job resumes after epoch 2 with every store intact (nothing re-placed)."""
    args = ["scheme=cycles", *JOB, "debug.die_rank=3", "debug.die_epoch=3"]
    out = run_job([*args, "dist.max_restarts=1", f"hydra.run.dir={tmp_path}"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(tmp_path)
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert rows[2]["resumed_after_epoch"] == 2 and rows[2]["attempt"] == 1
    assert rows[2]["replaced_workers"] == [] and rows[2]["replacement_bytes"] == 0
    # the restarted attempt's clock continues the first's, the restart's own seconds included
    gap = rows[2]["elapsed_seconds"] - rows[1]["elapsed_seconds"]
    assert abs(gap - (rows[2]["time"] - rows[1]["time"])) < 0.5, rows
    assert gap > rows[2]["epoch_seconds"]
    summary = read_summary(tmp_path)
    assert summary["final_params_sha256"] == read_summary(runs["cycles"])["final_params_sha256"]


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
    args = [
        f"scheme={scheme}",
        f"dist.transport={transport}",
        *JOB,
        "job.checkpoint_steps=4",
        "debug.die_rank=2",
        "debug.die_epoch=2",
        "debug.die_step=7",
        f"hydra.run.dir={tmp_path}",
    ]
    if damage:
        assert run_job(args, tmp_path).returncode == 1
        kept = tmp_path / "stores" / "worker-0" / "batch-e2.npy"
        kept.write_bytes(kept.read_bytes()[:-1] + bytes([kept.read_bytes()[-1] ^ 1]))
        out = run_job([*args, "debug.die_rank=null"], tmp_path)
    else:
        out = run_job([*args, "dist.max_restarts=1"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed inside epoch 2 at step 4 of 23" in out.stderr + out.stdout
    reference = runs[scheme if transport == "chain" else f"{scheme}/{transport}"]
    rows, unbroken = read_metrics(tmp_path), read_metrics(reference)
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    second = rows[1]
    assert second["resumed_at_step"] == 4 and second["resumed_inside_epoch"] == 2
    assert second["attempt"] == (0 if damage else 1) and second["replaced_workers"] == []
    assert second["rebatched_workers"] == ([0] if damage else [])
    assert (second["rebatch_bytes"] > 0) == damage
    assert second["rebatch_bytes"] < rows[0]["broadcast_bytes"] / 3  # one worker's batch
    assert second["broadcast_bytes"] == unbroken[1]["broadcast_bytes"]  # the first delivery
    assert second["verified"] and "resumed_at_step" not in rows[2]
    summary = read_summary(tmp_path)
    assert summary["final_params_sha256"] == read_summary(reference)["final_params_sha256"]
    assert summary["restarts"] == 1 and summary["all_verified"] is True


def expected_reuse(before: int, after: int, at: int, points: dict[int, int], seed: int) -> int:
    """The points a placement for ``after`` workers at epoch ``at`` finds in the stores that
    ``before`` workers held after epoch ``at - 1`` (``cycles``, ``T = 1``, full reshuffles:
    a store is the epoch's batch), worker by worker; ``points``: ``N`` by number of workers
    (the data set is trimmed to a multiple of it)."""
    from coded_shuffle.distributed.epochs import assignment

    old = assignment(seed, at - 1, points[before], before)
    new = assignment(seed, at, points[after], after)
    return sum(
        np.intersect1d(np.flatnonzero(old == k), np.flatnonzero(new == k)).size
        for k in range(min(before, after))
    )


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
    assert run_job([f"workers={before}", *args, *die], tmp_path).returncode == 1
    again = epochs > at  # dies again at the next epoch's start, then resumes after it
    twice = [die[0], f"debug.die_epoch={at + 1}"] if again else []
    out = run_job([f"workers={after}", *args, *twice], tmp_path)
    assert out.returncode == (1 if again else 0), out.stderr[-3000:]
    assert f"with {after} workers instead of {before}" in out.stderr + out.stdout
    if again:
        out = run_job([f"workers={after}", *args], tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"resumed after epoch {at} (attempt 0): stores of {after} of {after}" in out.stderr
    rows = read_metrics(run)
    assert [(r["epoch"], r["workers"]) for r in rows] == [
        (e, before if e < at else after) for e in range(1, epochs + 1)
    ]
    resized = rows[at - 1]
    assert resized["phase"] == "placement" and resized["verified"]
    assert (resized["workers_before"], resized["workers_after"]) == (before, after)
    assert resized["resize_bytes"] == resized["broadcast_bytes"] > 0
    assert resized["resize_bytes"] < resized["fresh_placement_bytes"] == resized["uncoded_bytes"]
    assert resized["resumed_after_epoch"] == at - 1
    # which points were reused: exactly those each remaining worker held after epoch at - 1
    # (a worker reading the store of another epoch reuses others: the 3 -> 4 and 4 -> 3 cases)
    points = {before: rows[0]["points"], after: resized["points"]}
    reused = expected_reuse(before, after, at, points, seed=3)
    assert resized["reused_points"] == reused > 0
    summary = read_summary(run)
    assert summary["all_verified"] and summary["workers"] == after
    assert summary["resizes"] == [{k: resized[k] for k in RESIZE_KEYS}]
    if before > after:  # the same command once the run ended: nothing to do, nothing resized
        done = run_job([f"workers={before}", *args], tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"the run is complete: its checkpoint holds epoch {epochs}" in done.stderr
        assert read_metrics(run) == rows
    if not again:  # the accuracy against an unbroken run's: once (4 -> 3), for time
        return
    unbroken = tmp_path / "unbroken"
    done = run_job([f"workers={after}", *args[:-1], f"hydra.run.dir={unbroken}"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = read_summary(unbroken)
    assert abs(summary["final_test_accuracy"] - reference["final_test_accuracy"]) <= 0.01


@pytest.mark.distributed
def test_a_corrupt_point_in_the_placement_is_caught_and_a_restart_repairs_it(runs, tmp_path):
    """``debug.corrupt_epoch=1``: a byte of the first point of every placed stream is flipped
    (its message digest still matches); the workers' batch digests differ from the master's,
    so the first attempt records no epoch (without a restart the job fails in one line, as
    for a coded epoch: :func:`test_a_wrong_decode_fails_loudly`); the restart places them
    whole and ends with the unbroken run's parameters, every epoch verified."""
    args = ["scheme=uncoded", *JOB, "debug.corrupt_epoch=1", "dist.max_restarts=1"]
    out = run_job([*args, f"hydra.run.dir={tmp_path}"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "flipped byte 0 of row 0" in (tmp_path / "train.log").read_text()
    rows = read_metrics(tmp_path)
    assert [r["attempt"] for r in rows] == [1, 1, 1]  # the first attempt failed in epoch 1
    summary = read_summary(tmp_path)
    assert summary["all_verified"] is True
    assert summary["final_params_sha256"] == read_summary(runs["uncoded"])["final_params_sha256"]


@pytest.mark.distributed
def test_a_wrong_decode_fails_loudly(tmp_path):
    """The master corrupts one symbol (its message digest still matches what it sends), so
    the worker decodes a wrong batch; the master compares the batch digests and fails."""
    args = ["scheme=uncoded", *JOB, "debug.corrupt_epoch=2", f"hydra.run.dir={tmp_path}"]
    out = run_job(args, tmp_path)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert "failed: VerificationError: epoch 2: worker" in last, out.stderr
    assert "the master's is" in last
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1]
