"""``coded-shuffle predict --job``: a whole run's seconds, epoch by epoch, for the job and its
alternatives (coded_shuffle/tools/predict_job.py, coded_shuffle/costs/run.py)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from dataclasses import replace

import pytest

from coded_shuffle.costs.model import Network
from coded_shuffle.costs.run import (
    CPU_OVERLAP,
    PACED_CPU_OVERLAP,
    Compute,
    Training,
    allreduce_seconds,
    delivery,
    digest_seconds,
    training,
)
from coded_shuffle.distributed.transports import transport_cost
from coded_shuffle.math.mixing import expected_mixing
from coded_shuffle.math.policies import ShufflePolicy
from coded_shuffle.tools.cli import main
from coded_shuffle.tools.predict_job import (
    JobRun,
    Option,
    coverage_min,
    network,
    options,
    predict_job,
)

DIGITS_JOB = ["scheme=uncoded", "dist.transport=unicast", "epochs=3"]


@pytest.fixture
def job() -> JobRun:
    """A 1 GB reshuffle-bound job (the shape of docs/benchmarks.md's), compute made up."""
    k, n, b = 4, 124_936, 8004
    return JobRun(
        workers=k,
        epochs=6,
        scheme="cycles",
        storage=1.0,
        transport="multicast",
        shuffle="full",
        fraction=1.0,
        points=n,
        point_bytes=b,
        chunk_bytes=256 << 10,
        multicast_rate=None,
        training=Training(k, n, b, 1000, 20_010, True, 512, 0),
        compute=Compute(0.002, 2e-6, 0.55, 2),
    )


@pytest.fixture(scope="module")
def digits_rows() -> list[dict]:
    """The default job (digits, MLP) on a shared 4 Mbit/s medium, as --json rows."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            [
                "predict",
                "--job",
                "--rate",
                "4mbit",
                "--medium",
                "shared",
                "--json",
                "--",
                *DIGITS_JOB,
            ]
        )
    assert code == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_every_row_has_the_promised_keys_and_one_fastest(digits_rows):
    assert len(digits_rows) >= 10
    for row in digits_rows:
        assert {"scheme", "transport", "shuffle", "seconds", "epoch_seconds", "fastest"} <= set(row)
        assert 0 < row["coverage_min"] <= 1 and 0 <= row["label_tv_max"] <= 1
        assert row["shuffle"] in ("full", "partial", "none")
        assert len(row["epoch_seconds"]) == 3
        assert row["seconds"] == pytest.approx(sum(row["epoch_seconds"]))
        assert all(s > 0 for s in row["epoch_seconds"])
    assert sum(r["fastest"] for r in digits_rows) == 1
    fastest = next(r for r in digits_rows if r["fastest"])
    assert fastest["seconds"] == min(r["seconds"] for r in digits_rows)
    (mine,) = [r for r in digits_rows if r["job"]]
    assert (mine["scheme"], mine["transport"], mine["shuffle"]) == ("uncoded", "unicast", "full")


def test_the_alternatives_are_every_option_the_issue_names(digits_rows):
    found = {(r["scheme"], r["transport"], r["shuffle"]) for r in digits_rows}
    for transport in ("multicast", "chain", "tree"):
        assert ("cycles", transport, "full") in found
    for transport in ("unicast", "p2p", "multicast"):
        assert ("uncoded", transport, "full") in found
    assert ("cycles", "multicast", "partial") in found
    assert ("uncoded", "unicast", "partial") in found
    assert ("uncoded", "unicast", "none") in found


def test_the_digits_run_on_a_shared_medium_is_all_reduce_bound(digits_rows):
    """23 steps of a 4,810-parameter gradient all-reduce on 4 Mbit/s: ~6.4 s an epoch, as
    the cluster measured (docs/benchmarks.md: 28.8 s to the end of epoch 4 uncoded)."""
    (mine,) = [r for r in digits_rows if r["job"]]
    assert 5.5 < mine["epoch_seconds"][1] < 8.5


def test_coded_multicast_beats_uncoded_on_a_shared_medium_when_reshuffles_dominate(job):
    net = network("shared", "400mbit", None, 1500, job)
    runs = {r.option: r for r in predict_job(job, net)}
    coded = runs[Option("cycles", "multicast", "full")]
    unicast = runs[Option("uncoded", "unicast", "full")]
    assert coded.job
    assert coded.deliveries[1].seconds < 0.75 * unicast.deliveries[1].seconds
    # the placement is common: both go by unicast, each point to its worker
    assert coded.deliveries[0].seconds == pytest.approx(unicast.deliveries[0].seconds)
    assert coded.seconds < unicast.seconds


def test_every_epoch_is_its_delivery_plus_the_same_training_and_end(job):
    """Blocking: an epoch's delivery, then its training and end. Prefetching: an epoch after
    the placement between the longer of its delivery and the rest, and their sum."""
    blocking = replace(job, prefetch=False)
    net = network("switch", "1gbit", None, 1500, blocking)
    for r in predict_job(blocking, net):
        rest = r.train.seconds + r.end.seconds
        assert [e - d.seconds for e, d in zip(r.epoch_seconds, r.deliveries, strict=True)] == (
            pytest.approx([rest] * job.epochs)
        )
    for r in predict_job(job, network("switch", "1gbit", None, 1500, job)):
        rest = r.train.seconds + r.end.seconds
        for e, d in zip(r.epoch_seconds[1:], r.deliveries[1:], strict=True):
            assert max(d.seconds, rest) - 1e-9 <= e <= d.seconds + rest + 1e-9


def test_more_epochs_cost_more_and_none_moves_nothing_after_the_placement(job):
    net = network("shared", "400mbit", None, 1500, job)
    short = {r.option: r.seconds for r in predict_job(replace(job, epochs=2), net)}
    long = {r.option: r.seconds for r in predict_job(job, net)}
    assert all(long[o] > short[o] for o in short)
    none = next(r for r in predict_job(job, net) if r.option.shuffle == "none")
    # no byte after the placement: the fixed cost of a delivery, and the batches' digests
    assert all(d.network == net.overhead_seconds for d in none.deliveries[1:])
    assert none.deliveries[1].cpu == pytest.approx(digest_seconds(job.training, job.compute))


def test_a_shared_medium_carries_every_workers_ring_share():
    switch = Network("switch", 4e6, 4e6)
    shared = Network("shared", 4e6, 4e6)
    payload = 1e6
    ratio = allreduce_seconds(payload, 4, shared) / allreduce_seconds(payload, 4, switch)
    assert ratio == pytest.approx(4, rel=0.02)
    assert allreduce_seconds(payload, 1, shared) == 0


def test_local_sgd_averages_every_h_steps_and_at_the_epochs_end():
    net = Network("switch", 1e8, 1e8)
    c = Compute(0.0, 0.0, 0.5, 2)
    every_step = training(Training(4, 4000, 100, 10, 1000, True, 10, 0), net, c)  # 100 steps
    local = training(Training(4, 4000, 100, 10, 1000, True, 10, 30), net, c)  # 30, 60, 90, 100
    one = allreduce_seconds(4 * 1000, 4, net)
    assert every_step.network == pytest.approx(100 * one)
    assert local.network == pytest.approx(4 * allreduce_seconds(8 * 1000, 4, net))


def test_a_cpu_bound_delivery_takes_its_cpu_seconds_and_the_rest_of_the_network(job):
    """The digests of a 1 GB set at 4 s per GB: 4 s at the master, 2 s for the workers on
    2 cores, against 1 s of network."""
    training = replace(job.training, points=10**6, point_bytes=1000)
    c = Compute(0.0, 0.0, 4.0, 2)
    part = delivery(1.0, transport_cost("unicast"), training, c)
    assert part.cpu == pytest.approx(4.0 + 2.0)
    assert part.seconds == pytest.approx(6.0 + (1 - CPU_OVERLAP) * 1.0)
    paced = delivery(1.0, transport_cost("multicast"), training, c)  # its sender's NIC idles less
    assert paced.seconds == pytest.approx(6.0 + (1 - PACED_CPU_OVERLAP) * 1.0)


@pytest.mark.parametrize(
    ("shuffle", "q", "expected"),
    [
        ("full", 1.0, 1 - 0.75**6),  # docs/benchmarks.md measured 0.821
        ("partial", 0.25, 1 - 0.75 * (1 - 0.25 / 4) ** 5),  # measured 0.457
        ("none", 1.0, 0.25),  # measured 0.250
    ],
)
def test_the_expected_coverage_is_what_the_runs_measured(shuffle, q, expected):
    got = coverage_min(Option("cycles", "multicast", shuffle, q), 4, 6)
    assert got == pytest.approx(expected)
    assert math.isclose(round(got, 3), {"full": 0.822, "partial": 0.457, "none": 0.25}[shuffle])


@pytest.mark.parametrize(
    ("shuffle", "q", "placement", "coverage", "tv"),
    [  # measured: docs/benchmarks.md (1 GB, random placement) and the digits runs (by_label)
        ("full", 1.0, "random", 0.821, 0.006),
        ("partial", 0.25, "random", 0.457, 0.009),
        ("none", 1.0, "random", 0.250, 0.010),
    ],
)
def test_the_simulated_mixing_is_what_the_runs_measured(shuffle, q, placement, coverage, tv):
    """The reshuffle-bound runs (``K = 4``, 124,936 points, ten classes, 6 epochs): the job's
    own assignments on labels in the classes' shares give the measured figures."""
    got = expected_mixing([0.1] * 10, 124_936, 4, ShufflePolicy(shuffle, q), placement, 6)
    assert got["coverage_min"] == pytest.approx(coverage, abs=0.005)
    assert got["label_tv_max"] == pytest.approx(tv, abs=0.01)


def test_skewed_shards_stay_skewed_without_a_reshuffle_and_mix_with_one():
    """``data.placement=by_label`` (the digits runs: 0.710 at every epoch under ``none``,
    0.312 after 4 epochs of ``partial`` 0.25, 0.05-0.08 under ``full``)."""
    shares = [0.1] * 10

    def tv(policy: ShufflePolicy, epochs: int) -> float:
        return expected_mixing(shares, 1436, 4, policy, "by_label", epochs)["label_tv_max"]

    assert tv(ShufflePolicy("none"), 4) == pytest.approx(0.71, abs=0.02)
    assert tv(ShufflePolicy("partial", 0.25), 4) == pytest.approx(0.312, abs=0.03)
    assert tv(ShufflePolicy("full"), 4) < 0.1


def test_storage_above_one_adds_the_workers_own_delivery(job):
    stored = replace(job, storage=2.0, scheme="uncoded", transport="tree", points=12_000)
    found = options(stored)
    assert Option("decentralized", "peer-multicast", "full") in found
    assert Option("decentralized", "peer-unicast", "full") in found
    assert found[0] == Option("uncoded", "tree", "full")  # the job's own, first when not listed
    net = network("shared", "200mbit", "50mbit", 1500, stored)
    runs = {r.option: r for r in predict_job(stored, net)}
    peer = runs[Option("decentralized", "peer-multicast", "full")]
    exchange = runs[Option("decentralized", "peer-unicast", "full")]
    assert peer.deliveries[1].network < 0.7 * exchange.deliveries[1].network


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "4"], "--workers does not go with --job"),
        (["--storage", "2"], "--storage does not go with --job: the job's overrides give it"),
        (["--topology", "uplink"], "--topology does not go with --job: --medium and --master-rate"),
        (["--medium", "ring"], "--medium 'ring' unknown; valid: switch, shared"),
        (["--", "epochs=0"], "epochs=0 out of range"),
        (["--", "scheme=nope"], "unknown scheme 'nope'"),
        (["--", "job=elastic_gd"], "job=elastic_gd: only the shuffle_sgd job's runs are priced"),
    ],
)
def test_bad_input_is_one_line(args, message, capsys):
    head = ["predict", "--job", "--rate", "4mbit"]
    rest = args if "--" in args else [*args, "--", *DIGITS_JOB]
    assert main([*head, *rest]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_medium_goes_with_job_only(capsys):
    args = ["predict", "-K", "4", "-N", "400", "-B", "64", "--rate", "1gbit", "--medium", "shared"]
    assert main(args) == 2
    assert "--medium goes with --job" in capsys.readouterr().err


def test_predict_without_job_still_needs_the_cluster_sizes(capsys):
    assert main(["predict", "--rate", "4mbit", "--workers", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "predict needs --points, --point-bytes (or --job -- OVERRIDES" in err


@pytest.mark.parametrize(
    ("overrides", "paced"),
    [
        (["dist.transport=chain"], []),
        (["dist.transport=multicast"], ["dist.multicast.rate=49.5mbit"]),
        (["dist.transport=multicast", "dist.multicast.rate=30mbit"], []),
        (
            ["dist.transport=peer-multicast"],
            ["dist.multicast.rate=198mbit", "dist.multicast.master_rate=49.5mbit"],
        ),
    ],
)
def test_multicast_is_paced_as_the_cluster_command_paces_it(overrides, paced):
    """predict --job and the cluster command add the same pacing (the slowest sender's NIC
    at 99%): the master's 50 Mbit/s for multicast, the workers' 200 for peer-multicast."""
    from coded_shuffle.tools.cluster.run import pacing_overrides

    assert pacing_overrides(overrides, [200_000_000] * 3, 50_000_000) == paced


def test_multicast_on_uneven_workers_is_paced_per_receiver():
    """One worker at half the others' NIC: the master's stream at the fast workers' rate, each
    worker's own pace beside it (the slow one hears only what it keeps); peer-multicast, whose
    workers send, at the slowest's; the stream's pace alone, as a pricing takes it."""
    from coded_shuffle.tools.cluster.run import multicast_pace, pacing_overrides

    rates = [400_000_000, 200_000_000, 400_000_000]
    assert pacing_overrides(["dist.transport=multicast"], rates, 400_000_000) == [
        "dist.multicast.rate=396mbit",
        "dist.multicast.receiver_rates=[396mbit,198mbit,396mbit]",
    ]
    assert multicast_pace(["dist.transport=multicast"], rates, 400_000_000) == 396_000_000
    assert multicast_pace(["dist.transport=peer-multicast"], rates, 400_000_000) == 198_000_000
    given = ["dist.transport=multicast", "dist.multicast.rate=30mbit"]
    assert multicast_pace(given, rates, 400_000_000) is None
    assert multicast_pace(["dist.transport=unicast"], rates, 400_000_000) is None
    assert pacing_overrides(["dist.transport=peer-multicast"], rates, 400_000_000) == [
        "dist.multicast.rate=198mbit",
        "dist.multicast.master_rate=198mbit",
    ]


def test_predict_job_paces_for_the_workers_the_job_has(job, monkeypatch, capsys):
    """Every worker's NIC given faster than ``--rate``: peer-multicast is priced at the
    slowest of those workers' pace (99% of 400 Mbit/s), not at ``--rate``'s."""
    import coded_shuffle.tools.predict_job as priced

    stored = replace(job, scheme="decentralized", storage=2.0, transport="peer-multicast")
    monkeypatch.setattr(priced, "profile_job", lambda overrides: stored)
    seen, paced = [], priced.paced
    monkeypatch.setattr(priced, "paced", lambda net, j: seen.append(j) or paced(net, j))
    hosts = [a for k in range(1, job.workers + 1) for a in ("--host-rate", f"{k}=400mbit")]
    args = ["predict", "--job", "--rate", "100mbit", *hosts, "--json"]
    assert main([*args, "--", "dist.transport=peer-multicast"]) == 0, capsys.readouterr().err
    assert [j.multicast_rate for j in seen] == ["396mbit"]


@pytest.mark.parametrize(
    ("overrides", "rates", "order"),
    [
        ([], {1: 400, 2: 200, 3: 400}, ["dist.chain.order=[1,3,2]"]),  # the job's default
        (["dist.transport=chain"], {1: 100, 2: 400, 3: 200}, ["dist.chain.order=[2,3,1]"]),
        (["dist.transport=chain"], {1: 400, 2: 400, 3: 400}, []),  # even: the default order
        (["dist.chain.order=[3,2,1]"], {1: 400, 2: 200, 3: 400}, []),  # the user's
        (["dist.transport=multicast"], {1: 400, 2: 200, 3: 400}, []),  # nothing relays
    ],
)
def test_the_cluster_orders_a_chain_fastest_first(overrides, rates, order):
    """On an uneven cluster the chain relays through the slow hosts last (inside it, a slow
    host would slow every hop after it), unless the overrides give an order."""
    from coded_shuffle.tools.cluster.run import relay_overrides

    assert relay_overrides(overrides, rates) == order


def test_the_cluster_paces_multicast_per_worker_and_a_chain_slow_host_last():
    """``--host-rate 1=200mbit`` on a 400 Mbit/s cluster: multicast paced at 99% of the fast
    NICs, and of each worker's own (the slow one hears only what it keeps), a chain ordered
    slow host last."""
    from coded_shuffle.tools.cluster.netns import Cluster
    from coded_shuffle.tools.cluster.run import training_overrides

    cluster = Cluster(5, 400_000_000, None, host_rates={1: 200_000_000})
    paced, _ = training_overrides(["dist.transport=multicast", "hydra.run.dir=x"], cluster)
    assert "dist.multicast.rate=396mbit" in paced
    assert "dist.multicast.receiver_rates=[198mbit,396mbit,396mbit,396mbit]" in paced
    relayed, _ = training_overrides(["hydra.run.dir=x"], cluster)
    assert "dist.chain.order=[2,3,4,1]" in relayed
