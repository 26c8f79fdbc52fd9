"""The elastic_gd job over real torch.distributed processes (P = 4 workers + master = 5).

The job runs through the training harness (``python -m coded_shuffle_train.launch job=elastic_gd``,
the ``coded-shuffle-train`` command: torch's elastic launcher, restarts from ``max_restarts``). One
run applies scheduled events to all four methods; another has a worker process SIGKILLed by this
test mid-run and must resume with the survivors' stored blocks."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from coded_shuffle.elastic import make_problem, make_settings, simulate
from coded_shuffle.tools.records import metrics_path, read_metrics, recorded_lines
from tests.helpers import train_command, warm_jobs

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parent.parent
BASE = ["job=elastic_gd", "workers=4", "job.elastic.recovery_threshold=2"]
BASE += ["dist.timeout_seconds=60"]
N, D = 360, 20  # coded_shuffle_train/conf/job/elastic_gd.yaml defaults


class Job:
    """The job forked from the tests' warm server; its output goes to a file (a full pipe
    would stall it)."""

    def __init__(self, args: list[str], run_dir: Path) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.log = run_dir.parent / f"{run_dir.name}.log"
        with open(self.log, "w") as out:
            self.proc = warm_jobs().popen(
                [*train_command(), *BASE, *args, f"hydra.run.dir={run_dir}"],
                ROOT,
                env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait(self, timeout: float) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return code, self.log.read_text()


def records(run_dir: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in read_metrics(run_dir):
        out.setdefault(r["method"], []).append(r)
    return out


def reference_losses(steps: int) -> list[float]:
    """Exact gradient descent on the same data (single process): the no-failure curve."""
    s = make_settings(4, 2, steps, methods=["nofailure"])
    with tempfile.TemporaryDirectory() as root:
        return [r["train_loss"] for r in simulate(make_problem(N, D, 4, seed=0), s, root)]


def stored_digests(run_dir: Path) -> dict[str, str]:
    stores = run_dir / "elastic" / "stores"
    return {
        p.parent.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(stores.glob("worker_*/coded.npy"))
    }


def test_job_events_all_methods_and_plot(tmp_path: Path) -> None:
    events = "job.elastic.events=[{step: 4, leave: [2]}, {step: 8, join: 1}]"
    code, log = Job([events, "job.steps=12"], tmp_path).wait(120)
    assert code == 0, log[-3000:]
    runs = records(tmp_path)
    assert set(runs) == {"coded", "nofailure", "ignore", "repartition", "distr_bgd"}
    coded = runs["coded"]
    assert [r["workers_available"] for r in coded] == [4] * 4 + [3] * 4 + [4] * 4
    assert max(r["grad_rel_error"] for r in coded) < 1e-9
    assert all(r["rows_used_max"] == N // r["workers_available"] for r in coded)
    assert coded[4]["events"] == ["leave 2"] and coded[4]["moved_bytes"] == 0
    assert coded[8]["moved_bytes"] == N // 2 * D * 8 + 64  # one coded block to the joiner
    clean = [r["train_loss"] for r in runs["nofailure"]]
    assert np.allclose([r["train_loss"] for r in coded], clean, rtol=1e-12)
    assert np.allclose(clean, reference_losses(12), rtol=1e-12)
    assert runs["repartition"][4]["moved_bytes"] >= (N // 4) * (D + 2) * 8
    assert max(r["grad_rel_error"] for r in runs["repartition"]) < 1e-9
    assert runs["ignore"][5]["grad_rel_error"] > 0.1
    status = json.loads((tmp_path / "elastic_status.json").read_text())
    assert status["status"] == "finished" and status["restarts"] == 0
    plot = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plot_elastic.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "elastic.png").stat().st_size > 10_000


def wait_for_lines(path: Path, count: int, job: Job, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        if job.proc.poll() is not None:
            raise AssertionError(f"job ended early: {job.log.read_text()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {count} lines")


def test_killed_worker_job_restarts_with_survivors_blocks(tmp_path: Path) -> None:
    steps = 30
    args = ["job.elastic.events=[]", f"job.steps={steps}", "job.elastic.methods=[coded]"]
    job = Job([*args, "job.elastic.step_delay=0.05"], tmp_path)
    try:
        wait_for_lines(metrics_path(tmp_path), 6, job, timeout=90)
        before = stored_digests(tmp_path)
        victim = int((tmp_path / "elastic" / "pids" / "rank_3").read_text())
        os.kill(victim, signal.SIGKILL)  # a pre-empted machine: no chance to clean up
        killed_at = recorded_lines(metrics_path(tmp_path))
    finally:
        code, log = job.wait(120)
    assert code == 0, log[-3000:]
    status = json.loads((tmp_path / "elastic_status.json").read_text())
    assert status == {**status, "status": "finished", "restarts": 1, "lost": [3]}
    coded = records(tmp_path)["coded"]
    assert [r["step"] for r in coded] == list(range(steps))  # resumed, nothing repeated
    lost = [r for r in coded if r["events"]]
    assert len(lost) == 1 and lost[0]["events"] == ["lost 3 (process died, job restarted)"]
    first = lost[0]["step"]
    assert 6 <= first < steps and abs(first - killed_at) <= 2  # it died mid-run
    assert [r["workers_available"] for r in coded] == [4] * first + [3] * (steps - first)
    assert all(r["restarts"] == (r["step"] >= first) for r in coded)
    assert all(r["rows_used_max"] == N // r["workers_available"] for r in coded)
    assert sum(r["moved_bytes"] for r in coded) == 0  # survivors reused their stored blocks
    assert stored_digests(tmp_path) == before
    assert max(r["grad_rel_error"] for r in coded) < 1e-9
    assert np.allclose([r["train_loss"] for r in coded], reference_losses(steps), rtol=1e-12)


def test_bad_config_is_one_line_without_traceback(tmp_path: Path) -> None:
    events = "job.elastic.events=[{step: 3, leave: [1, 2, 3]}]"
    code, log = Job([events], tmp_path).wait(60)
    assert code == 2
    lines = log.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in log
    assert "fewer than the recovery threshold L=2" in lines[0]
    assert not metrics_path(tmp_path).exists()


MATMUL = ["job=elastic_matmul", "job.problem.rows=240", "job.problem.cols=40", "job.steps=6"]


def test_matmul_job_is_exact_for_every_method_with_the_time_breakdown(tmp_path: Path) -> None:
    """``job=elastic_matmul`` (``A x``, Algorithm 1) over 5 processes: a departure then a join;
    every product of every method exact, coded moves nothing on the departure, and every
    record splits its step into compute, decode and communication."""
    events = "job.elastic.events=[{step: 2, leave: [3]}, {step: 4, join: 1}]"
    code, log = Job([*MATMUL, events], tmp_path).wait(120)
    assert code == 0, log[-3000:]
    runs = records(tmp_path)
    assert set(runs) == {"coded", "uncoded", "nonadaptive"}
    for method, rows in runs.items():
        assert [r["workers_available"] for r in rows] == [4, 4, 3, 3, 4, 4], method
        assert max(r["result_rel_error"] for r in rows) < 1e-12, method
        for r in rows:
            parts = r["compute_seconds"] + r["decode_seconds"] + r["comm_seconds"]
            assert parts == pytest.approx(r["step_seconds"], rel=1e-6, abs=1e-9) or (
                r["comm_seconds"] == 0 and parts >= r["step_seconds"]
            )
    coded = runs["coded"]
    assert [r["rows_used_max"] for r in coded] == [60, 60, 80, 80, 60, 60]  # L b / n
    assert coded[2]["moved_bytes"] == 0 and runs["uncoded"][2]["moved_bytes"] > 0
    assert all(r["rows_used_max"] == 120 for r in runs["nonadaptive"])  # b, whatever n is
    assert "median step" in log and "worst relative error" in log


def test_matmul_bad_sizes_are_one_line(tmp_path: Path) -> None:
    code, log = Job([*MATMUL, "job.problem.rows=7", "job.elastic.events=null"], tmp_path).wait(60)
    assert code == 2
    lines = log.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in log
    assert "job.problem.rows=7 does not split" in lines[0] and "need rows >= 8" in lines[0]


def test_fully_distributed_job_is_exact_without_a_master(tmp_path: Path) -> None:
    """``job.elastic.fully_distributed``: the workers all-gather, decode and all-reduce among
    themselves; rank 0 only records. Exact gradient before and after a departure, and the
    same losses as the master mode (the reference run)."""
    args = ["job.elastic.fully_distributed=true", "job.elastic.methods=[coded]", "job.steps=8"]
    code, log = Job([*args, "job.elastic.events=[{step: 3, leave: [2]}]"], tmp_path).wait(120)
    assert code == 0, log[-3000:]
    coded = records(tmp_path)["coded"]
    assert [r["workers_available"] for r in coded] == [4] * 3 + [3] * 5
    assert all(r["mode"] == "fully_distributed" for r in coded)
    assert max(r["grad_rel_error"] for r in coded) < 1e-9
    assert coded[3]["events"] == ["leave 2"] and coded[3]["moved_bytes"] == 0
    assert np.allclose([r["train_loss"] for r in coded], reference_losses(8), rtol=1e-12)
    assert all(r["comm_bytes"] > 0 and r["test_loss"] is not None for r in coded)
