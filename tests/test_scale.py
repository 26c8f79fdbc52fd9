"""Hundreds of workers (docs/benchmarks.md): the cycle finder and triangle packing above K = 32, the
ordering search's bound, byte-exact deliveries at K = 64 and 128, the excess-storage schemes'
limit, and a command line that loads no torch to list or explain."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.math import bounds
from coded_shuffle.math.assignment import random_assignment, shuffle_matrix
from coded_shuffle.math.schemes import get_scheme
from coded_shuffle.math.schemes.attia_tandon import ignored_worker, theorem1_load
from coded_shuffle.math.schemes.cycle_plan import SMALL_MAX_WORKERS, CycleSet, pair_cycles
from coded_shuffle.math.schemes.cycle_search import shortest_first, triangle_packing
from coded_shuffle.tools.evaluate import Evaluation, run
from tests.helpers import deliver


@st.composite
def eulerian_multigraphs(draw, max_workers: int = 12, max_cycles: int = 30) -> np.ndarray:
    """Arc counts that are a sum of random closed walks (so Eulerian), loops dropped."""
    k = draw(st.integers(2, max_workers))
    counts = np.zeros((k, k), dtype=np.int64)
    for _ in range(draw(st.integers(0, max_cycles))):
        walk = draw(st.lists(st.integers(0, k - 1), min_size=2, max_size=2 * k))
        mult = draw(st.integers(1, 3))
        for a, b in zip(walk, [*walk[1:], walk[0]], strict=True):
            counts[a, b] += mult
    np.fill_diagonal(counts, 0)
    return counts


def check_cover(cycles: CycleSet, counts: np.ndarray) -> None:
    """Only simple cycles of arcs that exist, covering the counts exactly."""
    k = counts.shape[0]
    for cycle in cycles.cycles():
        assert len(cycle.workers) >= 2 and cycle.multiplicity >= 1
        assert len(set(cycle.workers)) == len(cycle.workers), cycle
    assert np.array_equal(cycles.covered(k), counts)


@settings(max_examples=60, deadline=None)
@given(counts=eulerian_multigraphs())
def test_shortest_first_decomposes_every_eulerian_multigraph(counts):
    check_cover(CycleSet.opened_at_first(*shortest_first(counts)), counts)


@settings(max_examples=15, deadline=None)
@given(counts=eulerian_multigraphs(max_workers=60, max_cycles=80))
def test_shortest_first_on_larger_multigraphs(counts):
    workers, lengths, mults = shortest_first(counts)
    check_cover(CycleSet.opened_at_first(workers, lengths, mults), counts)
    # shortest first: no 2-cycle is left once the length-2 class is done
    assert np.all(np.diff(lengths) >= 0)


def test_shortest_first_refuses_what_is_not_eulerian():
    with pytest.raises(ValueError, match="Eulerian"):
        shortest_first(np.array([[0, 1, 0], [0, 0, 1], [0, 0, 0]]))
    with pytest.raises(ValueError, match="square"):
        shortest_first(np.zeros((2, 3), dtype=np.int64))


@settings(max_examples=40, deadline=None)
@given(counts=eulerian_multigraphs(max_workers=20), work=st.integers(0, 20_000))
def test_triangle_packing_takes_only_triangles_that_fit(counts, work):
    triangles, rest = triangle_packing(counts, work)
    k = counts.shape[0]
    free = CycleSet.opened_at_first(*rest).covered(k)
    assert triangles.shape[1] == 3
    assert np.all(free >= 0)
    covered = np.zeros_like(counts)
    for a, b, c in triangles:
        assert len({a, b, c}) == 3
        for x, y in ((a, b), (b, c), (c, a)):
            covered[x, y] += 1
    assert np.array_equal(covered + free, counts)
    assert triangles.size == 0 or triangles.max() < k
    # deterministic: every rank derives the same packing
    again, _ = triangle_packing(counts, work)
    assert np.array_equal(triangles, again)


def random_shuffle(k: int, q: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return shuffle_matrix(random_assignment(k * q, k, rng), random_assignment(k * q, k, rng), k)


@pytest.mark.parametrize(("k", "q"), [(40, 100), (64, 50), (128, 20)])
def test_cycles_above_32_workers_cover_exactly_and_stay_between_the_bounds(k, q):
    assert k > SMALL_MAX_WORKERS
    shuffle = random_shuffle(k, q, k)
    off = shuffle - np.diag(np.diag(shuffle))
    for name in ("cycles", "attia-tandon"):
        pairs, rest = get_scheme(name).decompose(shuffle)
        check_cover(pairs + rest, off)
    pairs, rest = get_scheme("cycles").decompose(shuffle)
    load = (pairs + rest).symbols
    assert bounds.ordering_bound(shuffle)[0] <= load < theorem1_load(shuffle)
    # the leftover has no 2-cycle, so its cycles have 3 arcs or more: at most |Omega| / 3
    _, omega = pair_cycles(shuffle)
    assert rest.multiplicity.sum() <= omega.sum() // 3


def test_attia_tandon_above_32_workers_is_theorem_1_and_opens_at_the_ignored_worker():
    shuffle = random_shuffle(48, 60, 1)
    pairs, rest = get_scheme("attia-tandon").decompose(shuffle)
    _, omega = pair_cycles(shuffle)
    u = ignored_worker(omega)
    for cycle in rest.cycles():
        assert cycle.opened == (u in cycle.workers)
        assert not cycle.opened or cycle.workers[0] == u
    assert pairs.symbols + rest.symbols == theorem1_load(shuffle)


@pytest.mark.parametrize(("k", "q"), [(64, 192), (128, 256)])
@pytest.mark.parametrize("name", ["uncoded", "attia-tandon", "cycles"])
def test_every_scheme_decodes_byte_exactly_at_64_and_128_workers(name, k, q):
    """A few points per pair of workers (``q / K`` = 3 and 2), real bytes, every worker."""
    rng = np.random.default_rng(k + q)
    old, new = random_assignment(k * q, k, rng), random_assignment(k * q, k, rng)
    plan, _ = deliver(name, old, new, k, point_bytes=8)
    assert plan.num_symbols > 0


def test_best_plans_and_verifies_at_128_workers():
    (report,) = run(Evaluation(scheme="best", workers=128, points=128 * 100, point_bytes=8))
    assert report.verified and report.plan_scheme == "best:cycles"
    assert report.lower_bound_points <= report.load_points < report.uncoded_points


@settings(max_examples=12, deadline=None)
@given(k=st.integers(3, 16), q=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_the_searched_bound_is_never_above_the_exact_one(k, q, seed):
    s = bounds.off_diagonal(random_shuffle(k, q, seed))
    exact = bounds.ordering_value(s, bounds._exact_ordering(s))
    order = bounds._search_ordering(s)
    assert sorted(order.tolist()) == list(range(k))
    assert bounds.ordering_value(s, order) <= exact


def test_the_search_budget_grows_like_k_squared():
    assert bounds.search_work(1024) == bounds.SEARCH_WORK_PER_CELL * 1024**2
    assert bounds.search_work(2048) / bounds.search_work(1024) == 4
    assert bounds.search_work(8) == bounds.SEARCH_WORK_MIN


@pytest.mark.parametrize("name", ["elmahdy-mohajer", "attia-tandon-excess"])
def test_the_excess_storage_schemes_refuse_more_than_their_workers_in_one_line(name):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "coded_shuffle.tools.cli",
            "evaluate",
            "--scheme",
            name,
            "-K",
            "64",
            "-N",
            "640",
            "-T",
            "2",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert f"{name}: K=64 workers is above the 32 it plans for" in out.stderr
    assert get_scheme("best").candidates(640, 64, 1.0).keys() == {
        "uncoded",
        "attia-tandon",
        "cycles",
    }


@pytest.mark.parametrize("argv", [["--help"], ["schemes"], ["evaluate", "--help"]])
def test_the_command_line_lists_and_explains_without_torch(argv):
    code = (
        "import sys, runpy; sys.argv = ['coded-shuffle', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('coded_shuffle.tools.cli', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'numba' not in sys.modules, 'numba was imported'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "coded-shuffle" in out.stdout or "cycles" in out.stdout
