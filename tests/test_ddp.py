"""``cs.ddp`` (:func:`coded_shuffle.distributed.ddp.data_parallel`): every worker's gradients
after a step are the mean of the workers' own gradients, each computed here without DDP on the
worker's own minibatch."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.distributed as dist

from coded_shuffle.distributed.ddp import data_parallel
from tests.ranks import run_ranks


def one_step(rank: int, world: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """This rank's gradients through DDP and without it, on a minibatch of its own (as numpy:
    tensors do not cross the results' queue)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    plain = copy.deepcopy(model)
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(rank + 1))
    y = torch.arange(8) % 3
    torch.nn.functional.cross_entropy(plain(x), y).backward()
    own = [p.grad.numpy().copy() for p in plain.parameters()]
    ddp = data_parallel(model, dist.group.WORLD)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    return [p.grad.numpy().copy() for p in model.parameters()], own


@pytest.mark.distributed
def test_every_workers_gradients_are_the_mean_of_the_workers_own():
    results = run_ranks(3, one_step)
    owns = [own for _, own in results]
    mean = [np.mean(g, axis=0) for g in zip(*owns, strict=True)]
    for averaged, own in results:
        assert not all(np.array_equal(a, o) for a, o in zip(averaged, own, strict=True))
        for a, m in zip(averaged, mean, strict=True):
            np.testing.assert_allclose(a, m, rtol=1e-5, atol=1e-7)
