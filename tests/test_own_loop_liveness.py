"""Liveness in the library: an own loop on ``CodedShuffle`` whose worker is killed or stopped
mid-delivery, run as plain processes (no launcher that would notice for it), ends on every
rank within the timeout and a few seconds, each naming the lost rank and its address."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from coded_shuffle.tools.ranks import start_ranks

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.distributed, pytest.mark.slow]
LOST = r"rank 2 \(worker 1\) on \S+ at '[^']*' lost: no heartbeat for \d+ s"


def wait_all(procs: list[subprocess.Popen], skip: int, limit: float) -> list[tuple[int, str]]:
    """Every process but ``skip`` ends within ``limit`` seconds: (exit code, stderr)."""
    deadline = time.monotonic() + limit
    out = []
    try:
        for r, p in enumerate(procs):
            if r == skip:
                continue
            _, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            out.append((p.returncode, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


def fault_seen(proc: subprocess.Popen, limit: float = 120) -> float:
    """Waits until the faulty rank has killed or stopped itself; returns when (monotonic)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return time.monotonic()
        state = Path(f"/proc/{proc.pid}/stat").read_text().split()[2]
        if state == "T":
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError("the faulty rank never reached its fault")


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_worker_lost_mid_delivery_ends_every_rank_naming_it(fault):
    timeout = 4.0
    procs = start_ranks(
        ["tests/fault_loop.py", "--fault", fault, "--timeout", str(timeout)], 4, REPO
    )
    at = fault_seen(procs[2])
    results = wait_all(procs, skip=2, limit=timeout + 5 + 5)  # timeout, a few s, start-up slack
    ended = time.monotonic() - at
    assert ended < timeout + 5, ended
    for code, err in results:
        assert code == 1, err[-2000:]
        lines = [ln for ln in err.strip().splitlines() if "lost" in ln]
        assert len(lines) == 1 and re.search(LOST, lines[0]), err[-2000:]
