"""The library API: records of any fixed item structure, and ``CodedShuffle`` in real gloo groups
(1 master + 3 workers), called as a user's script calls it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset, TensorDataset

from coded_shuffle import ShuffleSettings
from coded_shuffle.codec import buffers
from coded_shuffle.codec.records import ColumnDataset, RecordLayout, item_labels
from coded_shuffle.costs.wire import REACH_DTYPE
from coded_shuffle.distributed.transports.framing import HEADER_BYTES
from coded_shuffle.errors import UsageError
from tests.helpers import mapped_file
from tests.ranks import is_root, private_netns, run_ranks

# every dtype a record can hold: two of the same size (float16, bfloat16) must not be confused
DTYPES = [
    torch.float32,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def raw_bytes(t: torch.Tensor) -> bytes:
    """A tensor's bytes (numpy has no bfloat16 or float8: read them as uint8)."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def random_tensor(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype):
    raw = torch.randint(0, 256, (int(np.prod(shape)) * dtype.itemsize,), generator=gen)
    if dtype == torch.bool:
        return raw.to(torch.uint8).remainder(2).bool().reshape(shape)
    return raw.to(torch.uint8).view(dtype).reshape(shape)  # any bit pattern, NaNs included


class Items(Dataset):
    """A map-style data set without columns: read item by item."""

    def __init__(self, columns, single=False):
        self.columns, self.single = columns, single

    def __len__(self):
        return self.columns[0].shape[0]

    def __getitem__(self, i):
        if self.single:
            return self.columns[0][i]
        return tuple(c[i] for c in self.columns)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 12),
    fields=st.lists(
        st.tuples(st.lists(st.integers(0, 3), max_size=3), st.sampled_from(DTYPES)),
        min_size=1,
        max_size=4,
    ),
    columns=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_records_round_trip_byte_identical(n, fields, columns, seed):
    gen = torch.Generator().manual_seed(seed)
    cols = [random_tensor(gen, (n, *shape), dtype) for shape, dtype in fields]
    single = len(cols) == 1 and not columns
    ds = TensorDataset(*cols) if columns else Items(cols, single)
    layout = RecordLayout.from_json(RecordLayout.of(ds).to_json())
    assert layout.single == single
    rows = layout.pack(ds, n).rows(0, n)
    assert rows.dtype == torch.uint8 and rows.shape == (n, layout.record_bytes)
    for got, want in zip(layout.unpack(rows), cols, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert raw_bytes(got) == raw_bytes(want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("columns", [True, False])
def test_every_dtype_round_trips_through_its_layout(dtype, columns):
    """Each dtype alone and beside a float16 field of the same width (a layout that decoded
    ``bfloat16`` as ``float16`` gives the same bytes but the wrong dtype: caught here)."""
    gen = torch.Generator().manual_seed(7)
    cols = [random_tensor(gen, (5, 3), dtype), random_tensor(gen, (5,), torch.float16)]
    ds = TensorDataset(*cols) if columns else Items(cols)
    layout = RecordLayout.from_json(RecordLayout.of(ds).to_json())
    assert [f.dtype for f in layout.fields] == [str(dtype).removeprefix("torch."), "float16"]
    got = layout.unpack(layout.pack(ds, 5).rows(0, 5))
    for g, want in zip(got, cols, strict=True):
        assert g.dtype == want.dtype and g.shape == want.shape
        assert raw_bytes(g) == raw_bytes(want)


def test_the_jobs_records_are_features_then_the_int32_label():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    y = torch.tensor([7, -1], dtype=torch.int32)
    rows = RecordLayout.of(TensorDataset(x, y)).pack(TensorDataset(x, y), 2).rows(0, 2)
    want = np.concatenate(
        [
            x.numpy().astype("<f4").view(np.uint8).reshape(2, 12),
            y.numpy().astype("<i4").view(np.uint8).reshape(2, 4),
        ],
        axis=1,
    )
    assert rows.numpy().tobytes() == want.tobytes() and rows.shape == (2, 16)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), picked=st.integers(0, 2**16), seed=st.integers(0, 2**16))
def test_records_apart_or_through_an_index_read_the_joined_bytes(n, picked, seed):
    """Columns kept apart (a large data set: never joined) and read through an index (a
    held-out split of a packed directory) give every row, pick and digest of the same records
    joined in memory; nothing is copied whole (the columns are the dataset's own memory)."""
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((n + 3, 2, 3), dtype=np.float32))
    y = torch.from_numpy(rng.integers(0, 9, n + 3, dtype=np.int64))
    index = rng.permutation(n + 3)[:n]
    apart = ColumnDataset(x, y, index=index)
    joined = TensorDataset(x[torch.from_numpy(index)], y[torch.from_numpy(index)])
    layout = RecordLayout.of(joined)
    want, got = layout.pack(joined, n), layout.pack(apart, n)
    assert want.array is not None and got.array is None  # the index keeps the columns apart
    assert got.columns[0].ctypes.data == x.data_ptr()  # read where it is: no copy
    assert torch.equal(got.rows(0, n), want.rows(0, n))
    ids = np.random.default_rng(picked).integers(0, n, 7)
    assert np.array_equal(got.gather(ids), want.array.numpy()[ids])
    assert torch.equal(got.pick(ids).rows(2, 4), want.pick(ids).rows(2, 4))
    assert got.digest(ids) == want.digest(ids) == hashlib.sha256(want.gather(ids)).digest()
    assert np.array_equal(item_labels(apart, n), y.numpy()[index])


def test_items_of_mixed_shapes_or_types_are_named():
    a = Items([torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64)])
    layout = RecordLayout.of(a)

    class Ragged(Items):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return (x[:2] if i == 2 else x), y

    with pytest.raises(UsageError, match=r"item 2, field 0: shape \(2,\) float32, item 0 has"):
        layout.pack(Ragged(a.columns), 4)

    class Numbers(Items):
        def __getitem__(self, i):
            return self.columns[0][i], 3

    with pytest.raises(UsageError, match=r"item 0, field 1 is a int: fields must be tensors"):
        RecordLayout.of(Numbers(a.columns))
    with pytest.raises(UsageError, match="dataset is empty"):
        RecordLayout.of(TensorDataset(torch.zeros(0, 2)))


# --- CodedShuffle in real process groups -------------------------------------------------------


def own_loop(
    rank,
    world,
    scheme,
    transport,
    epochs,
    points,
    ahead=True,
    stream=True,
    policy=("full", 1.0),
    placement="random",
):
    """A user's loop: the master passes a TensorDataset, workers train on what they get.
    ``ahead``: the master knows the epochs (encodes each ahead), else ``stream`` decides;
    ``policy``: the shuffle policy and its fraction."""
    from coded_shuffle import CodedShuffle

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(points, 5, generator=gen)
    y = torch.randint(0, 3, (points,), generator=gen)
    cs = CodedShuffle(
        TensorDataset(x, y) if rank == 0 else None,
        scheme=scheme,
        seed=11,
        transport=transport,
        epochs=epochs if ahead else None,
        chunk_bytes=512,  # many messages per epoch
        stream=stream,
        shuffle=policy[0],
        fraction=policy[1],
        placement=placement,
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    reports, seen = [], []
    for epoch in range(1, epochs + 1):
        local = cs.epoch(epoch)
        if rank == 0:
            reports.append(dict(cs.report))
            continue
        xs, ys = local.tensors
        # byte-identical to the master's items, in the order of cs.indices
        assert torch.equal(xs, x[cs.indices]) and torch.equal(ys, y[cs.indices])
        assert local[0][0].shape == (5,) and local[0][1].dtype == torch.int64
        seen.append(cs.indices.tolist())
        for i in range(0, len(local), 8):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xs[i : i + 8]), ys[i : i + 8]).backward()
            for p in model.parameters():
                torch.distributed.all_reduce(p.grad, group=cs.workers_group)
            opt.step()
    cs.close()
    if rank == 0:
        return reports
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest(), seen


@pytest.mark.distributed
def test_coded_and_uncoded_deliveries_train_the_same_model():
    """Same seed: the same batches at every worker, the same final parameters; every epoch
    verified; the coded epochs move fewer bytes, never fewer than the lower bound."""
    runs = {s: run_ranks(4, own_loop, s, "chain", 4, 302) for s in ("cycles", "uncoded")}
    for scheme, results in runs.items():
        reports, workers = results[0], results[1:]
        assert [r["epoch"] for r in reports] == [1, 2, 3, 4]
        assert all(r["verified"] is True and r["scheme"] == scheme for r in reports)
        assert all(r["dropped_points"] == 2 and r["points"] == 300 for r in reports)
        assert len({h for h, _ in workers}) == 1  # the workers agree
        for r in reports[1:]:
            assert r["load_points"] >= r["lower_bound_points"] - 1e-9
    assert runs["cycles"][1] == runs["uncoded"][1]  # hash and batches
    coded = sum(r["broadcast_bytes"] for r in runs["cycles"][0][1:])
    uncoded = sum(r["broadcast_bytes"] for r in runs["uncoded"][0][1:])
    assert coded < 0.75 * uncoded


@pytest.mark.distributed
def test_partial_and_no_reshuffle_move_what_their_policy_says():
    """``partial`` (``Q = 0.25``): every epoch verified, each worker's batch is the policy's
    (derived here independently of the library's chain), and about a quarter of ``full``'s
    bytes move; ``none``: no byte after the placement."""
    from coded_shuffle.math.assignment import batches
    from coded_shuffle.math.policies import ShufflePolicy, full_assignment

    part = run_ranks(4, own_loop, "cycles", "chain", 4, 300, True, True, ("partial", 0.25))
    reports, workers = part[0], part[1:]
    assert all(r["verified"] and r["shuffle"] == "partial" for r in reports)
    policy, current = ShufflePolicy("partial", 0.25), full_assignment(11, 1, 300, 3)
    for epoch in range(1, 5):
        if epoch > 1:
            current = policy.next_assignment(current, 11, epoch, 3)
        for k, (_, seen) in enumerate(workers):
            assert seen[epoch - 1] == batches(current, 3)[k].tolist()
    moved = [r["uncoded_points"] for r in reports[1:]]
    assert all(0 < m <= 3 * 25 for m in moved)  # at most the freed points cross
    assert all(r["load_points"] <= r["uncoded_points"] for r in reports[1:])
    none = run_ranks(4, own_loop, "cycles", "chain", 3, 300, True, True, ("none", 1.0))
    assert [r["broadcast_bytes"] for r in none[0][1:]] == [0, 0]
    assert none[1][1][0] == none[1][1][1] == none[1][1][2]  # the same batch every epoch


@pytest.mark.distributed
def test_a_placement_by_label_deals_skewed_shards():
    """``placement="by_label"``: worker ``k``'s first batch is the ``k``-th block of the
    points in label order (3 classes, 3 workers: one class each, nearly)."""
    runs = run_ranks(4, own_loop, "cycles", "chain", 2, 300, True, True, ("full", 1.0), "by_label")
    gen = torch.Generator().manual_seed(3)
    torch.randn(300, 5, generator=gen)
    labels = torch.randint(0, 3, (300,), generator=gen).numpy()
    order = np.argsort(labels, kind="stable")
    for k, (_, seen) in enumerate(runs[1:]):
        assert seen[0] == sorted(order[100 * k : 100 * (k + 1)].tolist())
    assert all(r["verified"] for r in runs[0])


def bad_use(rank, world, case):
    from coded_shuffle import CodedShuffle

    ds = TensorDataset(torch.zeros(7, 2)) if rank == 0 else None
    try:
        if case == "order":
            cs = CodedShuffle(ds, scheme="cycles")
            try:
                cs.epoch(2)
            finally:
                cs.close()  # stops its watchdog
        elif case == "drop":
            CodedShuffle(ds, drop_last=False)
        elif case == "transport":
            CodedShuffle(ds, scheme="cycles", transport="p2p")
        elif case == "by_label":
            CodedShuffle(ds, placement="by_label")
        elif case == "policy":
            CodedShuffle(ds, shuffle="partial", fraction=0.0)
        elif case == "state":
            with CodedShuffle(ds, scheme="cycles", seed=1) as cs:
                cs.load_state_dict({**cs.state_dict(), "epoch": 1, "seed": 2})
    except UsageError as exc:
        import threading

        alive = [t.name for t in threading.enumerate() if t.name.startswith("liveness")]
        return str(exc) if not alive else f"watchdog left running: {alive}"
    return None


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("order", r"epoch\(2\): epochs are delivered in order, next is 1"),
        ("drop", r"7 items do not divide among 3 workers: pass drop_last=True or 6 items"),
        ("transport", r"transport=p2p carries uncoded deliveries only"),
        ("by_label", r"placement='by_label' needs items whose last field is an integer label"),
        ("policy", r"fraction=0\.0 out of range \(0, 1\]"),
        ("state", r"load_state_dict: seed=1 but the state holds 2: it is another run's"),
    ],
)
def test_bad_use_fails_on_every_rank_with_one_line(case, message):
    errors = run_ranks(4, bad_use, case)
    assert all(e is not None and re.search(message, e) for e in errors), errors


# --- resuming a restarted job -------------------------------------------------------------------


def epochs_with_store(rank, world, scheme, storage, store_dir, first, last, resume, inside=False):
    """Epochs ``first..last`` of 5 (after ``load_state_dict(resume)``, a run's last
    ``state_dict()``, when given, else ``restore(resume)`` when non-zero; ``inside``: keeping
    the batches, and resumed inside epoch ``first`` instead of delivering it): the master's
    restore report, what every worker got, and the shuffle's ``state_dict()`` at the end."""
    from coded_shuffle import CodedShuffle

    gen = torch.Generator().manual_seed(5)
    x = torch.randint(0, 256, (48, 24), dtype=torch.uint8, generator=gen)
    cs = CodedShuffle(
        TensorDataset(x) if rank == 0 else None,
        scheme=scheme,
        storage=storage,
        seed=2,
        epochs=5,
        store_dir=store_dir,
        keep_batch=inside,
    )
    restored = None
    if isinstance(resume, dict):
        cs.load_state_dict(resume)
        restored = cs.report
    elif resume:
        restored = cs.restore(resume)
    got = {}
    for epoch in range(first, last + 1):
        if inside and epoch == first and first > 1:
            local = cs.resume_inside(epoch)
            restored = cs.report
        else:
            local = cs.epoch(epoch)
        if rank:
            assert torch.equal(local.tensors[0], x[cs.indices])
            got[epoch] = cs.indices.tolist()
            if store_dir is not None:  # decoded into a file of the store, trained from it
                where = mapped_file(local.rows.data_ptr())
                assert where is not None and where.startswith(f"{store_dir}/worker-{rank - 1}/")
    state = cs.state_dict()
    cs.close()
    return restored, got, state


@pytest.mark.distributed
@pytest.mark.parametrize(("scheme", "storage"), [("elmahdy-mohajer", 2.0)])  # cycles: job tests
def test_a_restart_reuses_intact_stores_and_replaces_a_damaged_one(
    tmp_path, scheme, storage, monkeypatch
):
    """A restart resumes from the stores on disk; a damaged one is found and re-placed. With
    ``store_dir`` every worker decodes into files of its folder there and trains from them
    (the ranks fork with every buffer in a file, however small)."""
    monkeypatch.setattr(buffers, "FILE_MIN_BYTES", 0)
    unbroken = run_ranks(4, epochs_with_store, scheme, storage, None, 1, 5, 0)
    killed = run_ranks(4, epochs_with_store, scheme, storage, tmp_path, 1, 3, 0)  # then "killed"
    state = killed[0][2]  # a checkpoint's: cs.state_dict(), the same on every rank
    assert all(r[2] == state for r in killed) and state["epoch"] == 3
    assert (state["seed"], state["workers"], state["points"]) == (2, 3, 48)
    stamp = json.loads((tmp_path / "worker-0" / "e3-part0.json").read_text())  # the store's
    assert {k: stamp[k] for k in state} == state  # one identity: the state's keys and values
    intact = run_ranks(4, epochs_with_store, scheme, storage, tmp_path, 4, 4, state)
    assert intact[0][0] == {
        "resumed_after_epoch": 3,
        "replaced_workers": [],
        "replacement_bytes": 0,
    }
    # worker 1's store after epoch 4 is damaged on its disk: detected, re-placed, the same data
    damaged = tmp_path / "worker-1" / "e4-part0.npy"
    raw = bytearray(damaged.read_bytes())
    raw[-1] ^= 0x01
    damaged.write_bytes(bytes(raw))
    resumed = run_ranks(4, epochs_with_store, scheme, storage, tmp_path, 5, 5, 4)
    report = resumed[0][0]
    assert report["replaced_workers"] == [1]
    # the whole points behind worker 1's store (T * q points' worth), one header and the
    # chain's reach table of one message; never more than the placement of every point
    # (T = 1: its batch only, tests/test_train_restarts.py)
    stored = int(storage * 48 / 3) * 24
    assert stored < report["replacement_bytes"] <= 48 * 24 + HEADER_BYTES + REACH_DTYPE.itemsize
    for k in range(1, 4):
        assert intact[k][1][4] == unbroken[k][1][4]
        assert resumed[k][1][5] == unbroken[k][1][5]


def files_made_per_epoch(rank, world, transport, store_dir):
    """Epochs 1..3 of a job with every buffer in a file: the files this rank made anew in
    each epoch (scratch files, and slot files not written over a spare)."""
    from coded_shuffle import CodedShuffle

    made = []
    scratch_file, mapped_rows = buffers.FileBuffers._scratch_file, buffers.mapped_rows

    def new_scratch(self, size, filled=False):
        made.append(("scratch", size))
        return scratch_file(self, size, filled)

    def new_slot(path, rows, width, over=None):
        if over is None:
            made.append(("slot", rows * width))
        return mapped_rows(path, rows, width, over)

    buffers.FileBuffers._scratch_file, buffers.mapped_rows = new_scratch, new_slot  # forked
    gen = torch.Generator().manual_seed(5)
    x = torch.randint(0, 256, (48, 24), dtype=torch.uint8, generator=gen)
    cs = CodedShuffle(
        TensorDataset(x) if rank == 0 else None,
        scheme="cycles",
        seed=2,
        epochs=3,
        store_dir=store_dir,
        transport=transport,
        transport_options={"rate": "200mbit"} if transport == "multicast" else None,
    )
    per_epoch = []
    for epoch in (1, 2, 3):
        made.clear()
        cs.epoch(epoch)
        per_epoch.append(list(made))
    cs.close()
    return per_epoch


@pytest.mark.distributed
@pytest.mark.parametrize("transport", ["tree", "multicast"])
def test_the_first_coded_deliveries_write_into_buffers_the_placement_primed(
    tmp_path, transport, monkeypatch
):
    """While the placement's bytes move, every rank makes the rows its first coded delivery
    takes (the worker's kept symbols, decoder rows and next stores; the transport's own) with
    their pages in place: no rank makes a new file in the first two coded epochs, where
    without it each would (docs/benchmarks.md: several times a later delivery's CPU)."""
    if transport == "multicast" and not is_root():
        pytest.skip("multicast runs only inside a private namespace (root)")
    monkeypatch.setattr(buffers, "FILE_MIN_BYTES", 0)
    with contextlib.ExitStack() as stack:
        ns = stack.enter_context(private_netns()) if transport == "multicast" else None
        made = run_ranks(4, files_made_per_epoch, transport, tmp_path, netns=ns)
    for rank, (placement, first, second) in enumerate(made):
        assert first == [] and second == [], (rank, first, second)
        if rank:  # the workers' primed rows and spare files, made in the placement
            assert placement, rank


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"keep_batch": True}, r"keep_batch=True needs a store_dir"),
        ({"first_epoch": 0}, r"first_epoch=0 out of range 1\.\.epochs"),
        ({"epochs": 3, "first_epoch": 4}, r"first_epoch=4 out of range 1\.\.3"),
        ({"previous_workers": 0}, r"previous_workers=0 out of range \(>= 1\)"),
    ],
)
def test_the_settings_of_a_resumed_shuffle_are_checked_in_one_line(options, message):
    with pytest.raises(UsageError, match=message):
        ShuffleSettings(**options)


@pytest.mark.distributed
def test_a_restart_inside_an_epoch_gets_the_kept_batch_without_a_delivery(tmp_path, monkeypatch):
    """``keep_batch``: every worker keeps its batch; ``resume_inside(3)`` hands it back (the
    same points, the same bytes) with nothing on the link, and epoch 4 decodes from the
    stores after epoch 3 (every batch compared with the data set's rows)."""
    monkeypatch.setattr(buffers, "FILE_MIN_BYTES", 0)
    scheme, storage = "elmahdy-mohajer", 2.0
    before = run_ranks(4, epochs_with_store, scheme, storage, tmp_path, 1, 3, 0, True)  # killed
    resumed = run_ranks(4, epochs_with_store, scheme, storage, tmp_path, 3, 4, 0, True)
    assert resumed[0][0] == {
        "resumed_inside_epoch": 3,
        "replaced_workers": [],
        "replacement_bytes": 0,
        "rebatched_workers": [],
        "rebatch_bytes": 0,
    }
    for k in range(1, 4):  # the same batch; epoch 4 decoded from the stores (bytes checked)
        assert resumed[k][1][3] == before[k][1][3] and set(resumed[k][1]) == {3, 4}


@pytest.mark.distributed
def test_streamed_encoding_delivers_the_same_bytes():
    """Epochs unknown: the master encodes message by message while sending (``stream``);
    the same verified batches, parameters and link bytes as the epochs encoded ahead (the
    whole-epoch encoding ``stream=False`` runs the same code as encoding ahead; workers
    decode as symbols arrive in every case)."""
    ahead = run_ranks(4, own_loop, "cycles", "chain", 3, 302)
    streamed = run_ranks(4, own_loop, "cycles", "chain", 3, 302, False, True)
    for run in (streamed,):
        assert run[1:] == ahead[1:]  # every worker's parameters and batches
        for mine, theirs in zip(run[0], ahead[0], strict=True):
            assert mine["verified"] is True
            assert mine["broadcast_bytes"] == theirs["broadcast_bytes"]
            assert mine["network_bytes"] == theirs["network_bytes"]


def test_a_report_is_typed_and_reads_as_the_mapping_of_its_keys():
    """``cs.report`` (coded_shuffle/distributed/delivery_report.py): typed fields, read as a mapping
    of the record's keys; a field that is None is left out, what handing out adds comes last,
    and it equals a dict of the same keys, pickles (across ranks) and stays frozen."""
    import dataclasses
    import pickle

    from coded_shuffle.distributed.delivery_report import Restored, WorkerReport
    from coded_shuffle.distributed.reports import HostCpu, worker_report
    from coded_shuffle.distributed.transports import HostBytes

    restored = Restored(resumed_after_epoch=2, replaced_workers=[1], replacement_bytes=10)
    assert restored == {"resumed_after_epoch": 2, "replaced_workers": [1], "replacement_bytes": 10}
    assert "rebatch_bytes" not in restored and restored.rebatch_bytes is None
    counts = HostBytes(egress=5, ingress=7)
    record = worker_report(bytes([0xAB] * 32), 0.25, 100, counts, HostCpu.start())
    worker = WorkerReport.of(record, 0.5)
    assert (worker.batch_sha256, worker.stored_bytes, worker.link_seconds) == ("ab" * 32, 100, 0.5)
    assert worker.decode_seconds == 0.25 and worker.cpu_seconds >= 0 and worker.parity == 0
    handed = dataclasses.replace(worker, wait_seconds=0.125, prefetched=True)
    assert list(handed)[:2] == ["batch_sha256", "decode_seconds"]
    assert list(handed)[-2:] == ["wait_seconds", "prefetched"] and "wait_seconds" not in worker
    assert handed["egress"] == 5 and handed.ingress == 7 and {**handed}["prefetched"] is True
    assert pickle.loads(pickle.dumps(handed)) == handed != worker
    assert json.loads(json.dumps(dict(handed))) == dict(handed)
    with pytest.raises(dataclasses.FrozenInstanceError):
        handed.decode_seconds = 1.0  # type: ignore[misc]
