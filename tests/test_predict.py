"""``coded-shuffle predict`` and the cost model it evaluates (``coded_shuffle.costs``): the
planned bytes are the bytes ``evaluate`` encodes, each transport's seconds follow its formula
on each topology, large ``N`` is planned on fewer points and scaled, and bad values are one
line each. (Measured against the emulated cluster: ``scripts/bench_transport.py --predict``.)"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.costs import model, wire
from coded_shuffle.costs.model import Network, Reach, Traffic
from coded_shuffle.distributed.transports import REGISTRY, transport_cost
from coded_shuffle.tools import cli, predict
from coded_shuffle.tools.predict import Workload, planned_load

MB = 10**6
ROWS = [name for name, cls in REGISTRY.items() if not cls.own_symbols]  # carry rows
PEERS = [name for name, cls in REGISTRY.items() if cls.own_symbols]  # carry their own symbols


def seconds(transport: str, stream: float, traffic: Traffic, net: Network, reach=None) -> float:
    """The transport's own price of a delivery (``Transport.cost``)."""
    return transport_cost(transport).seconds(stream, traffic, net, reach)


def master_bytes(transport: str, stream: float, workers: int) -> float:
    return transport_cost(transport).master_bytes(stream, workers)


@pytest.mark.parametrize(
    ("scheme", "storage"), [("cycles", 1.0), ("attia-tandon", 1.0), ("uncoded", 1.0)]
)
def test_the_planned_bytes_are_the_bytes_evaluate_encodes(scheme, storage):
    """Same seed, same shuffles: the prediction's R_c and R_u are ``evaluate``'s framed
    broadcast and uncoded bytes (which it encodes, decodes and verifies)."""
    from coded_shuffle.tools.evaluate import Evaluation, run

    k, n, b = 6, 600, 1000
    (report,) = run(Evaluation(scheme, k, n, storage, epochs=1, seed=3, point_bytes=b))
    load = planned_load(Workload(k, n, b, storage, scheme, seed=3))
    assert report.verified
    assert load.traffic.coded_bytes == report.broadcast_bytes
    assert load.planned_points == n
    assert math.isclose(load.load_points, report.load_points)
    assert math.isclose(load.uncoded_points, report.uncoded_points)


def test_a_large_n_is_planned_on_fewer_points_and_scaled(monkeypatch):
    exact = planned_load(Workload(8, 8 * 400, 2004))
    monkeypatch.setattr(predict, "PLAN_POINTS", 8 * 100)
    scaled = planned_load(Workload(8, 8 * 400, 2004))
    assert scaled.planned_points == 800
    t, e = scaled.traffic, exact.traffic
    assert abs(t.uncoded_bytes / e.uncoded_bytes - 1) < 0.03
    # fewer points per worker: a higher coded share (the output calls it an upper bound)
    assert t.coded_bytes / t.uncoded_bytes > e.coded_bytes / e.uncoded_bytes - 0.01


SWITCH = Network("switch", 400e6, 400e6, mtu=9000, frame=14)


def test_each_transport_follows_its_formula_on_a_switch():
    k, rc, ru = 4, 15 * MB, 30 * MB
    traffic, over, b = Traffic(k, rc, ru), SWITCH.overhead_seconds, 50e6  # bytes/s
    tcp = SWITCH.tcp
    assert tcp(8948) == 8948 + 66 and tcp(8949) == 8949 + 2 * 66  # segments of MTU - 52
    assert seconds("unicast", ru, traffic, SWITCH) == pytest.approx(tcp(ru) / b + over)
    p2p = tcp(ru / k) / b + over + (k - 1) * SWITCH.peer_seconds
    assert seconds("p2p", ru, traffic, SWITCH) == pytest.approx(p2p)
    chain = tcp(rc) / b + (k - 1) * tcp(SWITCH.mtu) / b + over
    assert seconds("chain", rc, traffic, SWITCH) == pytest.approx(chain)
    assert seconds("tree", rc, traffic, SWITCH) == pytest.approx(3 * tcp(rc) / b + over)
    d = wire.default_datagram_bytes(9000)
    sent = math.ceil(rc / d) * wire.wire_bytes(wire.DGRAM_HEADER_BYTES + d, 9000)
    multicast = sent / (model.PACE_SHARE * b) + over
    assert seconds("multicast", rc, traffic, SWITCH) == pytest.approx(multicast)
    assert [master_bytes(x, rc, k) for x in ("p2p", "tree", "chain")] == [0, 3 * rc, rc]


def test_a_shared_medium_carries_every_hosts_sends_and_an_uplink_slows_the_master():
    k, rc = 8, 10 * MB
    traffic = Traffic(k, rc, 2 * rc)
    shared = Network("shared", 400e6, 400e6, mtu=9000, frame=14)
    one = shared.tcp(rc) / 50e6
    # a chain pays every relay's copy: K links per byte unless told how far messages reach
    assert seconds("chain", rc, traffic, shared) == pytest.approx(shared.tcp(k * rc) / 50e6 + 0.02)
    reach = seconds("chain", rc, traffic, shared, Reach(2.5, (1, 1), (4, 1)))
    assert reach == pytest.approx(shared.tcp(2.5 * rc) / 50e6 + 0.02)
    assert seconds("tree", rc, traffic, shared) == pytest.approx(k * one + 0.02)
    assert seconds("multicast", rc, traffic, shared) == seconds("multicast", rc, traffic, SWITCH)
    uplink = Network("uplink", 400e6, 100e6, mtu=9000, frame=14)
    assert seconds("unicast", rc, traffic, uplink) == pytest.approx(4 * one + 0.02)
    assert seconds("p2p", rc, traffic, uplink) == seconds("p2p", rc, traffic, SWITCH)


def test_a_master_faster_than_its_workers_streams_at_the_workers_rate():
    """Multicast and chain from a fast master: the receivers' NICs set the pace."""
    k, rc = 4, 10 * MB
    traffic = Traffic(k, rc, 2 * rc)
    fast = Network("switch", 100e6, 400e6, mtu=9000, frame=14)
    slow = Network("switch", 100e6, 100e6, mtu=9000, frame=14)
    for transport in ("multicast", "chain"):
        assert seconds(transport, rc, traffic, fast) == seconds(transport, rc, traffic, slow)
    assert seconds("multicast", rc, traffic, fast) > fast.datagrams(rc) / (100e6 / 8)


def test_an_uneven_cluster_is_priced_by_the_receivers_it_waits_for():
    """One worker's NIC at half the others' (a switch at 400 Mbit/s): unicast still waits for
    the master's NIC (the slow worker's quarter fits its half rate); p2p for the slow worker's
    own share; multicast paces every datagram for the slowest receiver."""
    k, rc, ru = 4, 15 * MB, 30 * MB
    traffic = Traffic(k, rc, ru)
    even = Network("switch", 400e6, 400e6)
    slow = replace(even, worker_rates=(200e6, 400e6, 400e6, 400e6))
    tcp, over, half = even.tcp, even.overhead_seconds, 25e6
    assert seconds("unicast", ru, traffic, slow) == seconds("unicast", ru, traffic, even)
    p2p = tcp(ru / k) / half + (k - 1) * even.peer_seconds + over
    assert seconds("p2p", ru, traffic, slow) == pytest.approx(p2p)
    multicast = seconds("multicast", rc, traffic, even) - over
    assert seconds("multicast", rc, traffic, slow) == pytest.approx(2 * multicast + over)
    assert slow.relay_order(k) == (2, 3, 4, 1) and slow.receivers(k)[-1] == half


@pytest.mark.parametrize(("kept", "units"), [(0.4, 1.0), (0.5, 1.0), (0.7, 1.4)])
def test_a_receiver_aware_multicast_waits_for_the_master_or_what_a_slow_worker_keeps(kept, units):
    """What each worker keeps known (a plan's reach): the slow worker (half rate, relayed
    last) takes only the bytes it keeps, at its rate; the stream takes the longer of the
    master's link (every datagram, ``1`` unit) and the slow worker's (twice its share)."""
    k, rc = 4, 15 * MB
    slow = Network("switch", 400e6, 400e6, worker_rates=(400e6, 400e6, 400e6, 200e6))
    every, share = (True,) * 10, (True,) * round(10 * kept) + (False,) * round(10 - 10 * kept)
    reach = Reach(4.0, (rc // 10,) * 10, (4,) * 10, (every,) * 3 + (share,))
    unit = slow.datagrams(rc) / (slow.pace_share * 50e6)
    got = seconds("multicast", rc, Traffic(k, rc, 2 * rc), slow, reach) - slow.overhead_seconds
    assert got == pytest.approx(units * unit, rel=1e-3)


@pytest.mark.parametrize(("apart", "units"), [(False, 1.0), (True, 1.2)])
def test_more_slow_workers_than_lanes_share_one_priced_by_what_either_keeps(apart, units):
    """Five of six workers at half rate, four lanes (``SLOW_LANES``): workers 4 and 5 share
    one, which takes what either keeps at half rate (the same 30% of the stream: 0.6 of the
    master's time; 30% each apart: 1.2); the stream takes the longer of that and the master's
    link (``1`` unit)."""
    k, rc = 6, 15 * MB
    slow = Network("switch", 400e6, 400e6, worker_rates=(200e6,) * 5 + (400e6,))
    assert slow.relay_order(k) == (6, 1, 2, 3, 4, 5)
    first, last = (True,) * 3 + (False,) * 7, (False,) * 7 + (True,) * 3
    fifth = last if apart else first
    reach = Reach(6.0, (rc // 10,) * 10, (6,) * 10, ((True,) * 10,) + (first,) * 4 + (fifth,))
    unit = slow.datagrams(rc) / (slow.pace_share * 50e6)
    got = seconds("multicast", rc, Traffic(k, rc, 2 * rc), slow, reach) - slow.overhead_seconds
    assert got == pytest.approx(units * unit, rel=1e-3)


@pytest.mark.parametrize(("ends", "units"), [((4, 3), 2), ((3, 4), 3), ((3, 3), 2)])
def test_a_chain_moves_each_message_at_the_slowest_link_it_crosses(ends, units):
    """Two messages of ``m`` bytes; the last link (to the slow host, relayed last) at half
    the others' rate. What reaches the slow host first overlaps the rest (two units of
    ``m`` at the fast rate); what reaches it last starts there once the first message has
    passed, and takes two units more; nothing for it: the fast links alone."""
    k, m = 4, 5 * MB
    slow = Network("switch", 400e6, 400e6, worker_rates=(400e6, 400e6, 400e6, 200e6))
    reach = Reach(3.5, (m, m), ends)
    fast, frames = 50e6, (k - 1) * slow.tcp(1500) / 25e6
    expected = units * m / fast * slow.tcp(2 * m) / (2 * m) + frames + slow.overhead_seconds
    got = seconds("chain", 2 * m, Traffic(k, 2 * m, 2 * m), slow, reach)
    assert got == pytest.approx(expected)


def test_chain_links_follow_how_far_each_message_is_kept():
    """An uncoded stream ordered by worker: a message reaches the worker that keeps it, about
    (K + 1) / 2 links per byte; a coded one reaches further (its symbols serve two)."""
    from coded_shuffle.tools.predict import Workload, planned_load

    coded = planned_load(Workload(8, 8 * 2000, 2004, chunk_bytes=8192), chain=True).traffic
    assert 4.0 < coded.uncoded_reach.links < 5.0
    assert coded.uncoded_reach.links < coded.coded_reach.links <= 8
    assert planned_load(Workload(8, 8 * 2000, 2004)).traffic.coded_reach is None


def test_the_cost_models_constants_are_the_transports_defaults():
    from coded_shuffle.tools.cluster.run import MULTICAST_SHARE

    assert MULTICAST_SHARE == model.PACE_SHARE


@settings(max_examples=15, deadline=None)
@given(
    k=st.integers(2, 24),
    q=st.integers(1, 30),
    b=st.integers(1, 5000),
    topology=st.sampled_from(["switch", "shared", "uplink"]),
)
def test_every_prediction_is_positive_and_names_the_best_uncoded(k, q, b, topology):
    net = Network(topology, 1e9, 1e8 if topology == "uplink" else 1e9)
    rows = predict.predict(Workload(k, k * q, b), net)
    assert len(rows) == 8 and all(r.seconds > 0 and math.isfinite(r.seconds) for r in rows)
    assert min(r.vs_best_uncoded for r in rows if r.delivery == "uncoded") == 1.0
    coded = {r.transport: r for r in rows if r.delivery == "coded"}
    uncoded = {r.transport: r for r in rows if r.delivery == "uncoded"}
    for x in ("chain", "multicast", "tree"):  # fewer bytes, no more seconds
        if topology == "shared" and x == "chain":
            continue  # a coded message may reach further down the chain (more medium per byte)
        if coded[x].master_bytes <= uncoded[x].master_bytes:
            assert coded[x].seconds <= uncoded[x].seconds + 1e-12


def test_the_command_prints_every_row_and_a_verdict(capsys):
    argv = [
        "predict",
        "-K",
        "8",
        "-N",
        "8000",
        "-B",
        "2004",
        "--rate",
        "400mbit",
        "--topology",
        "shared",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("predicted delivery seconds of one epoch: K = 8, N = 8,000")
    assert sum(line.split()[0] in ("coded", "uncoded") for line in out[3:11]) == 8
    assert out[11].startswith("fastest: coded over multicast")
    assert out[12].startswith("why: on one shared medium")
    assert cli.main([*argv, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 8 and {r["topology"] for r in rows} == {"shared"}
    assert {"delivery", "transport", "seconds", "master_bytes", "coded_bytes"} <= set(rows[0])


def test_a_partial_reshuffle_moves_its_fraction_and_p2p_wins_on_a_switch(capsys):
    """``--fraction Q``: the uncoded load is about ``Q`` times a full one's (the moved
    points that land with another worker) and coding still halves it; on a switch at small
    ``K`` the verdict is uncoded p2p, with the reason docs/benchmarks.md gives."""
    full = planned_load(Workload(4, 4000, 500))
    part = planned_load(Workload(4, 4000, 500, fraction=0.25))
    assert part.uncoded_points == pytest.approx(0.25 * full.uncoded_points, rel=0.05)
    assert 0.4 < part.load_points / part.uncoded_points < 0.6
    argv = [
        "predict",
        "-K",
        "4",
        "-N",
        "4000",
        "-B",
        "500",
        "--rate",
        "1gbit",
        "--fraction",
        "0.25",
        "--peer-seconds",
        "0",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert "partial reshuffle Q = 0.25" in out[0]
    assert out[-3].startswith("fastest: uncoded over p2p")
    assert out[-2].startswith("why: the workers reach each other over a switch")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-K", "0"], "--workers 0 out of range 1..4096"),
        (["-N", "1001"], "points (1001) must be a multiple of workers (4)"),
        (["-B", "0"], "--point-bytes 0 out of range (must be >= 1)"),
        (["--rate", "9x"], "--rate '9x' cannot be parsed"),
        (["--master-rate", "1bit"], "--master-rate '1bit' is below 8kbit"),
        (["--topology", "ring"], "topology 'ring' unknown; valid: switch, shared, uplink"),
        (["--topology", "uplink"], "topology uplink needs --master-rate below --rate"),
        (["--scheme", "nope"], "unknown scheme 'nope'; valid:"),
        (["-T", "9"], "--storage 9 out of range 1..4"),
        (["--mtu", "100"], "mtu 100 out of range 576..65535"),
        (["--peer-seconds", "-1"], "peer seconds -1 out of range [0, 60)"),
        (["--fraction", "1.5"], "--fraction=1.5 out of range (0, 1]"),
        (["--host-rate", "5=1gbit"], "--host-rate 5=...: host 5 out of range 1..4"),
        (["--host-rate", "0=1gbit"], "host 0 out of range 1..4 (host 0 is the master"),
        (["--host-rate", "2"], "--host-rate '2': expected HOST=RATE"),
        (["--host-rate", "2=9x"], "--host-rate '9x' cannot be parsed"),
    ],
)
def test_impossible_values_are_one_line_each(args, message, capsys):
    base = {"-K": "4", "-N": "1000", "-B": "100", "--rate": "1gbit"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["predict", *[x for kv in base.items() for x in kv]]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("topology", model.TOPOLOGIES)
@pytest.mark.parametrize("transport", ROWS)
def test_every_transport_on_every_topology_follows_the_cost_model(transport, topology):
    """The cost model written out here, per transport and topology (docs/transports.md,
    "Predictions"): ``b`` the workers' bytes/s, ``bm`` the master's, ``K = 4``, ``R`` the
    stream. A model that priced ``p2p`` on a shared medium as on a switch fails here."""
    k, stream = 4, 12 * MB
    master_rate = 100e6 if topology == "uplink" else 400e6
    net = Network(topology, 400e6, master_rate, mtu=1500, frame=38)
    b, bm = 400e6 / 8, master_rate / 8
    first = min(b, bm)
    tcp, over, peer = net.tcp, net.overhead_seconds, net.peer_seconds
    rounds = 3  # ceil(log2(K + 1)): gloo's binomial tree over the master and 4 workers
    shared = topology == "shared"
    expected = {
        "multicast": net.datagrams(stream) / (model.PACE_SHARE * first),
        "unicast": tcp(stream) / first if shared else max(tcp(stream) / bm, tcp(stream / k) / b),
        "p2p": (tcp(stream) if shared else tcp(stream / k)) / b + (k - 1) * peer,
        "chain": tcp(k * stream) / b if shared else tcp(stream) / first + (k - 1) * tcp(1500) / b,
        "tree": rounds * tcp(stream) / first + (k - rounds) * tcp(stream) / b
        if shared
        else rounds * tcp(stream) / first,
    }[transport]
    traffic = Traffic(k, stream, stream)
    assert seconds(transport, stream, traffic, net) == pytest.approx(expected + over)


@pytest.mark.parametrize("topology", model.TOPOLOGIES)
@pytest.mark.parametrize("transport", PEERS)
def test_the_peer_transports_follow_the_cost_model(transport, topology):
    """The workers send at their own rate whatever the master's: ``peer-multicast`` each
    datagram once plus a feedback round per worker's stream, ``peer-unicast`` as ``p2p``."""
    k, stream = 4, 12 * MB
    master_rate = 50e6 if topology == "uplink" else 400e6
    net = Network(topology, 400e6, master_rate, mtu=1500, frame=38)
    b, over = 400e6 / 8, net.overhead_seconds
    expected = {
        "peer-multicast": net.datagrams(stream) / (model.PACE_SHARE * b)
        + k * net.peer_stream_seconds,
        "peer-unicast": net.tcp(stream if topology == "shared" else stream / k) / b
        + (k - 1) * net.peer_seconds,
    }[transport]
    traffic = Traffic(k, stream, stream)
    assert seconds(transport, stream, traffic, net) == pytest.approx(expected + over)
    assert master_bytes(transport, stream, k) == 0


def test_a_decentralized_row_where_the_workers_store_more_than_their_batch(capsys):
    """``T = 2``: the decentralized delivery over both peer transports, its coded bytes half
    of what every symbol to each keeper takes; ``T = 1``: no such row (nothing to code)."""
    argv = [
        "predict",
        "-K",
        "4",
        "-N",
        "4000",
        "-B",
        "2004",
        "--rate",
        "200mbit",
        "--master-rate",
        "50mbit",
        "--topology",
        "shared",
        "--json",
    ]
    assert cli.main([*argv, "-T", "2", "--scheme", "attia-tandon-excess"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    peers = {r["transport"]: r for r in rows if r["delivery"] == "decentralized"}
    assert set(peers) == set(PEERS)
    assert all(r["master_bytes"] == 0 for r in peers.values())
    fastest = min(rows, key=lambda r: r["seconds"])
    assert (fastest["delivery"], fastest["transport"]) == ("decentralized", "peer-multicast")
    assert cli.main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert not [r for r in rows if r["delivery"] == "decentralized"]
