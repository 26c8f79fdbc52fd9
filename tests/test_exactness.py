"""Exactness where the other tests do not look: every chunk boundary of the byte codec, every
scheme, stores compared with the master's bytes; elimination that needs cached terms; the
digest comparison behind ``verified``. Expected bytes are computed here with numpy, by a
different route than the codec's.

docs/testing.md lists the faults these tests were checked against.
"""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.codec import decode, encode, ops
from coded_shuffle.codec.digest import digest
from coded_shuffle.distributed.delivery import Delivery, WorkerStore
from coded_shuffle.distributed.epochs import EpochChain
from coded_shuffle.distributed.reports import (
    REPORT,
    HostCpu,
    peers_seconds,
    verify_digests,
    worker_report,
)
from coded_shuffle.distributed.transports import HostBytes
from coded_shuffle.errors import VerificationError
from coded_shuffle.math.index_decoder import decode_plan
from coded_shuffle.math.plan import DeliveryPlan, symbol_blocks
from coded_shuffle.math.schemes import get_scheme
from coded_shuffle.math.state import part_states

CASES = [
    ("uncoded", 1.0),
    ("attia-tandon", 1.0),
    ("cycles", 1.0),
    ("best", 1.0),
    ("attia-tandon-excess", 1.5),
    ("attia-tandon-excess", 2.0),
    ("elmahdy-mohajer", 2.0),
    ("elmahdy-mohajer", 2.5),
]


def subpoint_rows(data: np.ndarray, cols: slice, splits: int, ids: np.ndarray) -> np.ndarray:
    """Sub-points ``ids`` of the byte range ``cols`` of every point, zero-padded, by numpy."""
    part = data[:, cols]
    width = -(-part.shape[1] // splits)
    padded = np.zeros((part.shape[0], width * splits), dtype=np.uint8)
    padded[:, : part.shape[1]] = part
    points, slots = np.divmod(np.asarray(ids, dtype=np.int64), splits)
    out = np.zeros((points.size, width), dtype=np.uint8)
    for i, (p, s) in enumerate(zip(points, slots, strict=True)):
        out[i] = padded[p, s * width : (s + 1) * width]
    return out


def expected_symbols(data: np.ndarray, plan: DeliveryPlan, cols: slice) -> np.ndarray:
    """Every symbol of ``plan`` as the XOR of its sub-points' bytes."""
    blocks = []
    for block in plan.symbols:
        terms = [subpoint_rows(data, cols, plan.splits, block[:, c]) for c in range(block.shape[1])]
        blocks.append(np.bitwise_xor.reduce(np.stack(terms), axis=0))
    return np.concatenate(blocks)


def streamed(delivery: Delivery, data: torch.Tensor, rows: int) -> list[torch.Tensor]:
    """Every part's symbols from the streaming encoder, ``rows`` symbols at a time."""
    out = []
    for enc in delivery.encoders(data):
        n = enc.shape[0]
        runs = [enc.rows(a, min(rows, n - a)) for a in range(0, n, rows)]
        out.append(torch.cat(runs) if runs else torch.empty(enc.shape, dtype=torch.uint8))
    return out


def stream_decode(
    delivery: Delivery,
    w: int,
    symbols: list[torch.Tensor],
    store: WorkerStore,
    rows: int,
    rng: np.random.Generator | None = None,
) -> tuple[torch.Tensor, bytes]:
    """The worker's batch from the streaming decoder, told of ``rows`` more kept symbols at a
    time (the rows not yet arrived hold garbage; with ``rng``, the runs of rows arrive in a
    random order, as messages behind a lost datagram do), and its SHA-256 hashed along the
    way."""
    kept = []
    for part, sym in enumerate(symbols):
        ids = torch.from_numpy(delivery.programs[part][w].symbol_ids)
        kept.append(sym.index_select(0, ids))
    buffers = [torch.full_like(k, 0xA5) for k in kept]
    decoders = delivery.decoders(w, buffers, store)
    check = delivery.digest_stream(w, decoders)
    for buf, got, dec in zip(buffers, kept, decoders, strict=True):
        dec.arrived(0, 0)  # what needs no symbol
        check.update()
        starts = np.arange(0, got.shape[0], rows)
        for a in starts if rng is None else rng.permutation(starts):
            b = min(a + rows, got.shape[0])
            buf[a:b] = got[a:b]
            dec.arrived(int(a), b)
            check.update()
    works = [dec.finish() for dec in decoders]
    return delivery.batch(w, works), check.digest()


@pytest.mark.parametrize("rows_per_chunk", [1, 2, 3])
@pytest.mark.parametrize(("name", "storage"), CASES)
def test_every_chunk_boundary_decodes_exactly(monkeypatch, name, storage, rows_per_chunk):
    """The codec's chunks cut to a few rows, so that every op spans many chunks (encode and
    decode), the streaming encoder run a few symbols at a time and the streaming decoder told
    of a few more symbols at a time; every symbol, every worker's batch (both decoders) and
    updated store equal the master's bytes, epoch after epoch."""
    k, n, b, epochs = 4, 24, 72, 4
    scheme = get_scheme(name, b)
    scheme.check(n, k, storage)
    scheme.check_point_bytes(k, storage)
    records = np.random.default_rng(rows_per_chunk).integers(0, 256, (n, b), dtype=np.uint8)
    data = torch.from_numpy(records)
    stores = None
    for tr in EpochChain(scheme, n, k, storage, seed=7).transitions(epochs):
        delivery = Delivery.prepare(tr.plan, b)
        sizes = delivery.symbol_bytes()
        # a chunk of rows_per_chunk rows of the widest part (fewer bytes than any row: 1 row)
        monkeypatch.setattr(ops, "CHUNK_BYTES", rows_per_chunk * max(sizes))
        if stores is None:
            stores = [WorkerStore.from_master(data, delivery, w) for w in range(k)]
        symbols = delivery.encode(data)
        slices = delivery.column_slices()
        for part, plan in enumerate(delivery.plans):
            want = expected_symbols(records, plan, slices[part])
            assert np.array_equal(symbols[part].numpy(), want), f"{name}: part {part} encoded"
        for got, want in zip(streamed(delivery, data, rows_per_chunk), symbols, strict=True):
            assert torch.equal(got, want), f"{name}: streaming encoder"
        parts = part_states(tr.next_state)[0]
        for w in range(k):
            where = f"{name} T={storage} epoch {tr.epoch} worker {w}"
            rng = np.random.default_rng(w) if (w + tr.epoch) % 2 else None  # out of order
            first, hashed = stream_decode(delivery, w, symbols, stores[w], rows_per_chunk, rng)
            want_batch = records[tr.plans[0].new_batches[w]]
            assert np.array_equal(first.numpy(), want_batch), f"{where}: streaming decoder"
            # hashed as points became final: garbage in a row not yet decoded would show
            assert hashed == hashlib.sha256(want_batch.tobytes()).digest(), f"{where}: digest"
            batch, work = delivery.decode(w, symbols, stores[w])
            assert np.array_equal(batch.numpy(), want_batch), where
            caches = scheme.part_caches(tr.next_state, w)
            stores[w] = stores[w].updated(work, caches)
            for part, ids in enumerate(caches):
                want = subpoint_rows(records, slices[part], parts[part].splits, ids)
                assert np.array_equal(stores[w].caches[part].numpy(), want), f"{where}: store"


def _stalled_with_cached_terms() -> DeliveryPlan:
    """Worker 0 caches x5 and needs x0, x1, x2 from three symbols with two unknowns or more
    each (peeling stalls); elimination solves x0 = s1 + s2 + x5 and x2 = s0 + s2 + x5, so the
    cached x5 must enter the result."""
    return DeliveryPlan(
        scheme="hand",
        num_workers=2,
        num_points=6,
        splits=1,
        symbols=symbol_blocks([np.array([[0, 1, 5], [1, 2, 5], [0, 1, 2]])]),
        caches=(np.array([5]), np.array([3, 4, 5])),
        new_batches=(np.array([0, 1, 2]), np.array([3, 4, 5])),
    )


@pytest.mark.parametrize("point_bytes", [1, 8, 37])
def test_elimination_uses_the_cached_terms_it_needs(point_bytes):
    plan = _stalled_with_cached_terms()
    program = decode_plan(plan)[0]
    assert program.eliminated == 3  # no symbol has a single unknown: peeling alone fails
    data = np.random.default_rng(point_bytes).integers(0, 256, (6, point_bytes), dtype=np.uint8)
    symbols = encode.encode(plan, torch.from_numpy(data))
    x = data
    want = np.stack([x[0] ^ x[1] ^ x[5], x[1] ^ x[2] ^ x[5], x[0] ^ x[1] ^ x[2]])
    assert np.array_equal(symbols.numpy(), want)
    cache = torch.from_numpy(x[[5]])
    out = decode.decode(program, symbols, cache, point_bytes)
    assert np.array_equal(out.numpy(), x[[0, 1, 2]])


# --- verified: the master's comparison of the workers' batch digests ------------------------


def test_a_wrong_batch_makes_verification_fail():
    """A worker decodes from a symbol with one flipped byte: its batch digest differs from the
    master's, and the comparison behind ``verified`` raises naming that worker."""
    k, n, b = 4, 24, 40
    scheme = get_scheme("cycles")
    data = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (n, b), dtype=np.uint8))
    tr = next(EpochChain(scheme, n, k, 1.0, seed=1).transitions(2))
    delivery = Delivery.prepare(tr.plan, b)
    stores = [WorkerStore.from_master(data, delivery, w) for w in range(k)]
    symbols = delivery.encode(data)
    expected = [digest(data[torch.from_numpy(p)]) for p in tr.plans[0].new_batches]
    reported = [digest(delivery.decode(w, symbols, stores[w])[0]) for w in range(k)]
    assert verify_digests(2, reported, expected) is True
    victim = next(w for w in range(k) if delivery.programs[0][w].symbol_ids.size)
    bad = delivery.programs[0][victim].symbol_ids[0]
    symbols[0][bad, 0] ^= 1
    reported[victim] = digest(delivery.decode(victim, symbols, stores[victim])[0])
    with pytest.raises(VerificationError, match=rf"epoch 2: worker {victim} decoded a batch"):
        verify_digests(2, reported, expected)


@settings(max_examples=20, deadline=None)
@given(k=st.integers(1, 6), wrong=st.integers(0, 5))
def test_verification_names_the_first_worker_whose_digest_differs(k, wrong):
    expected = [bytes([w]) * 32 for w in range(k)]
    reported = list(expected)
    assert verify_digests(3, reported, expected)
    if wrong < k:
        reported[wrong] = b"\xff" * 32
        with pytest.raises(VerificationError, match=f"worker {wrong} decoded"):
            verify_digests(3, reported, expected)
    with pytest.raises(VerificationError, match="reports for"):
        verify_digests(3, reported[:-1], expected)


def test_a_delivery_between_the_workers_is_timed_by_their_clocks():
    """``p2p``: from the earliest worker's start to the latest one's batch (the master's
    clock starts late and ends late, both by its own evaluation of the epoch before)."""
    reports = np.zeros(3, dtype=REPORT)
    reports["started"] = [100.2, 100.0, 100.5]
    reports["finished"] = [100.9, 101.25, 101.0]
    assert peers_seconds(reports) == pytest.approx(1.25)
    mine = worker_report(b"\0" * 32, 0.0, 0, HostBytes(), HostCpu.start())
    assert mine.dtype == REPORT and 0 <= mine["finished"][0] - mine["started"][0] < 1.0


def test_a_delivery_behind_the_loop_counts_its_own_cpu_not_the_training_threads():
    """Started on a thread while the main thread trains, a delivery's CPU is the other
    threads' only: at least what its own thread spent (a short one came out at 0 s when the
    main thread's clock, up to the moment, was taken off the process's totals, which lag a
    running thread by up to a tick), and not the main thread's seconds meanwhile."""
    trained, got = threading.Event(), []

    def deliver() -> None:
        cpu, mine = HostCpu.start(), time.thread_time()
        while time.thread_time() - mine < 0.0002:  # 0.2 ms of this thread's own CPU
            pass
        trained.wait()
        got.append(cpu.stop())

    thread = threading.Thread(target=deliver)
    thread.start()
    spent, step = time.thread_time(), bytes(1 << 22)
    while time.thread_time() - spent < 0.2:  # the main thread trains meanwhile, the GIL
        hashlib.sha256(step)  # released as torch's steps release it
    trained.set()
    while not got:  # and goes on while the delivery ends
        hashlib.sha256(step)
    thread.join()
    (cpu,) = got
    assert 0.0002 <= cpu.total < 0.1 and 0 <= cpu.system <= cpu.total
