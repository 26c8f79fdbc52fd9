"""Prefetch: epoch ``e + 1``'s delivery runs in the background while the loop trains on epoch
``e``, for every kind of delivery (a scheme the master sends, excess storage, the workers'
own, partial shuffles, files or memory); the batch handed out stays unchanged until the next is
asked for; ``cs.dataset`` serves each epoch's batch to a ``DataLoader`` built once, with loader
workers forked or spawned; and a background delivery that fails while the loop waits in a
collective ends the process with one line."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from coded_shuffle.tools.ranks import start_ranks
from tests.ranks import run_ranks

pytestmark = [pytest.mark.distributed]
POINTS, FEATURES, EPOCHS = 240, 6, 4


def data_set() -> TensorDataset:
    gen = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(POINTS, FEATURES, generator=gen), torch.arange(POINTS) % 5)


def shuffle(rank: int, **options):
    from coded_shuffle import CodedShuffle

    data = data_set() if rank == options.get("master_rank", 0) else None
    return CodedShuffle(data, seed=5, epochs=EPOCHS, heartbeat=0, **options)


def epochs_behind_a_loop(rank: int, world: int, options: dict) -> list:
    """Every epoch handed out, then the loop "trains" until the next epoch's delivery is done
    in the background; the batch it holds must not change meanwhile. Returns per epoch:
    whether it was prefetched, and (a worker) its indices and the SHA-256 of its items."""
    cs = shuffle(rank, **options)
    out = []
    for epoch in range(1, EPOCHS + 1):
        batch = cs.epoch(epoch)
        held = None if batch is None else batch.rows.clone()
        deadline = time.monotonic() + 60
        while not cs.ready and time.monotonic() < deadline:  # the loop's steps
            time.sleep(0.005)
        assert cs.ready
        if batch is None:
            out.append((cs.report["prefetched"], None, None))
            continue
        assert torch.equal(batch.rows, held), f"epoch {epoch}'s batch changed under the loop"
        x, y = batch.tensors
        digest = hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()
        out.append((cs.report["prefetched"], batch.indices.copy(), digest))
    cs.close()
    return out


def expected_digest(indices: np.ndarray) -> str:
    x, y = data_set().tensors
    return hashlib.sha256(x[indices].numpy().tobytes() + y[indices].numpy().tobytes()).hexdigest()


@pytest.mark.parametrize(
    "options",
    [
        {"scheme": "cycles", "transport": "chain"},
        {"scheme": "elmahdy-mohajer", "storage": 2.0, "transport": "tree", "store": True},
        {"scheme": "decentralized", "storage": 2.0, "transport": "peer-unicast", "store": True},
        {"scheme": "uncoded", "transport": "p2p", "shuffle": "partial", "fraction": 0.5},
        {"scheme": "cycles", "transport": "chain", "master_rank": 2, "store": True},
    ],
    ids=["cycles", "excess-files", "decentralized", "partial-p2p", "master-rank-2"],
)
def test_the_next_epoch_arrives_behind_the_loop_and_the_batch_in_hand_stays(options, tmp_path):
    options = dict(options)
    if options.pop("store", False):
        options["store_dir"] = tmp_path
    got = run_ranks(4, epochs_behind_a_loop, options)
    master = options.get("master_rank", 0)
    for rank, epochs in enumerate(got):
        assert [p for p, _, _ in epochs] == [False] + [True] * (EPOCHS - 1)  # the placement
        if rank == master:
            continue
        for _, indices, digest in epochs:  # exactly the master's items, every epoch
            assert digest == expected_digest(indices)


def loader_epochs(rank: int, world: int, options: dict, loader_options: dict) -> list:
    """A ``DataLoader`` built once over ``cs.dataset`` and ``cs.sampler`` (loader workers
    kept across epochs); per epoch the SHA-256 of the minibatches it yields, and the items the
    job's order says they are (from the batch in hand)."""
    cs = shuffle(rank, **options)
    loader = DataLoader(cs.dataset, batch_size=16, sampler=cs.sampler, **loader_options)
    out = []
    for epoch in range(1, EPOCHS + 1):
        cs.set_epoch(epoch)
        seen = hashlib.sha256()
        for x, y in loader:
            seen.update(x.numpy().tobytes() + y.numpy().tobytes())
        if cs.worker is None:
            assert len(cs.dataset) == 0 and len(cs.sampler) == 0
            out.append(None)
            continue
        x, y = cs.dataset.layout.unpack(cs.dataset.rows(), torch.from_numpy(cs.order()))
        want = hashlib.sha256()
        for a in range(0, x.shape[0], 16):
            want.update(x[a : a + 16].numpy().tobytes() + y[a : a + 16].numpy().tobytes())
        assert seen.hexdigest() == want.hexdigest(), f"epoch {epoch}"
        held = cs.dataset.layout.unpack(cs.dataset.rows())[0]  # the batch, in its own order
        out.append((cs.indices.copy(), hashlib.sha256(held.numpy().tobytes()).hexdigest()))
    cs.close()
    return out


@pytest.mark.parametrize(
    "store, loader_options",
    [
        (False, {"num_workers": 0}),
        (False, {"num_workers": 2, "persistent_workers": True, "pin_memory": True}),
        (True, {"num_workers": 2, "persistent_workers": True}),
        (False, {"num_workers": 1, "persistent_workers": True, "multiprocessing_context": "spawn"}),
    ],
    ids=["in-process", "forked-memory", "forked-files", "spawned"],
)
def test_one_dataloader_serves_every_epochs_batch(store, loader_options, tmp_path):
    options = {"scheme": "cycles", "transport": "chain"} | (
        {"store_dir": tmp_path} if store else {}
    )
    got = run_ranks(4, loader_epochs, options, loader_options)
    x = data_set().tensors[0]
    for epochs in got[1:]:
        for indices, digest in epochs:  # the batch the loader read: the master's items
            assert digest == hashlib.sha256(x[indices].numpy().tobytes()).hexdigest()


def test_a_dataset_read_before_any_epoch_says_so_in_one_line():
    def early(rank: int, world: int) -> str:
        cs = shuffle(rank, scheme="cycles")
        try:
            cs.dataset[0]
        except Exception as exc:  # the one line a user sees
            return f"{type(exc).__name__}: {exc}"
        finally:
            cs.close()
        return "no error"

    for line in run_ranks(3, early):
        assert line.startswith("UsageError: cs.dataset has no batch yet: call cs.set_epoch"), line


REPO = Path(__file__).resolve().parent.parent


def test_a_background_delivery_that_fails_while_the_loop_waits_ends_it_in_one_line():
    """The master corrupts epoch 3's symbols; its loop waits meanwhile in a point-to-point
        receive that only comes after a long "training": the master ends within seconds with the
        verification's one line, and every worker's watchdog ends it within the timeout (the master,
    or its store, lost)."""
    timeout = 2.5
    t0 = time.monotonic()
    procs = start_ranks(["tests/prefetch_loop.py", "--timeout", str(timeout)], 4, REPO)
    outs = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=60)
            outs.append((p.returncode, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    elapsed = time.monotonic() - t0
    assert elapsed < 30, elapsed  # the "training" lasts 60 s: nobody waited for it
    code, err = outs[0]
    assert code == 1
    lines = [line for line in err.strip().splitlines() if not line.startswith("debug:")]
    assert lines[-1].startswith("rank 0 (master): epoch 3: worker "), err
    assert "decoded a batch with SHA-256" in lines[-1] and "Traceback" not in err
    for code, err in outs[1:]:  # the master hosted the job's store: gone with it
        assert code != 0
        verdict = r"rank \d \(worker \d\): (lost contact with the job|rank 0 \(master\).* lost)"
        assert re.search(verdict, err), err
