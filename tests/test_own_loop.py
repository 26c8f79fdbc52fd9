"""An own ``DistributedSampler``-style loop on ``CodedShuffle`` (``examples/own_loop.py``: one
``DataLoader`` over ``cs.dataset`` and ``cs.sampler`` for the whole run, the model in
``cs.ddp``) trains the training job's parameters bit for bit, with the data set read in the
training process or by loader workers kept across epochs, and with the master on any rank."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import JOB, read_summary, run_job

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.distributed]
POINTS, EPOCHS = 1200, 3


def own_loop(*args: str) -> str:
    """The example under torchrun (5 processes); the final parameters' SHA-256."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "5",
        str(REPO / "examples" / "own_loop.py"),
        "--epochs",
        str(EPOCHS),
        "--points",
        str(POINTS),
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    verified = [ln for ln in out.stdout.splitlines() if ln.startswith("epoch ")]
    assert len(verified) == EPOCHS and all(ln.endswith("verified True") for ln in verified)
    (digest,) = re.findall(r"final parameters sha256 ([0-9a-f]{64})", out.stdout)
    return digest


def test_an_own_dataloader_loop_trains_the_jobs_parameters(tmp_path):
    """The job on the example's data set (its ``make_dataset``, imported by Hydra), the same
    model, optimiser, minibatch and seed; the example with the loader in the training process,
    and with two persistent loader workers and the master on the last rank."""
    data = f"_target_:own_loop.make_dataset,points:{POINTS},features:16,classes:4"
    test = "_target_:own_loop.make_dataset,points:200,features:16,classes:4,seed:1"
    args = [
        *[a for a in JOB if not a.startswith(("epochs=", "seed=", "model"))],
        f"epochs={EPOCHS}",
        "seed=0",
        "data=dataset",
        f"++data.dataset={{{data}}}",
        f"++data.test_dataset={{{test}}}",
        "model=mlp",
        "model.hidden=32",
        f"hydra.run.dir={tmp_path}",
    ]
    out = run_job(args, tmp_path, env={"PYTHONPATH": str(REPO / "examples")})  # own_loop
    assert out.returncode == 0, out.stderr[-3000:]
    job = read_summary(tmp_path)["final_params_sha256"]
    assert own_loop() == job
    assert own_loop("--num-workers", "2", "--master-rank", "4") == job
