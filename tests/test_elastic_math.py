"""Coded elastic computing (Yang et al. 2018), single process: generator, cyclic usage, group
decoding, events, baselines and the master's loop over simulated workers (P = 6, L = 3 included)."""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coded_shuffle.codec.blockstore import BlockStore
from coded_shuffle.elastic import (
    CyclicUsage,
    GroupCode,
    Membership,
    encode,
    make_problem,
    make_settings,
    parse_events,
    rebalance,
    simulate,
    split_blocks,
    systematic_generator,
    with_fresh_row,
    worst_condition,
)
from coded_shuffle.elastic.cyclic import worker_backward, worker_forward
from coded_shuffle.elastic.membership import Event, initial_holdings
from coded_shuffle.elastic.peers import ring_bytes, simulate_peers
from coded_shuffle.elastic.protocol import LocalChannel
from coded_shuffle.elastic.runner import ElasticMaster
from coded_shuffle.elastic.sinks import ListSink, MemoryCheckpoint
from coded_shuffle.errors import UsageError

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EVENTS_P6 = [{"step": 10, "leave": [2, 4]}, {"step": 25, "join": 1}]


def by_method(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["method"], []).append(r)
    return out


# --- generator ----------------------------------------------------------------------------


@pytest.mark.parametrize(("p", "size"), [(6, 3), (4, 2), (8, 4), (10, 5), (5, 1)])
def test_generator_is_systematic_and_every_subset_well_conditioned(p: int, size: int) -> None:
    gen = systematic_generator(p, size)
    assert np.array_equal(gen.rows[:size], np.eye(size))
    assert gen.exact
    subsets = np.array(list(itertools.combinations(range(p), size)))
    conds = np.linalg.cond(gen.rows[subsets])
    assert np.isclose(conds.max(), gen.worst_condition)
    assert conds.max() < 1e3  # float64 decoding stays far inside 1e-9


def test_gaussian_beats_structured_generators_on_worst_subset() -> None:
    gauss = systematic_generator(8, 4).worst_condition
    for kind in ("cauchy", "vandermonde"):
        assert systematic_generator(8, 4, kind).worst_condition > gauss


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((4, 4), "recovery_threshold L=4 out of range 1..3"),
        ((4, 0), "out of range"),
        ((4, 2, "reed-solomon"), "unknown generator 'reed-solomon'"),
        ((20, 10, "vandermonde", 0, 1e6), "exceeds max_condition"),
    ],
)
def test_generator_bad_input(args: tuple, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        systematic_generator(*args)


def test_fresh_row_keeps_every_subset_well_conditioned() -> None:
    gen = with_fresh_row(with_fresh_row(systematic_generator(6, 3)))
    assert gen.num_rows == 8
    cond, exact = worst_condition(gen.rows, 3)
    assert exact and cond <= gen.worst_condition * (1 + 1e-12)


# --- cyclic usage and the two rounds --------------------------------------------------------


@FAST
@given(
    p=st.integers(2, 8),
    data=st.data(),
    points=st.integers(1, 97),
    features=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_two_rounds_give_exact_xw_and_gradient(
    p: int, data: st.DataObject, points: int, features: int, seed: int
) -> None:
    size = data.draw(st.integers(1, p - 1))
    avail = sorted(data.draw(st.sets(st.integers(0, p - 1), min_size=size, max_size=p)))
    rng = np.random.default_rng(seed)
    X, y, w = (
        rng.standard_normal((points, features)),
        rng.standard_normal(points),
        rng.random(features),
    )
    gen = systematic_generator(p, size, seed=seed)
    blocks = split_blocks(X, size)
    coded = encode(blocks, gen.rows)
    usage = CyclicUsage(len(avail), size, blocks.shape[1])
    code = GroupCode.build(usage, gen.rows[avail])
    used = [coded[s][usage.rows(i)] for i, s in enumerate(avail)]
    xw = code.decode([worker_forward(u, w) for u in used])
    assert np.allclose(xw.reshape(-1)[:points], X @ w, rtol=1e-10, atol=1e-10)
    back = code.reencode(xw - split_blocks(y, size))
    grad = sum(worker_backward(u, r) for u, r in zip(used, back, strict=True))
    exact = X.T @ (X @ w - y)
    assert np.linalg.norm(grad - exact) <= 1e-9 * max(np.linalg.norm(exact), 1e-12)


@FAST
@given(n=st.integers(1, 12), data=st.data(), b=st.integers(1, 200))
def test_cyclic_usage_covers_every_group_exactly_l_times(n: int, data: st.DataObject, b: int):
    size = data.draw(st.integers(1, n))
    u = CyclicUsage(n, size, b)
    for j in range(n):  # group j is used by L distinct positions, each at slot l
        members = u.members[j]
        assert len(set(members)) == size
        assert all(u.usage[m, slot] == j for slot, m in enumerate(members))
    used = u.rows_used()
    assert used.sum() == size * b  # the used data is the original data's size (Theorem 2.1)
    assert used.max() - used.min() <= size
    if b % n == 0:
        assert (used == size * b // n).all()
    rows = u.rows(0)
    assert len(np.unique(rows)) == rows.size == used[0]


def test_fewer_workers_than_threshold_is_refused() -> None:
    with pytest.raises(UsageError, match="fewer than the recovery threshold L=3"):
        CyclicUsage(2, 3, 10)


# --- events and membership -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ([{"step": 40, "leave": [1]}], r"step=40 out of range 0\.\.39"),
        ([{"step": 3}], "needs 'leave' and/or 'join'"),
        ([{"step": 3, "leave": [1], "when": 2}], "unknown keys"),
        ([{"step": 5, "leave": [1]}, {"step": 5, "join": 1}], "increasing steps"),
        ([{"step": 5, "leave": [0]}], "worker ids are integers >= 1"),
        ([{"step": 5, "leave": [2, 2]}], "repeats a worker id"),
        ([{"step": 5, "join": 0}], "join=0 must be >= 1"),
        ("leave 2", "must be a list of events"),
    ],
)
def test_event_parsing_errors(raw: object, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        parse_events(raw, 40)


def test_departures_beyond_p_minus_l_stop_with_a_clear_message() -> None:
    with pytest.raises(UsageError) as err:
        make_settings(6, 3, 30, [{"step": 5, "leave": [1, 2]}, {"step": 9, "leave": [3, 4]}])
    text = str(err.value)
    assert "departure of worker(s) [3, 4] leaves 2 worker(s), fewer than the recovery" in text
    assert "threshold L=3" in text
    assert "at most 1 more departure" in text and "\n" not in text


def test_join_takes_lowest_free_id_and_its_former_row_then_fresh_rows() -> None:
    m = Membership.initial(6, 3)
    m.apply(Event(10, leave=(2, 4)))
    assert m.available == [1, 3, 5, 6]
    (j,) = m.apply(Event(25, join_count=1))
    assert (j.worker, j.row, j.fresh) == (2, 1, False)
    joined = m.apply(Event(30, join_count=3))
    assert [(x.worker, x.row, x.fresh) for x in joined] == [
        (4, 3, False),
        (7, 6, True),
        (8, 7, True),
    ]
    capped = Membership.initial(4, 2, max_workers=4)
    with pytest.raises(UsageError, match=r"exceed the 4 worker processes"):
        capped.apply(Event(3, join_count=1))


@FAST
@given(
    points=st.integers(1, 300),
    p=st.integers(2, 9),
    data=st.data(),
)
def test_rebalance_moves_only_what_it_must(points: int, p: int, data: st.DataObject) -> None:
    ids = list(range(1, p + 1))
    holdings = initial_holdings(points, ids)
    survivors = sorted(data.draw(st.sets(st.sampled_from(ids), min_size=1, max_size=p)))
    joiners = data.draw(st.lists(st.integers(p + 1, p + 4), unique=True, max_size=3))
    available = sorted(survivors + joiners)
    new, sent = rebalance(holdings, available, points)
    held = np.sort(np.concatenate([new[i] for i in available]))
    assert np.array_equal(held, np.arange(points))  # every row once
    sizes = [new[i].size for i in available]
    assert max(sizes) - min(sizes) <= 1
    departed = sum(holdings[i].size for i in ids if i not in survivors)
    moved = sum(s.size for s in sent.values())
    assert moved >= departed
    # fewest moves for balanced targets: only the deficits are filled
    target_low = points // len(available)
    lower = sum(max(0, target_low - holdings.get(i, np.zeros(0)).size) for i in available)
    assert moved <= max(departed, lower) + len(available)
    for i in survivors:  # survivors keep a prefix of what they held
        keep = new[i][: new[i].size - sent[i].size]
        assert np.array_equal(keep, holdings[i][: keep.size])


# --- the master's loop over simulated workers ---------------------------------------------


@pytest.fixture(scope="module")
def p6_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], object]:
    problem = make_problem(360, 20, 6, seed=0, test_points=300)
    s = make_settings(6, 3, 40, EVENTS_P6)
    return simulate(problem, s, tmp_path_factory.mktemp("p6")), problem


def test_p6_l3_coded_gradient_is_exact_at_every_step(p6_run) -> None:
    runs = by_method(p6_run[0])["coded"]
    assert len(runs) == 40
    assert max(r["grad_rel_error"] for r in runs) < 1e-9
    assert [r["workers_available"] for r in runs] == [6] * 10 + [4] * 15 + [5] * 15


def test_p6_l3_coded_loss_matches_no_failure(p6_run) -> None:
    runs = by_method(p6_run[0])
    coded = np.array([r["train_loss"] for r in runs["coded"]])
    clean = np.array([r["train_loss"] for r in runs["nofailure"]])
    assert np.allclose(coded, clean, rtol=1e-12, atol=0)
    assert coded[-1] < 0.5 * coded[0]  # it does descend


def test_p6_l3_rows_used_per_worker_are_n_over_n(p6_run) -> None:
    for r in by_method(p6_run[0])["coded"]:
        n = r["workers_available"]
        assert r["rows_used_max"] == r["rows_used_min"] == 360 // n


def test_p6_l3_event_bytes(p6_run) -> None:
    runs = by_method(p6_run[0])
    coded = {r["step"]: r for r in runs["coded"]}
    assert coded[10]["events"] == ["leave 2,4"] and coded[10]["moved_bytes"] == 0
    block = 120 * 20 * 8  # one coded block: N/L rows x d float64
    assert coded[25]["events"] == ["join 1"]
    assert coded[25]["moved_bytes"] == block + 24 + 5 * 8  # plus header and STORE ints
    assert sum(r["moved_bytes"] for r in runs["coded"]) == coded[25]["moved_bytes"]
    assert coded[0]["placement_bytes"] == 6 * (block + 64)
    re = {r["step"]: r for r in runs["repartition"]}
    row = (20 + 2) * 8  # [id, x, y]
    assert re[10]["moved_bytes"] >= 120 * row  # the 120 rows of workers 2 and 4 are re-sent
    assert re[25]["moved_bytes"] >= 72 * row  # the joiner gets N/5 rows
    assert max(r["grad_rel_error"] for r in runs["repartition"]) < 1e-9


def test_p6_l3_ignore_diverges_from_no_failure(p6_run) -> None:
    runs = by_method(p6_run[0])
    ignore = np.array([r["train_loss"] for r in runs["ignore"]])
    clean = np.array([r["train_loss"] for r in runs["nofailure"]])
    assert np.allclose(ignore[:10], clean[:10], rtol=1e-12)
    assert (ignore[12:25] > 1.1 * clean[12:25]).all()  # visibly off while rows are missing
    assert min(r["grad_rel_error"] for r in runs["ignore"][10:25]) > 0.1
    assert ignore[-1] > clean[-1]


def test_records_carry_the_promised_keys(p6_run) -> None:
    keys = {"step", "workers_available", "train_loss", "grad_rel_error", "rows_used_max"}
    keys |= {"moved_bytes", "step_seconds", "method", "events", "comm_bytes", "test_loss"}
    keys |= {"compute_seconds", "decode_seconds", "comm_seconds"}
    for r in p6_run[0]:
        assert set(r) >= keys
        parts = r["compute_seconds"] + r["decode_seconds"] + r["comm_seconds"]
        assert parts == pytest.approx(r["step_seconds"]) or r["comm_seconds"] == 0
        assert r["compute_seconds"] > 0 and r["decode_seconds"] > 0
        json.dumps(r)


def test_p6_l3_test_loss_of_coded_is_the_no_failure_one(p6_run) -> None:
    """The held-out loss (``test_points`` of the same sources): coded equals no failure at
    every step; ignoring the lost part generalises worse by the end."""
    runs, problem = by_method(p6_run[0]), p6_run[1]
    coded = np.array([r["test_loss"] for r in runs["coded"]])
    clean = np.array([r["test_loss"] for r in runs["nofailure"]])
    assert np.allclose(coded, clean, rtol=1e-12, atol=0)
    assert clean[0] == pytest.approx(problem.test_loss(np.zeros(20)))
    assert runs["ignore"][-1]["test_loss"] > clean[-1]


def test_p6_l3_distr_bgd_reuses_the_departed_workers_last_gradients(p6_run) -> None:
    """Elastic Distr-BGD: exact before the departure; afterwards the departed parts enter
    with their last (stale) partial gradients, so every row is counted but the gradient is
    off, unlike ``ignore`` (rows missing); a joiner takes one part back."""
    runs = by_method(p6_run[0])
    bgd, clean = runs["distr_bgd"], runs["nofailure"]
    assert np.allclose(
        [r["train_loss"] for r in bgd[:11]], [r["train_loss"] for r in clean[:11]], rtol=1e-12
    )
    assert max(r["grad_rel_error"] for r in bgd[:10]) < 1e-9
    assert all(r["rows_total"] == 360 for r in bgd)  # stale parts still count their rows
    assert min(r["grad_rel_error"] for r in bgd[11:25]) > 1e-6  # stale, not exact
    assert all(r["rows_total"] < 360 for r in runs["ignore"][10:25])
    assert [r["workers_available"] for r in bgd] == [6] * 10 + [4] * 15 + [5] * 15


class KillAt(ListSink):
    """A sink that kills simulated workers after the record of a given step."""

    def __init__(self, transport: LocalChannel, plan: dict[int, int]) -> None:
        super().__init__()
        self.transport, self.plan = transport, plan

    def write(self, record: dict) -> None:
        super().write(record)
        if record["step"] in self.plan:
            self.transport.kill(self.plan.pop(record["step"]))


def run_with_kills(tmp_path: Path, p: int, size: int, steps: int, kills: dict[int, int]):
    problem = make_problem(120, 6, p, seed=3)
    s = make_settings(p, size, steps, methods=["coded", "nofailure"])
    ckpt, sink = MemoryCheckpoint(), None
    restarts = 0
    while True:
        transport = LocalChannel(tmp_path)
        if sink is None:
            sink = KillAt(transport, dict(kills))
        sink.transport = transport
        try:
            ElasticMaster(problem, s, transport, sink, ckpt).run()
            return sink.records, restarts, transport
        except Exception as exc:  # a lost worker ends this master, as in the real job
            if type(exc).__name__ != "WorkerLost":
                raise
            restarts += 1


def test_simulated_kill_resumes_with_survivors_and_their_stored_blocks(tmp_path: Path) -> None:
    records, restarts, transport = run_with_kills(tmp_path, 4, 2, 16, {5: 3})
    assert restarts == 1
    assert 3 not in transport.nodes  # the resumed master never talks to the lost worker
    runs = by_method(records)
    coded = runs["coded"]
    assert [r["step"] for r in coded] == list(range(16))  # nothing lost, nothing repeated
    assert [r["workers_available"] for r in coded] == [4] * 6 + [3] * 10
    assert coded[6]["events"] == ["lost 3 (process died, job restarted)"]
    assert all(r["moved_bytes"] == 0 for r in coded)  # survivors reuse their blocks
    assert max(r["grad_rel_error"] for r in coded) < 1e-9
    clean = [r["train_loss"] for r in runs["nofailure"]]
    assert np.allclose([r["train_loss"] for r in coded], clean, rtol=1e-12)
    assert [r["workers_available"] for r in runs["nofailure"]] == [3] * 16  # 3 stays lost


class History(MemoryCheckpoint):
    """Keeps every saved state, to restart from any of them."""

    def __init__(self) -> None:
        super().__init__()
        self.history: list[dict] = []

    def save(self, state: dict) -> None:
        super().save(state)
        self.history.append(self.load())


def test_corrupted_store_is_detected_and_resent(tmp_path: Path) -> None:
    problem = make_problem(60, 4, 4, seed=1)
    s = make_settings(4, 2, 3, methods=["coded"])
    ckpt = History()
    ElasticMaster(problem, s, LocalChannel(tmp_path), ListSink(), ckpt).run()
    assert ckpt.state["finished"]
    block = tmp_path / "worker_2" / "coded.npy"
    arr = np.load(block)
    arr[0, 0] += 1.0
    np.save(block, arr)
    assert BlockStore(tmp_path / "worker_2").load("coded") is None  # its digest differs
    ckpt.state = next(h for h in ckpt.history if h.get("step") == 1)  # restart after step 0
    sink = ListSink()
    ElasticMaster(problem, s, LocalChannel(tmp_path), sink, ckpt).run()
    assert [r["step"] for r in sink.records] == [1, 2]
    assert sink.records[0]["moved_bytes"] == 30 * 4 * 8 + 24 + 5 * 8  # worker 2's block again
    assert max(r["grad_rel_error"] for r in sink.records) < 1e-9


def test_finished_or_foreign_checkpoint_starts_afresh(tmp_path: Path) -> None:
    problem = make_problem(60, 4, 4, seed=1)
    ckpt = History()
    s = make_settings(4, 2, 3, methods=["coded"])
    ElasticMaster(problem, s, LocalChannel(tmp_path), ListSink(), ckpt).run()
    ckpt.state = ckpt.history[1]  # unfinished, but of another configuration
    sink = ListSink([{"method": "coded", "step": 0}])
    other = make_settings(4, 2, 4, methods=["coded"])
    ElasticMaster(problem, other, LocalChannel(tmp_path), sink, ckpt).run()
    assert [r["step"] for r in sink.records] == [0, 1, 2, 3]
    assert sink.records[0]["placement_bytes"] == 0  # the stores were already right
    assert all(r["restarts"] == 0 for r in sink.records)


def test_real_losses_below_threshold_stop_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="fewer than the recovery threshold L=2"):
        run_with_kills(tmp_path, 4, 2, 12, {2: 3, 4: 1, 6: 2})


def test_joins_beyond_p_use_fresh_rows_and_stay_exact(tmp_path: Path) -> None:
    problem = make_problem(240, 5, 4, seed=2)
    s = make_settings(4, 2, 8, [{"step": 3, "join": 2}], methods=["coded"])
    coded = simulate(problem, s, tmp_path)
    assert [r["workers_available"] for r in coded] == [4] * 3 + [6] * 5
    assert coded[3]["rows_used_max"] == 240 // 6
    assert coded[3]["moved_bytes"] == 2 * (120 * 5 * 8 + 64)
    assert max(r["grad_rel_error"] for r in coded) < 1e-9


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"workers": 1}, "workers P=1 must be an integer >= 2"),
        ({"recovery_threshold": 6}, r"L=6 out of range 1\.\.5"),
        ({"steps": 0}, "job.steps=0"),
        ({"methods": ["coded", "magic"]}, "job.elastic.methods"),
        ({"generator": "rs"}, "job.elastic.generator='rs'"),
    ],
)
def test_settings_bad_input(kwargs: dict, match: str) -> None:
    args = {"workers": 6, "recovery_threshold": 3, "steps": 10, **kwargs}
    with pytest.raises(UsageError, match=match):
        make_settings(**args)


def test_problem_bad_input() -> None:
    with pytest.raises(UsageError, match=r"sources=7 out of range 1\.\.5"):
        make_problem(5, 2, 7)
    with pytest.raises(UsageError, match=r"job\.lr=-1"):
        make_problem(20, 2, 2).step_size(-1.0)


def test_line_search_descends_and_keeps_coded_equal_to_no_failure(tmp_path: Path) -> None:
    """``line_search``: every step satisfies Armijo's condition (the full loss drops); coded
    takes the same steps as no failure (its gradient is exact); not slower than the fixed
    ``1/smoothness`` step."""
    problem = make_problem(240, 8, 4, seed=5, test_points=100)
    events = [{"step": 3, "leave": [2]}, {"step": 7, "join": 1}]
    fixed = make_settings(4, 2, 12, events, ["nofailure"])
    searched = make_settings(4, 2, 12, events, ["coded", "nofailure"], line_search=True)
    runs = by_method(simulate(problem, searched, tmp_path / "a"))
    base = simulate(problem, fixed, tmp_path / "b")
    coded, clean = runs["coded"], runs["nofailure"]
    assert [r["lr"] for r in coded] == pytest.approx([r["lr"] for r in clean], rel=1e-12)
    losses = [r["train_loss"] for r in clean]
    assert all(b < a for a, b in itertools.pairwise(losses))
    assert any(r["lr"] > 1.0 / problem.smoothness for r in clean)  # it does take longer steps
    assert losses[-1] <= base[-1]["train_loss"]


@settings(max_examples=10, deadline=None)
@given(p=st.integers(3, 6), data=st.data())
def test_master_free_gradient_is_exact_and_equals_the_master_mode(p: int, data) -> None:
    """Sec. 3.3: all-gather, decoding at every worker, all-reduce: the exact gradient at every
    step under random departures, the same steps as the master mode's coded run."""
    size = data.draw(st.integers(1, p - 1))
    gone = data.draw(st.lists(st.integers(1, p), unique=True, max_size=p - size))
    events = [{"step": 2, "leave": gone}] if gone else None
    problem = make_problem(12 * p, 5, p, seed=p)
    s = make_settings(p, size, 5, events, ["coded"])
    gen = systematic_generator(p, size, s.generator, s.seed, s.max_condition)
    lr = problem.step_size(None)
    peers = simulate_peers(problem, gen, size, 5, s.events, lr)
    assert max(r["grad_rel_error"] for r in peers) < 1e-9
    assert [r["workers_available"] for r in peers] == [p, p] + [p - len(gone)] * 3
    with tempfile.TemporaryDirectory() as root:
        master = simulate(problem, s, root)
    assert [r["workers_available"] for r in master] == [r["workers_available"] for r in peers]


def test_ring_bytes_counts_both_collectives() -> None:
    """Ring all-gather: each of ``n`` workers receives ``n - 1`` vectors; ring all-reduce:
    ``2 (n - 1)`` chunks of ``d / n`` per worker."""
    assert ring_bytes(4, 10, 8) == 8 * (4 * 3 * 10 + 2 * 3 * 8)
    assert ring_bytes(1, 10, 8) == 0
