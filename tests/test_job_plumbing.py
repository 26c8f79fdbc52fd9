"""One owner for each piece of the job's plumbing: the workers' group and its timeouts are the
coded shuffle's, the watchdog is the job's (handed to the coded shuffle), and the restart
count is read in one place."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.helpers import REPO, compose
from tests.ranks import run_ranks


def _groups_the_job_makes(rank: int, world: int, run_dir: Path) -> list:
    """Runs the ``shuffle_sgd`` job's body on this rank (the process group already set up, as
    the launcher's entry does) and returns the ranks of every group created meanwhile."""
    import torch.distributed as dist

    import coded_shuffle_train.dist as job_dist
    from coded_shuffle.distributed.liveness import default_store_address
    from coded_shuffle_train.shuffle_sgd import JOB

    host, port = default_store_address()  # the watchdog reaches the job's store there
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = host, str(port)
    made, real = [], dist.new_group

    def counting(ranks=None, *args, **kwargs):
        made.append(list(ranks) if ranks is not None else None)
        return real(ranks, *args, **kwargs)

    dist.new_group = counting
    try:
        overrides = [f"workers={world - 1}", "epochs=2", "model.hidden=8"]
        cfg = compose(*overrides, "job.checkpoint=false", "dist.timeout_seconds=30")
        job_dist.setup(cfg, run_dir)
        JOB.run(cfg)
    finally:
        dist.new_group = real
        job_dist.stop_liveness()
    return made


@pytest.mark.distributed
def test_the_job_makes_no_group_beside_the_coded_shuffles_groups(tmp_path):
    """On the CPU every rank creates exactly two groups while the job runs, both the coded
    shuffle's: the workers' group (ranks 1..K), which the job's DDP and all-reduces use too,
    and the delivery's own, of every rank (a prefetched delivery's collectives never meet the
    loop's); on CUDA the model's group of the workers joins them
    (coded_shuffle_train.device.model_group)."""
    made = run_ranks(3, _groups_the_job_makes, tmp_path)
    assert made == [[[1, 2], [0, 1, 2]]] * 3


def test_one_home_for_the_watched_wait_the_restart_count_and_torchs_private_setter():
    """The 7-day wait of a watched collective, the launcher's restart count and torch's private
    timeout setter each appear in one place of the library and the jobs."""
    sources = {
        path: path.read_text()
        for folder in ("coded_shuffle", "coded_shuffle_train")
        for path in sorted((REPO / folder).rglob("*.py"))
    }

    def homes(pattern: str) -> list[str]:
        return [str(p.relative_to(REPO)) for p, text in sources.items() if re.search(pattern, text)]

    assert homes(r"timedelta\(days=") == ["coded_shuffle/distributed/liveness.py"]
    assert homes(r"TORCHELASTIC_RESTART_COUNT") == ["coded_shuffle/distributed/launcher_env.py"]
    assert homes(r"_set_pg_timeout") == ["coded_shuffle/distributed/liveness.py"]


def test_an_epochs_record_is_its_parts_keys_in_order_the_workers_wait_in_the_deliverys_place():
    """``EpochRecord`` (shuffle_sgd/record.py): the delivery's keys first (a saved report of an
    epoch resumed inside is a plain dict), then the attempt, the mixing, the restart's and
    the training's keys, the clocks; the slowest worker's ``wait_seconds`` replaces the
    master's in its place, and ``prefetched`` stays the delivery's."""
    from coded_shuffle_train.shuffle_sgd.record import EpochRecord, Trained

    delivery = {"epoch": 3, "broadcast_bytes": 10, "wait_seconds": 0.5, "prefetched": True}
    trained = Trained(
        train_seconds=2.0,
        wait_seconds=0.25,
        test_loss=1.0,
        test_accuracy=0.5,
        train_loss=1.5,
        param_bytes=16,
        allreduce_payload_bytes=32,
    )
    record = EpochRecord(
        delivery=delivery,
        attempt=1,
        mixing={"coverage_min": 0.75},
        restart={"resumed_at_step": 4},
        trained=trained,
        epoch_seconds=3.0,
        elapsed_seconds=9.0,
        time=1.0,
    )
    assert list(record)[:6] == [*delivery, "attempt", "coverage_min"]
    assert record["wait_seconds"] == 0.25 and record["prefetched"] is True
    assert list(record)[6:] == [
        "resumed_at_step",
        "train_seconds",
        "test_loss",
        "test_accuracy",
        "train_loss",
        "param_bytes",
        "allreduce_payload_bytes",
        "epoch_seconds",
        "elapsed_seconds",
        "time",
    ]
