"""The training harness's records and data sources, and the worker's own-store protocol
for every scheme, in process."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.distributed.delivery import Delivery
from coded_shuffle.distributed.epochs import EpochChain, placement_points, store_from_points
from coded_shuffle.math.assignment import batches
from coded_shuffle.math.schemes import get_scheme
from coded_shuffle_train import data
from tests.helpers import (
    compose,
)

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
