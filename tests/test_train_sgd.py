"""The job's SGD: local SGD's averaging, the DDP hook's gradient order, one start model
checked by digest, and the master's evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coded_shuffle.distributed.ddp import mean_in_model_order
from coded_shuffle.errors import UsageError
from coded_shuffle.tools.records import read_metrics
from coded_shuffle_train import data, shuffle_sgd
from tests.helpers import (
    JOB,
    compose,
    read_summary,
    run_job,
)


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
        out = run_job([*args, f"hydra.run.dir={run_dir}"], tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        rows, summary = read_metrics(run_dir), read_summary(run_dir)
        assert summary["average_every"] == 5 and summary["shuffle"] == "partial"
        assert summary["placement"] == "by_label"
        # skewed shards: a worker starts with 2 or 3 of the 10 classes; a partial reshuffle of
        # half of every batch mixes them (the distance falls), and covers more every epoch
        tv = [r["label_tv_max"] for r in rows]
        assert tv[0] > 0.6 and tv[-1] < tv[0] / 2, tv
        coverage = [r["coverage_min"] for r in rows]
        assert coverage[0] == 0.25 and coverage == sorted(coverage) and coverage[-1] > 0.25
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
    ddp.register_comm_hook((None, order), mean_in_model_order)
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
    before = [
        torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist(),
        torch.cat(
            [opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()]
        ).tolist(),
    ]
    shuffle_sgd.average_state(list(model.parameters()), opt, dist.group.WORLD, world)
    after = [
        torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist(),
        torch.cat(
            [opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()]
        ).tolist(),
    ]
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


def test_the_master_evaluates_the_test_split_transformed_once():
    """data=dataset with a transform that is not idempotent (``x / 255 - 0.5``): the master's
    evaluation reads the raw test inputs and transforms them once."""
    from coded_shuffle_train.shuffle_sgd.master import Master

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
