"""No excess storage (docs/schemes.md): attia-tandon, cycles, best; all verified byte-exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coded_shuffle.codec import buffers, encode, ops
from coded_shuffle.distributed.delivery import Delivery
from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import (
    leftover_matrix,
    points_by_pair,
    random_assignment,
    shuffle_matrix,
)
from coded_shuffle.math.bounds import ordering_bound, worst_case_optimum
from coded_shuffle.math.plan import XorBlock
from coded_shuffle.math.schemes import REGISTRY, get_scheme
from coded_shuffle.math.schemes.attia_tandon import ignored_worker, theorem1_load
from coded_shuffle.math.schemes.best import PROBE_SEED, Best, probe_reshuffle
from coded_shuffle.math.schemes.cycle_plan import (
    Cycle,
    CycleSet,
    cycle_symbols,
    greedy_cycles,
    pair_cycles,
)
from coded_shuffle.math.schemes.uncoded import Uncoded
from coded_shuffle.math.shuffles import cyclic_shuffle
from tests.helpers import deliver

PAPER_S = np.array([[2, 1, 2], [2, 1, 2], [1, 3, 1]])
NO_EXCESS = ("attia-tandon", "cycles")


def assignments_for(shuffle: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An (old, new) pair of assignments with the given shuffle matrix, points in random order."""
    k = shuffle.shape[0]
    old = np.repeat(np.repeat(np.arange(k), k), shuffle.reshape(-1))
    new = np.repeat(np.tile(np.arange(k), k), shuffle.reshape(-1))
    perm = np.random.default_rng(seed).permutation(old.size)
    return old[perm], new[perm]


def test_paper_example_loads_and_bytes():
    """Attia & Tandon 2016, Section V example: uncoded 11, pairs only 7,
    leftover combining 6, bound 6."""
    old, new = assignments_for(PAPER_S)
    uncoded, _ = deliver("uncoded", old, new, 3)
    at, _ = deliver("attia-tandon", old, new, 3)
    cyc, _ = deliver("cycles", old, new, 3)
    assert uncoded.load_points == 11
    assert at.breakdown["pairs"] + leftover_matrix(PAPER_S).sum() == 7
    assert dict(at.breakdown) == {"pairs": 4, "leftovers": 2}
    assert at.load_points == 6 == theorem1_load(PAPER_S)
    assert cyc.load_points == 6
    assert ordering_bound(PAPER_S)[:2] == (6, True)
    assert ignored_worker(leftover_matrix(PAPER_S)) == 0  # ties: lowest id


@pytest.mark.parametrize(("k", "q"), [(2, 3), (3, 4), (5, 2), (8, 3)])
def test_the_cyclic_shift_is_optimal(k, q):
    """Theorem 3: the worst shuffle costs (K-1) N / K, and both schemes reach it."""
    old = random_assignment(k * q, k, np.random.default_rng(k))
    new = cyclic_shuffle(old, k)
    optimum = worst_case_optimum(k * q, k)
    for name in NO_EXCESS:
        plan, _ = deliver(name, old, new, k)
        assert plan.load_points == optimum
    assert ordering_bound(shuffle_matrix(old, new, k))[0] == optimum


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(2, 12), q=st.integers(1, 30), seed=st.integers(0, 2**32 - 1))
def test_random_shuffles_decode_and_loads(k, q, seed):
    """Byte-exact at every worker; Theorem 1 exactly; cycles <= attia-tandon; bound <= load."""
    rng = np.random.default_rng(seed)
    old, new = random_assignment(k * q, k, rng), random_assignment(k * q, k, rng)
    shuffle = shuffle_matrix(old, new, k)
    at, at_delivery = deliver("attia-tandon", old, new, k, seed=seed % 1000)
    cyc, _ = deliver("cycles", old, new, k, seed=seed % 1000)
    assert at.load_points == theorem1_load(shuffle)
    assert cyc.load_points <= at.load_points
    off = shuffle.sum() - np.trace(shuffle)
    assert at.uncoded_points == off
    bound = ordering_bound(shuffle)[0]
    assert bound <= cyc.load_points <= at.load_points <= off
    # short chains: every worker peels in at most K rounds (one block per round and degree)
    assert max(len(p.blocks) for p in at_delivery.programs[0]) <= k


@settings(max_examples=15, deadline=None)
@given(k=st.integers(2, 12), q=st.integers(1, 30), seed=st.integers(0, 2**32 - 1))
def test_plans_are_deterministic(k, q, seed):
    rng = np.random.default_rng(seed)
    old, new = random_assignment(k * q, k, rng), random_assignment(k * q, k, rng)
    for name in (*NO_EXCESS, "best"):
        first = get_scheme(name).plan(get_scheme(name).initial_state(old, k, 1), new)
        again = get_scheme(name).plan(get_scheme(name).initial_state(old, k, 1), new)
        assert first.scheme == again.scheme
        assert len(first.symbols) == len(again.symbols)
        for a, b in zip(first.symbols, again.symbols, strict=True):
            assert np.array_equal(a, b)


def test_cycles_beats_attia_tandon_on_large_random_shuffles():
    """docs/schemes.md (cycles): within 1% of the lower bound where greedy
    gets ~1.5% (K=32, N/K=100)."""
    k, q = 32, 100
    rng = np.random.default_rng(7)
    old, new = random_assignment(k * q, k, rng), random_assignment(k * q, k, rng)
    shuffle = shuffle_matrix(old, new, k)
    cyc = get_scheme("cycles")
    plan = cyc.plan(cyc.initial_state(old, k, 1), new)
    bound = ordering_bound(shuffle)[0]
    assert plan.load_points <= 1.01 * bound
    assert plan.load_points < theorem1_load(shuffle)
    Delivery.prepare(plan, 8)  # proved decodable by the generic decoder


def test_leftover_cycles_are_opened_only_at_the_ignored_worker():
    rng = np.random.default_rng(3)
    old, new = random_assignment(120, 6, rng), random_assignment(120, 6, rng)
    shuffle = shuffle_matrix(old, new, 6)
    pairs, rest = get_scheme("attia-tandon").decompose(shuffle)
    u = ignored_worker(leftover_matrix(shuffle))
    for cycle in rest.cycles():
        assert len(set(cycle.workers)) == len(cycle.workers)  # simple
        assert cycle.opened == (u in cycle.workers)
        if cycle.opened:
            assert cycle.workers[0] == u
    assert np.array_equal((pairs + rest).covered(6), shuffle - np.diag(np.diag(shuffle)))


def test_cycle_symbols_need_an_exact_cover():
    old, new = assignments_for(PAPER_S)
    points, offsets = points_by_pair(old, new, 3)
    pairs, omega = pair_cycles(PAPER_S)
    with pytest.raises(ValueError, match="exactly once"):
        cycle_symbols(pairs, points, offsets, 3)
    symbols = cycle_symbols(pairs + greedy_cycles(omega), points, offsets, 3)
    assert symbols.shape == (6, 2)
    assert Cycle((0, 1, 2), 2, opened=False).symbols == 6
    assert CycleSet.of([Cycle((0, 1, 2), 2, opened=False), Cycle((1, 0), 3)]).symbols == 9


def test_greedy_cycles_refuses_a_non_eulerian_matrix():
    with pytest.raises(ValueError, match="Eulerian"):
        greedy_cycles(np.array([[0, 1], [0, 0]]))


@pytest.mark.parametrize("name", NO_EXCESS)
def test_bad_points_are_a_usage_error(name):
    with pytest.raises(UsageError, match="multiple of workers"):
        get_scheme(name).check(10, 3, 1)
    with pytest.raises(UsageError, match="out of range"):
        get_scheme(name).check(9, 3, 4)


def test_best_takes_the_lowest_load_and_names_it():
    rng = np.random.default_rng(11)
    k, q = 10, 20
    old, new = random_assignment(k * q, k, rng), random_assignment(k * q, k, rng)
    best = get_scheme("best")
    state = best.initial_state(old, k, 1)
    plan = best.plan(state, new)
    loads = {}
    for name in ("uncoded", *NO_EXCESS):
        scheme = get_scheme(name)
        loads[name] = scheme.plan(scheme.initial_state(old, k, 1), new).load_points
    assert plan.load_points == min(loads.values())
    assert plan.scheme.startswith("best:") and loads[plan.scheme[5:]] == plan.load_points
    nxt = best.next_state(state, plan, new)
    assert all(np.array_equal(c, b) for c, b in zip(nxt.caches, plan.new_batches, strict=True))
    Delivery.prepare(plan, 8)


class _OwnFamily(Uncoded):
    """A test-only scheme in a placement family of its own."""

    name = "test-own-family"
    placement = "test-family"


def test_best_takes_candidates_from_the_registry(monkeypatch):
    """A scheme registered elsewhere joins ``best`` through ``applicable``/``placement_family``."""
    assert get_scheme("cycles").placement_family() == "batch"
    assert _OwnFamily.placement_family() == "test-family"
    assert Uncoded.applicable(12, 3, 1) and not Uncoded.applicable(12, 3, 5)
    monkeypatch.setitem(REGISTRY, _OwnFamily.name, _OwnFamily)
    best = Best()
    families = best.families(12, 3, 1)
    names = [set(f) for f in families]
    assert {"uncoded", "attia-tandon", "cycles"} <= names[0]
    assert {"test-own-family"} in names
    # two families: the probe reshuffle decides, and the batch family's cycles win it
    rng = np.random.default_rng(5)
    old, new = random_assignment(60, 3, rng), random_assignment(60, 3, rng)
    state = best.initial_state(old, 3, 1)
    assert set(state.members) == names[0]  # the choice travels in the state
    assert best.plan(state, new).scheme in {"best:attia-tandon", "best:cycles", "best:uncoded"}
    monkeypatch.setattr(_OwnFamily, "applicable", classmethod(lambda cls, n, k, t: False))
    assert all("test-own-family" not in f for f in Best().families(12, 3, 1))


def test_codec_huge_page_buffers_decode_byte_exactly(monkeypatch):
    """The codec's huge-page outputs (normally from 32 MiB on) carry the same bytes."""
    monkeypatch.setattr(buffers, "HUGE_PAGE_BYTES", 1)
    rng = np.random.default_rng(2)
    old, new = random_assignment(600, 6, rng), random_assignment(600, 6, rng)
    out = buffers.empty_rows(600, 40)
    assert out.shape == (600, 40) and out.dtype == torch.uint8
    deliver("cycles", old, new, 6, point_bytes=40)


@pytest.mark.parametrize(("row_bytes", "degree"), [(8, 1), (12, 2), (7, 3)])
def test_run_blocks_scatters_non_contiguous_targets(monkeypatch, row_bytes, degree):
    """Blocks whose targets are not one run of rows, across several chunks."""
    monkeypatch.setattr(ops, "CHUNK_BYTES", 5 * row_bytes)
    rng = np.random.default_rng(row_bytes)
    src = torch.from_numpy(rng.integers(0, 256, (50, row_bytes), dtype=np.uint8))
    dst = torch.zeros((40, row_bytes), dtype=torch.uint8)
    targets = rng.permutation(40)[:23]
    sources = rng.integers(0, 50, (23, degree))
    encode.run_blocks((XorBlock(targets, sources),), src, dst)
    expected = np.zeros((40, row_bytes), dtype=np.uint8)
    expected[targets] = np.bitwise_xor.reduce(src.numpy()[sources], axis=1)
    assert np.array_equal(dst.numpy(), expected)


def test_run_blocks_with_an_unaligned_source():
    """A source viewed at an odd byte offset is XORed as bytes into an aligned output."""
    raw = torch.from_numpy(np.random.default_rng(4).integers(0, 256, 8 * 9 + 1, dtype=np.uint8))
    src = raw[1:].view(9, 8)  # storage offset 1: not viewable as int64
    dst = torch.zeros((4, 8), dtype=torch.uint8)
    encode.run_blocks(
        (XorBlock(np.arange(4), np.array([[0, 1], [2, 3], [4, 5], [6, 8]])),), src, dst
    )
    s = src.numpy()
    assert np.array_equal(dst.numpy(), s[[0, 2, 4, 6]] ^ s[[1, 3, 5, 8]])


def test_best_probe_moves_points_even_for_an_assignment_from_its_seed():
    """Regression: the probe once equalled an assignment drawn from the same seed (load 0)."""
    old = random_assignment(40, 4, np.random.default_rng(PROBE_SEED))
    probe = probe_reshuffle(old)
    assert np.array_equal(np.bincount(probe, minlength=4), np.full(4, 10))
    assert np.trace(shuffle_matrix(old, probe, 4)) < 40
    best = Best()
    assert len(best.families(40, 4, 2.0)) > 1  # the batch family and the excess-storage ones
    state = best.initial_state(old, 4, 2.0)  # with twice the storage, an excess family wins
    assert REGISTRY[state.members[0]].placement_family() != "batch"
