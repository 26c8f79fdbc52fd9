"""Liveness separate from work: the watchdog's verdicts on synthetic heartbeat records, and
real jobs whose epochs outlast ``dist.timeout_seconds`` (healthy) or whose worker hangs."""

from __future__ import annotations

import re
import time

import pytest

from coded_shuffle.distributed.liveness import Heartbeat as Record
from coded_shuffle.distributed.liveness import Liveness
from coded_shuffle.tools.records import read_metrics
from tests.helpers import JOB, run_job


def watchdog(world: int = 3, deadline: float = 5.0) -> Liveness:
    live = Liveness(0, world, deadline, 1.0, ("127.0.0.1", 1), "test")
    live.t0 = 0.0
    return live


def see(live: Liveness, rank: int, now: float, beat: int, stage: tuple[int, str], ticks: int):
    """What the watchdog's reader does with a record read at time ``now``."""
    record = Record(beat, stage[0], stage[1], ticks, "", f"10.0.0.{rank + 1}")
    live.observe(rank, record, now)


def test_a_stage_change_is_published_when_it_happens_not_at_the_next_beat():
    """A rank lost right after a stage change is named where it was: the record in the store
    says the new stage long before the next heartbeat (here 30 s away)."""
    import torch.distributed as dist

    from coded_shuffle.tools.ranks import free_port

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    live = Liveness(1, 2, 120.0, 30.0, ("127.0.0.1", port), "stage").start()
    try:
        store = dist.PrefixStore("stage", server)
        deadline = time.monotonic() + 10
        while not store.check(["hb/1"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert Record.unpack(store.get("hb/1")).stage == "start"
        live.mark("epoch 2 delivered")
        while time.monotonic() < deadline:
            if Record.unpack(store.get("hb/1")).stage == "epoch 2 delivered":
                break
            time.sleep(0.02)
        assert Record.unpack(store.get("hb/1")).stage == "epoch 2 delivered"
    finally:
        live.stop()


def test_a_rank_whose_heartbeat_stops_is_lost_after_the_deadline():
    live = watchdog()
    for r in range(3):
        see(live, r, 1.0, 1, (2, "epoch 1 delivered"), 5)
    assert live.verdict(5.9) == ""
    see(live, 0, 6.0, 2, (2, "epoch 1 delivered"), 5)
    see(live, 1, 6.0, 2, (2, "epoch 1 delivered"), 5)  # rank 2 stops beating at t = 1
    assert live.verdict(6.0) == ""
    verdict = live.verdict(6.5)
    assert verdict.startswith("rank 2 (worker 1) on 10.0.0.3 at 'epoch 1 delivered' lost: ")
    assert "no heartbeat for 6 s" in verdict


def test_without_the_store_only_a_heartbeat_that_stopped_before_is_lost():
    """The store went away at t = 6 (with the master, say): rank 2, silent since t = 1, is
    lost; rank 1, silent only since the store went, is not blamed (nor is anyone hung)."""
    live = watchdog()
    for r in range(3):
        see(live, r, 1.0, 1, (2, "epoch 1 delivered"), 5)
    see(live, 0, 6.0, 2, (2, "epoch 1 delivered"), 5)
    see(live, 1, 6.0, 2, (2, "epoch 1 delivered"), 5)
    assert live.verdict(6.5, before=4.0).startswith("rank 2 (worker 1) on 10.0.0.3")
    see(live, 2, 6.0, 2, (2, "epoch 1 delivered"), 5)  # had rank 2 beaten until t = 6 too
    assert live.verdict(60.0, before=4.0) == ""  # every silence began with the store's
    assert "lost" in live.verdict(60.0)  # (with the store, a minute of silence is a loss)


def test_a_rank_that_never_starts_is_lost_after_the_deadline():
    live = watchdog()
    see(live, 0, 1.0, 1, (0, "start"), 0)
    see(live, 1, 1.0, 1, (0, "start"), 0)
    assert live.verdict(4.0) == ""
    assert "rank 2 (worker 1) (never started) lost" in live.verdict(5.5)


def test_a_busy_rank_is_never_hung_however_long_it_works():
    """Workers training for an hour: behind the master's stage, but ticking every step."""
    live = watchdog()
    for t in range(0, 3600, 2):
        see(live, 0, t, t, (3, "epoch 2 start"), 1)  # waits for the workers' parameters
        see(live, 1, t, t, (2, "epoch 1 delivered"), t)  # trains: a tick per minibatch step
        see(live, 2, t, t, (2, "epoch 1 delivered"), t)
        assert live.verdict(t + 1.0) == ""


def test_a_live_rank_that_stops_progressing_behind_the_others_is_hung():
    live = watchdog()
    for t in range(0, 20, 2):
        see(live, 0, t, t, (4, "epoch 2 start"), 10)
        see(live, 1, t, t, (4, "epoch 2 start"), 10)
        see(live, 2, t, t, (3, "epoch 1 trained"), 7)  # beats, but its work stands still
        live.update_behind(t)
    verdict = live.verdict(20.0)
    assert verdict == (
        "rank 2 (worker 1) on 10.0.0.3 hung: no progress for 20 s at 'epoch 1 trained' "
        "(others reached 'epoch 2 start')"
    )
    assert live.stalled() == (
        "stalled: rank 2 (worker 1) at 'epoch 1 trained' (others reached up to 'epoch 2 start')"
    )


def test_a_rank_that_waited_long_is_not_hung_when_the_others_move_on():
    """The master waits two minutes for the parameters; the workers finish, move on and wait
    for its next epoch: it is behind from then on, and gets the full deadline from then."""
    live = watchdog()
    for t in range(0, 120, 2):
        see(live, 0, t, t, (2, "epoch 1 delivered"), 9)  # waiting: no progress of its own
        for r in (1, 2):
            see(live, r, t, t, (2, "epoch 1 delivered"), t)
        live.update_behind(t)
        assert live.verdict(t + 1.0) == ""
    for t in range(120, 124, 2):
        see(live, 0, t, t, (2, "epoch 1 delivered"), 9)
        for r in (1, 2):
            see(live, r, t, t, (4, "epoch 2 start"), 200)
        live.update_behind(t)
        assert live.verdict(t + 1.0) == ""
    assert "rank 0 (master) on 10.0.0.1 hung: no progress for 6 s" in live.verdict(126.0)


def test_ranks_waiting_together_are_not_hung():
    """Every rank at the same stage (all waiting on a collective): nobody is behind."""
    live = watchdog()
    for t in range(0, 30, 2):
        for r in range(3):
            see(live, r, t, t, (5, "epoch 2 delivered"), 3)
    assert live.verdict(30.0) == ""


# --- real jobs ----------------------------------------------------------------------------


@pytest.mark.distributed
def test_an_epoch_longer_than_the_timeout_is_healthy_and_shows_progress(tmp_path):
    """dist.timeout_seconds=2, yet the epoch trains for about 3 s (23 steps of 0.13 s): the
    job completes, and the master's console shows the workers' progress while it waits."""
    args = [*JOB, "scheme=uncoded", "epochs=1", "debug.step_delay=0.13", "dist.timeout_seconds=2"]
    args += ["dist.progress_seconds=1", f"hydra.run.dir={tmp_path}"]
    out = run_job(args, tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(tmp_path)
    assert [r["epoch"] for r in rows] == [1] and all(r["verified"] for r in rows)
    assert min(r["train_seconds"] for r in rows) > 2  # longer than the timeout
    console = out.stdout + out.stderr
    assert re.search(
        r"\.\.\. \d+ s after 'epoch \d \w+': the slowest worker at epoch \d step", console
    )


@pytest.mark.distributed
def test_a_hung_worker_is_named_within_the_deadline(tmp_path):
    args = ["scheme=uncoded", *JOB, "debug.die_rank=3", "debug.die_mode=hang"]
    t0 = time.perf_counter()
    out = run_job([*args, "dist.timeout_seconds=3", f"hydra.run.dir={tmp_path}"], tmp_path)
    elapsed = time.perf_counter() - t0
    assert out.returncode == 1 and elapsed < 60
    last = out.stderr.strip().splitlines()[-1]
    assert re.search(
        r"rank 3 \(worker 2\) on \S+ hung: no progress for \d+ s at 'epoch 1 trained'", last
    ), out.stderr
