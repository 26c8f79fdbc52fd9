"""Core: assignments, the generic GF(2) decoder, the byte codec and Delivery/WorkerStore."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.codec import buffers, decode, encode, kernel
from coded_shuffle.distributed.delivery import Delivery, WorkerStore
from coded_shuffle.errors import UndecodableError, UsageError
from coded_shuffle.math.assignment import (
    batches,
    leftover_matrix,
    random_assignment,
    shuffle_matrix,
    validate_assignment,
)
from coded_shuffle.math.index_decoder import decode_plan
from coded_shuffle.math.plan import DeliveryPlan, SharedPlan, byte_parts, ranges, symbol_blocks
from coded_shuffle.math.schemes import get_scheme
from coded_shuffle.math.shuffles import cyclic_shuffle


def random_bytes(n: int, b: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, b), dtype=torch.uint8, generator=gen)


@given(k=st.integers(1, 12), q=st.integers(1, 30), seed=st.integers(0, 2**32 - 1))
def test_random_assignment_is_balanced_and_seeded(k, q, seed):
    a = random_assignment(k * q, k, np.random.default_rng(seed))
    assert np.array_equal(np.bincount(a, minlength=k), np.full(k, q))
    assert np.array_equal(a, random_assignment(k * q, k, np.random.default_rng(seed)))
    s = shuffle_matrix(a, random_assignment(k * q, k, np.random.default_rng(seed + 1)), k)
    assert np.array_equal(s.sum(axis=0), np.full(k, q))
    assert np.array_equal(s.sum(axis=1), np.full(k, q))
    omega = leftover_matrix(s)
    # conservation (Attia & Tandon 2016): incoming leftovers equal
    # outgoing leftovers at every worker
    assert np.array_equal(omega.sum(axis=0), omega.sum(axis=1))
    assert np.all(np.minimum(omega, omega.T) == 0)


def test_the_cyclic_shift_moves_every_batch_to_the_next_worker():
    a = random_assignment(12, 4, np.random.default_rng(1))
    s = shuffle_matrix(a, cyclic_shuffle(a, 4), 4)
    assert np.array_equal(s, 3 * np.roll(np.eye(4, dtype=np.int64), 1, axis=1))


def test_validate_assignment_names_the_bad_value():
    with pytest.raises(UsageError, match=r"worker id 7 out of range 0\.\.2"):
        validate_assignment(np.array([0, 1, 7]), 3, 3, "--old")
    with pytest.raises(UsageError, match="length 6"):
        validate_assignment(np.array([0, 1, 2]), 6, 3, "--new")
    with pytest.raises(UsageError, match="worker 0 holds 2 points"):
        validate_assignment(np.array([0, 0, 1]), 3, 3, "--old")


def test_ranges_concatenates_aranges():
    assert ranges(np.array([5, 0, 9]), np.array([2, 0, 3])).tolist() == [5, 6, 9, 10, 11]


def _hand_plan() -> DeliveryPlan:
    """Worker 0 holds {0, 1, 5} and needs {2, 3, 4}: only GF(2) elimination decodes it."""
    return DeliveryPlan(
        scheme="hand",
        num_workers=2,
        num_points=6,
        splits=1,
        symbols=symbol_blocks(
            [np.array([[2, 3], [3, 4]]), np.array([[2, 3, 4]]), np.array([[0], [1], [5]])]
        ),
        caches=(np.array([0, 1, 5]), np.array([2, 3, 4])),
        new_batches=(np.array([2, 3, 4]), np.array([0, 1, 5])),
    )


@pytest.mark.parametrize("point_bytes", [1, 13, 64])
def test_elimination_fallback_decodes_byte_exactly(point_bytes):
    plan = _hand_plan()
    programs = decode_plan(plan)
    assert programs[0].eliminated > 0 and programs[1].eliminated == 0
    data = random_bytes(6, point_bytes)
    symbols = encode.encode(plan, data)
    for k, program in enumerate(programs):
        out = decode.decode(program, symbols, decode.cache_bytes(data, plan, k), point_bytes)
        assert torch.equal(out, data[torch.from_numpy(plan.new_batches[k])])


def test_undecodable_plan_is_rejected():
    plan = _hand_plan()
    broken = DeliveryPlan(**{**plan.__dict__, "symbols": symbol_blocks([np.array([[2, 3]])])})
    with pytest.raises(UndecodableError, match="worker 0 cannot decode"):
        decode_plan(broken)


def test_split_points_pads_and_joins():
    data = random_bytes(5, 10)
    subs = encode.split_points(data, 3)
    assert subs.shape == (15, 4)
    assert torch.equal(encode.join_subpoints(subs, 3, 10), data)
    assert torch.all(subs.view(5, 12)[:, 10:] == 0)


def _chain_plan(num_points: int, splits: int) -> DeliveryPlan:
    """Worker 1 holds sub-point 0 and peels a long chain x0^x1, x1^x2, ... (worker 0 has all)."""
    n = num_points * splits
    chain = np.stack([np.arange(n - 1), np.arange(1, n)], axis=1)
    everything = np.arange(n)
    return DeliveryPlan(
        scheme="chain",
        num_workers=2,
        num_points=num_points,
        splits=splits,
        symbols=symbol_blocks([chain]),
        caches=(everything, np.array([0])),
        new_batches=(np.arange(num_points), np.arange(num_points)),
    )


@settings(max_examples=25, deadline=None)
@given(points=st.integers(1, 20), splits=st.integers(1, 4), point_bytes=st.integers(1, 40))
def test_peeling_chains_and_subpoints(points, splits, point_bytes):
    plan = _chain_plan(points, splits)
    delivery = Delivery.prepare(plan, point_bytes)
    data = random_bytes(points, point_bytes, seed=points)
    symbols = delivery.encode(data)
    store = WorkerStore.from_master(data, delivery, 1)
    batch, workspaces = delivery.decode(1, symbols, store)
    assert torch.equal(batch, data)
    kept = store.updated(workspaces, [np.arange(points * splits)])
    assert torch.equal(encode.join_subpoints(kept.caches[0], splits, point_bytes), data)
    sub = -(-point_bytes // splits)  # a sub-point: the point's bytes / splits, rounded up
    assert delivery.payload_bytes() == (points * splits - 1) * sub


@settings(max_examples=30, deadline=None)
@given(k=st.integers(2, 8), q=st.integers(1, 12), seed=st.integers(0, 10**6), b=st.integers(1, 70))
def test_uncoded_delivery_round_trip(k, q, seed, b):
    rng = np.random.default_rng(seed)
    old, new = random_assignment(k * q, k, rng), random_assignment(k * q, k, rng)
    scheme = get_scheme("uncoded")
    state = scheme.initial_state(old, k, 1)
    plan = scheme.plan(state, new)
    s = shuffle_matrix(old, new, k)
    assert plan.load_points == plan.uncoded_points == s.sum() - np.trace(s)
    delivery = Delivery.prepare(plan, b)
    data = random_bytes(k * q, b, seed % 1000)
    symbols = delivery.encode(data)
    for w in range(k):
        batch, _ = delivery.decode(w, symbols, WorkerStore.from_master(data, delivery, w))
        assert torch.equal(batch, data[torch.from_numpy(batches(new, k)[w])])


def test_shared_plan_splits_bytes_and_weights_the_load():
    plan = _chain_plan(4, 2)
    assert byte_parts(10, (0.25, 0.75)) == (2, 8)
    delivery = Delivery.prepare(SharedPlan((plan, plan), (0.25, 0.75)), 10)
    assert delivery.parts == (2, 8)
    assert delivery.load_points == pytest.approx(plan.load_points)
    data = random_bytes(4, 10)
    symbols = delivery.encode(data)
    batch, _ = delivery.decode(1, symbols, WorkerStore.from_master(data, delivery, 1))
    assert torch.equal(batch, data)


def _poison_recycled_buffers(rows: int, row_bytes: int) -> None:
    """Hands out, fills with 0xAB and drops codec buffers, so later outputs reuse garbage."""
    bufs = [buffers.empty_rows(rows, row_bytes) for _ in range(4)]
    for b in bufs:
        b.fill_(0xAB)
    del bufs


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(2, 8),
    q=st.integers(1, 20),
    seed=st.integers(0, 10**6),
    b=st.sampled_from([1, 13, 64, 256]),
    name=st.sampled_from(["uncoded", "attia-tandon", "cycles"]),
)
def test_decode_writes_every_byte_of_recycled_outputs(k, q, seed, b, name):
    """All outputs recycled (garbage inside); kept symbols or whole broadcast; store update."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(buffers, "HUGE_PAGE_BYTES", 1)
        _round_trip_with_garbage(k, q, seed, b, name)


def _round_trip_with_garbage(k: int, q: int, seed: int, b: int, name: str) -> None:
    rng = np.random.default_rng(seed)
    old, new = random_assignment(k * q, k, rng), random_assignment(k * q, k, rng)
    scheme = get_scheme(name)
    state = scheme.initial_state(old, k, 1)
    plan = scheme.plan(state, new)
    delivery = Delivery.prepare(plan, b)
    data = random_bytes(k * q, b, seed % 1000)
    symbols = delivery.encode(data)
    for w in range(k):
        expected = data[torch.from_numpy(plan.new_batches[w])]
        store = WorkerStore.from_master(data, delivery, w)
        kept = symbols[0][torch.from_numpy(delivery.programs[0][w].symbol_ids)]
        for heard in (symbols, [kept]):
            _poison_recycled_buffers(q, b)
            batch, work = delivery.decode(w, heard, store)
            assert torch.equal(batch, expected)
        ids = plan.caches[w]
        nxt = store.updated(work, [np.union1d(ids[: ids.size // 2], plan.new_batches[w])])
        want = np.union1d(ids[: ids.size // 2], plan.new_batches[w])
        assert torch.equal(nxt.caches[0], data[torch.from_numpy(want)])


def test_store_update_reads_cache_scratch_and_batch_rows():
    """Worker 1 peels x0^x1, ..., x4^x5 from x0 but keeps only point 5: x1..x4 are scratch."""
    n = 7  # point 6 is never sent
    chain = np.stack([np.arange(5), np.arange(1, 6)], axis=1)
    plan = DeliveryPlan(
        scheme="chain",
        num_workers=2,
        num_points=n,
        splits=1,
        symbols=symbol_blocks([chain]),
        caches=(np.arange(n), np.array([0])),
        new_batches=(np.arange(n), np.array([5])),
    )
    delivery = Delivery.prepare(plan, 24)
    program = delivery.programs[0][1]
    assert program.num_scratch == 4 and program.eliminated == 0
    data = random_bytes(n, 24, seed=3)
    store = WorkerStore.from_master(data, delivery, 1)
    batch, work = delivery.decode(1, delivery.encode(data), store)
    assert torch.equal(batch, data[5:6])
    kept = store.updated(work, [np.array([0, 2, 4, 5])])
    assert torch.equal(kept.caches[0], data[[0, 2, 4, 5]])
    with pytest.raises(ValueError, match="worker 1 cannot keep sub-point 6: never received"):
        store.updated(work, [np.array([5, 6])])


def test_recycled_buffers_are_never_shared_while_in_use(monkeypatch):
    monkeypatch.setattr(buffers, "HUGE_PAGE_BYTES", 1)
    first = buffers.empty_rows(1000, 40)
    address = first.data_ptr()
    view = first[500:]
    del first
    second = buffers.empty_rows(1000, 40)  # the view keeps the first buffer in use
    assert second.data_ptr() != address
    second.fill_(7)
    view.fill_(9)
    assert torch.all(second == 7)
    del view
    third = buffers.empty_rows(1000, 40)  # now idle: recycled
    assert third.data_ptr() == address


def test_a_recycled_payload_stays_in_use_while_any_array_over_it_lives():
    """Whatever holds the rows (a tensor, a view, a numpy array of them) keeps the buffer out
    of the pool: the pool's own weak reference decides, not the interpreter's counts."""
    rows = buffers.payload_rows(300, 100)
    address = rows.data_ptr()
    kept = rows[10:20].numpy()
    del rows
    other = buffers.payload_rows(300, 100)
    assert other.data_ptr() != address
    del kept, other
    assert buffers.payload_rows(300, 100).data_ptr() == address  # idle again: the first fit


def test_decode_is_one_dense_write_plus_small_scatters():
    """The largest group of a random shuffle writes one run of batch rows (no scatter)."""
    rng = np.random.default_rng(5)
    old, new = random_assignment(4000, 8, rng), random_assignment(4000, 8, rng)
    scheme = get_scheme("cycles")
    plan = scheme.plan(scheme.initial_state(old, 8, 1), new)
    for program in Delivery.prepare(plan, 64).programs[0]:
        first = program.ops[0]
        assert first.target_start >= 0 and len(first) > 0.8 * program.batch_rows.size
        scattered = sum(len(op) for op in program.ops[1:] if op.target_start < 0)
        assert scattered < 0.3 * program.batch_rows.size


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 40),
    width=st.integers(1, 300),
    mode=st.sampled_from([kernel.COPY, kernel.XOR, kernel.ACC, kernel.ACC_XOR]),
    runs=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    seed=st.integers(0, 10**6),
    threads=st.sampled_from([1, 2, 3]),
)
def test_kernel_matches_numpy_in_every_mode(rows, width, mode, runs, seed, threads):
    """Every mode, every mix of runs and gathered rows (targets and both columns), any row
    width (prefetches past a row's end must not matter), on one thread or several (the rows
    cut into spans); compared with numpy's fancy indexing."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (rows + 7, width), dtype=np.uint8)
    b = rng.integers(0, 256, (rows + 5, width), dtype=np.uint8)
    dst = rng.integers(0, 256, (rows + 3, width), dtype=np.uint8)
    want = dst.copy()
    none = np.zeros(0, dtype=np.int64)

    def column(run: bool, size: int) -> tuple[int, np.ndarray, np.ndarray]:
        if run:
            start = int(rng.integers(0, size - rows + 1))
            return start, none, np.arange(start, start + rows)
        idx = rng.choice(size, rows, replace=False).astype(np.int64)
        return -1, idx, idx

    t0, t_idx, t_rows = column(runs[0], dst.shape[0])
    a0, a_idx, a_rows = column(runs[1], a.shape[0])
    b0, b_idx, b_rows = column(runs[2], b.shape[0])
    value = a[a_rows] ^ b[b_rows] if mode in (kernel.XOR, kernel.ACC_XOR) else a[a_rows]
    want[t_rows] = want[t_rows] ^ value if mode in (kernel.ACC, kernel.ACC_XOR) else value
    with codec_threads(threads, min_bytes=0):
        kernel.gather_xor(dst, t_idx, t0, a, a_idx, a0, b, b_idx, b0, mode, rows)
    assert np.array_equal(dst, want)


@contextlib.contextmanager
def codec_threads(n: int, min_bytes: int):
    """The kernel on ``n`` threads for chunks from ``min_bytes`` on, restored afterwards."""
    old = kernel.threads(), kernel.PARALLEL_MIN_BYTES
    kernel.set_threads(n)
    kernel.PARALLEL_MIN_BYTES = min_bytes
    try:
        yield
    finally:
        kernel.set_threads(old[0])
        kernel.PARALLEL_MIN_BYTES = old[1]


@settings(max_examples=10, deadline=None)
@given(
    k=st.integers(2, 6),
    q=st.integers(2, 40),
    seed=st.integers(0, 10**6),
    name=st.sampled_from(["uncoded", "attia-tandon", "cycles"]),
)
def test_two_codec_threads_encode_and_decode_the_same_bytes(k, q, seed, name):
    """The parallel kernel (every chunk cut into spans) against one thread, whole epochs."""
    rng = np.random.default_rng(seed)
    old, new = random_assignment(k * q, k, rng), random_assignment(k * q, k, rng)
    scheme = get_scheme(name)
    plan = scheme.plan(scheme.initial_state(old, k, 1), new)
    data = torch.from_numpy(rng.integers(0, 256, (k * q, 33), dtype=np.uint8))
    delivery = Delivery.prepare(plan, 33)
    stores = [WorkerStore.from_master(data, delivery, w) for w in range(k)]
    runs = []
    for threads in (1, 2):
        with codec_threads(threads, min_bytes=0):
            symbols = delivery.encode(data)
            batches = [delivery.decode(w, symbols, stores[w])[0] for w in range(k)]
        runs.append((symbols, batches))
    (sym1, b1), (sym2, b2) = runs
    assert all(torch.equal(x, y) for x, y in zip(sym1, sym2, strict=True))
    for w in range(k):
        want = data[torch.from_numpy(plan.new_batches[w])]
        assert torch.equal(b1[w], want) and torch.equal(b2[w], want)


def test_codec_threads_must_be_positive():
    with pytest.raises(ValueError, match="codec threads must be >= 1, got 0"):
        kernel.set_threads(0)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 7), u=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_gauss_jordan_over_gf2_keeps_its_row_combinations(m, u, seed):
    """Every reduced row is the XOR of the original rows ``combo`` names; pivot columns are
    zero outside their row; the rank is numpy's rank of the matrix over GF(2) (checked by
    brute force over every combination of rows for these small sizes)."""
    from coded_shuffle.math.gf2 import gauss_jordan

    a = np.random.default_rng(seed).random((m, u)) < 0.4
    reduced, combo, rank = gauss_jordan(a)
    assert np.array_equal((combo.astype(int) @ a.astype(int)) % 2 == 1, reduced)
    for r in range(rank):
        col = int(np.flatnonzero(reduced[r])[0])
        assert reduced[:, col].sum() == 1
    assert not reduced[rank:].any()
    span = {tuple((np.array(c, dtype=int) @ a.astype(int)) % 2) for c in np.ndindex(*(2,) * m)}
    assert len(span) == 2**rank


@pytest.mark.parametrize("adopted", [False, True])
def test_a_store_slot_with_one_flipped_byte_is_not_loaded(tmp_path, adopted):
    """A slot written (or adopted: a memory-mapped file made the slot without a copy) then
    damaged on disk: its digest no longer matches, so it loads as missing, mapped or not."""
    from coded_shuffle.codec.blockstore import BlockStore
    from coded_shuffle.codec.buffers import FileBuffers

    rows = np.random.default_rng(1).integers(0, 256, (40, 16), dtype=np.uint8)
    disk = BlockStore(tmp_path, dtype=None)
    if adopted:
        mapped = FileBuffers(tmp_path).empty(40, 16, "slot")
        mapped.numpy()[:] = rows
        disk.adopt("slot", FileBuffers(tmp_path).path("slot"), mapped.numpy(), {"epoch": 1})
    else:
        disk.save("slot", rows, {"epoch": 1})
    assert np.array_equal(BlockStore(tmp_path, dtype=None).load("slot", mapped=True), rows)
    raw = bytearray((tmp_path / "slot.npy").read_bytes())
    raw[-7] ^= 0x10
    (tmp_path / "slot.npy").write_bytes(bytes(raw))
    for mapped_load in (False, True):
        assert BlockStore(tmp_path, dtype=None).load("slot", mapped=mapped_load) is None


def test_an_adopted_batch_keeps_the_digest_its_worker_computed_and_is_checked_by_it(tmp_path):
    """A store adopted with the SHA-256 its worker computed while decoding (``known``) is not
    hashed again; a restore checks those bytes, dtype and shape: a wrong digest, or a file
    of another shape, loads as missing."""
    import hashlib

    from coded_shuffle.codec.blockstore import BlockStore, bytes_digest
    from coded_shuffle.codec.buffers import FileBuffers

    rows = np.random.default_rng(2).integers(0, 256, (40, 16), dtype=np.uint8)
    right = hashlib.sha256(rows.tobytes()).digest()
    assert bytes_digest(rows) == right
    for known, intact in ((right, True), (bytes(32), False)):
        folder = tmp_path / str(intact)
        mapped = FileBuffers(folder).empty(40, 16, "slot")
        mapped.numpy()[:] = rows
        disk = BlockStore(folder, dtype=None)
        assert (
            disk.adopt("slot", FileBuffers(folder).path("slot"), mapped.numpy(), {}, known) == known
        )
        loaded = BlockStore(folder, dtype=None).load("slot", mapped=True)
        assert (loaded is not None and np.array_equal(loaded, rows)) == intact
    np.save(tmp_path / "True" / "slot.npy", rows.reshape(80, 8))  # the same bytes, reshaped
    assert BlockStore(tmp_path / "True", dtype=None).load("slot") is None


def test_scratch_rows_in_files_are_recycled_once_dropped_and_never_shared(tmp_path):
    """``FileBuffers`` scratch rows: a mapped file unlinked at once; once no tensor uses them
    they serve the next request of about their size (its pages already in place), never one
    still in use, never a much smaller one, and never in a forked child."""
    from coded_shuffle.codec.buffers import FILE_MIN_BYTES, REUSE_WITHIN, FileBuffers

    files = FileBuffers(tmp_path)
    rows, width = 2 * FILE_MIN_BYTES // 1000, 1000
    first = files.empty(rows, width)
    assert list(tmp_path.iterdir()) == []  # nothing stays on disk
    first.fill_(7)
    held = files.empty(rows, width)  # ``first`` is in use: another buffer
    assert held.data_ptr() != first.data_ptr()
    address = first.data_ptr()
    del first
    again = files.empty(rows + 3, width)  # a little longer: the same buffer, old bytes in it
    assert again.data_ptr() == address and int(again[0, 0]) == 7
    del again
    small = files.empty(int(rows / REUSE_WITHIN / 1.1), width)
    assert small.data_ptr() != address  # too small for it: a buffer of its own size
    del small
    parents = list(files._scratch.items)  # a forked child keeps its parent's mappings mapped
    files._scratch.pid = -1  # as in a forked child: the parent's buffers are not reused
    assert files.empty(rows, width).data_ptr() != address
    del parents


def test_primed_rows_are_the_ones_handed_out_next_and_a_large_delivery_primes_nothing(
    tmp_path, monkeypatch
):
    """``FileBuffers.prime``: scratch rows of every shape (two of one shape are two buffers)
    made with their pages in place and idle, so the next requests of those shapes make no
    file; a slot's spare file per slot shape, which the next slot is written over. Rows
    beyond ``PRIME_BYTES_MAX`` prime nothing."""
    import os

    from coded_shuffle.codec import buffers
    from coded_shuffle.codec.buffers import FILE_MIN_BYTES, FileBuffers

    files = FileBuffers(tmp_path / "a")
    rows, width = 3 * FILE_MIN_BYTES // 1000, 1000
    files.prime([(rows, width), (rows, width), (10, 10)], [(50, 16)])
    primed = [id(buf) for buf in files._scratch.items]
    assert len(primed) == 2 and len(files.spares) == 1
    spare = os.stat(files.spares[0]).st_ino
    held = [files.empty(rows, width), files.empty(rows, width)]
    assert sorted(id(buf) for buf in files._scratch.items) == sorted(primed)
    slot = files.empty(50, 16, "e2")
    assert not files.spares
    assert os.stat(files.path("e2")).st_ino == spare and slot.shape == (50, 16)
    del held
    monkeypatch.setattr(buffers, "PRIME_BYTES_MAX", 2 * rows * width - 1)
    large = FileBuffers(tmp_path / "b")
    large.prime([(rows, width)], [(rows, width)])
    assert large._scratch.items == [] and large.spares == []


@pytest.mark.parametrize("rows", [40, 25, 60])
def test_a_retired_slot_file_is_written_over_by_the_next_slot(tmp_path, rows):
    """A slot retired (``BlockStore.retire``) and given back (``FileBuffers.recycle``): the
    next slot is the same file (its blocks and cached pages), with its own header and size
    whatever the old one's; it loads as the rows written into it, and no file is left over."""
    import os

    from coded_shuffle.codec.blockstore import BlockStore
    from coded_shuffle.codec.buffers import FileBuffers

    files, disk = FileBuffers(tmp_path), BlockStore(tmp_path, dtype=None)
    old = files.empty(40, 16, "e1")
    old.numpy()[:] = 9
    disk.adopt("e1", files.path("e1"), old.numpy(), {"epoch": 1})
    inode = os.stat(tmp_path / "e1.npy").st_ino
    del old
    files.recycle(disk.retire("e1"))
    assert disk.load("e1") is None and not (tmp_path / "e1.json").exists()
    new = files.empty(rows, 16, "e3")
    assert os.stat(files.path("e3")).st_ino == inode and not files.spares
    assert int(new.numpy()[0, 1]) == 9  # the old bytes, until the caller writes every row
    want = np.random.default_rng(rows).integers(0, 256, (rows, 16), dtype=np.uint8)
    new.numpy()[:] = want
    disk.adopt("e3", files.path("e3"), new.numpy(), {"epoch": 3})
    assert np.array_equal(BlockStore(tmp_path, dtype=None).load("e3"), want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e3.json", "e3.npy"]
    files.recycle(disk.retire("e3"))
    FileBuffers(tmp_path)  # a process after this one (a restart): no spare of old is left
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_message_payload_buffer_is_reused_only_once_no_view_of_it_lives():
    """``payload_rows``: a message's payload comes on a pooled buffer; while the tensor or any
    view of it lives (a transport sending a segment of it) the buffer is not handed out
    again; once they are gone the next payload of that size reuses it."""
    from coded_shuffle.codec.buffers import payload_rows

    first = payload_rows(32, 8004)
    address = first.data_ptr()
    segment = first.view(-1)[65536:131072]  # what a transport may still hold
    del first
    assert payload_rows(32, 8004).data_ptr() != address
    del segment
    assert payload_rows(32, 8004).data_ptr() == address
    assert payload_rows(0, 8004).shape == (0, 8004)


def test_warming_a_planner_compiles_every_loop_its_plans_and_bounds_use(monkeypatch):
    """``warm_planner``: the numba loops that planning and bounding ``K = 48`` run (triangle
    packing, cycle decomposition, the ordering bound's local search) are compiled (or loaded
    from the disk cache) before any plan is timed, once per process; at ``K = 4`` none."""
    from coded_shuffle.math import bounds, warm
    from coded_shuffle.math.schemes import cycle_search

    loops = (cycle_search._pack, cycle_search._decompose, bounds._iterated_insertion)
    for loop in loops:  # as in a fresh process, whatever ran before in this one
        monkeypatch.setattr(loop, "_compiled", None)
    monkeypatch.setattr(warm, "_warmed", set())
    warm.warm_planner(get_scheme("cycles"), 1.0, 4)
    assert all(loop._compiled is None for loop in loops)  # a small K runs none of them
    warm.warm_planner(get_scheme("cycles"), 1.0, 48)
    assert all(loop._compiled is not None for loop in loops)
    assert warm.warm_planner(get_scheme("cycles"), 1.0, 48) == 0.0  # once per process


def test_warming_a_large_run_plans_a_tiny_transition_at_a_few_dozen_workers(monkeypatch):
    """At ``K = 1,024`` the warm-up plans :data:`WARM_WORKERS_MAX` workers (above every
    threshold a numba path depends on), not 1,024: a second run does not spend seconds
    planning to warm up; below it, the real ``K``."""
    from coded_shuffle.math import warm
    from coded_shuffle.math.bounds import EXACT_MAX_WORKERS
    from coded_shuffle.math.schemes.cycle_plan import SMALL_MAX_WORKERS

    scheme = get_scheme("cycles")
    planned = []
    real = type(scheme).plan

    def plan(self, state, new):
        planned.append(int(new.max()) + 1)
        return real(self, state, new)

    monkeypatch.setattr(type(scheme), "plan", plan)
    monkeypatch.setattr(warm, "_warmed", set())
    warm.warm_planner(scheme, 1.0, 1024)
    warm.warm_planner(scheme, 1.0, 20)
    assert planned == [warm.WARM_WORKERS_MAX, 20]
    assert max(EXACT_MAX_WORKERS, SMALL_MAX_WORKERS) < warm.WARM_WORKERS_MAX
    assert warm.warm_workers(100.0, 1024) == 100  # the storage fits the tiny transition


def test_a_compile_is_counted_and_a_compiled_call_is_not():
    """``counting_compiles``: what makes the "compiled ..." line true (numba's compile
    events; a function already compiled, or loaded from numba's cache, is none)."""
    import numba

    from coded_shuffle.math.warm import counting_compiles

    @numba.njit  # no disk cache: a compile in every process
    def twice(x):
        return 2 * x

    with counting_compiles() as first:
        assert twice(3) == 6
    with counting_compiles() as again:
        assert twice(4) == 8
    assert len(first) > 0 and len(again) == 0
