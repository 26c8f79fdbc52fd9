"""``coded-shuffle predict``: every transport's delivery seconds for a described cluster, for a
coded and an uncoded epoch (docs/transports.md, "Predictions"). The scheme plans a random
reshuffle (the math layer); the framing (:mod:`coded_shuffle.costs`) and each registered
transport's own cost (``Transport.cost``) turn its load into bytes and seconds.

Where ``N`` is larger than :data:`PLAN_POINTS`, the load is planned on ``N' = K q'`` points
(``q' = PLAN_POINTS // K`` per worker, the same ``K``) and its symbol counts scaled by
``N / N'``: at fewer points per worker the coded share is higher (fewer long cycles), so the
scaled load is an upper bound for the coded delivery (the output says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from coded_shuffle.costs.model import Network, Traffic, chain_reach_of
from coded_shuffle.costs.rates import format_rate
from coded_shuffle.costs.wire import DEFAULT_CHUNK_BYTES, framed_parts_bytes
from coded_shuffle.distributed.transports import REGISTRY
from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import batch_size, random_assignment
from coded_shuffle.math.plan import Plan, byte_parts, plan_load, subpoint_bytes
from coded_shuffle.math.policies import ShufflePolicy
from coded_shuffle.math.schemes import get_scheme

DELIVERIES = ("uncoded", "coded", "decentralized")  # the table's order
PLAN_POINTS = 1 << 17  # largest N planned as it is (K = 256: under a second)
MAX_WORKERS = 4096


@dataclass(frozen=True)
class Workload:
    """The job: ``workers`` K, ``points`` N of ``point_bytes`` B, storage T, the scheme;
    ``fraction`` Q < 1: a partial reshuffle (every worker gives up Q of its batch)."""

    workers: int
    points: int
    point_bytes: int
    storage: float = 1.0
    scheme: str = "cycles"
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    seed: int = 0
    fraction: float = 1.0

    @property
    def policy(self) -> ShufflePolicy:
        return ShufflePolicy("full" if self.fraction == 1 else "partial", self.fraction)

    def check(self) -> None:
        if not 1 <= self.workers <= MAX_WORKERS:
            raise UsageError(f"--workers {self.workers} out of range 1..{MAX_WORKERS}")
        if self.points < 1:
            raise UsageError(f"--points {self.points} out of range (must be >= 1)")
        batch_size(self.points, self.workers)
        if self.point_bytes < 1:
            raise UsageError(f"--point-bytes {self.point_bytes} out of range (must be >= 1)")
        if not 1 <= self.storage <= self.workers:
            raise UsageError(f"--storage {self.storage:g} out of range 1..{self.workers}")
        if self.chunk_bytes < 1:
            raise UsageError(f"--chunk-bytes {self.chunk_bytes} out of range (must be >= 1)")
        self.policy.check("--fraction", "--fraction")


@dataclass(frozen=True)
class Load:
    """One planned epoch, scaled to ``N``: its traffic and where it came from."""

    traffic: Traffic
    load_points: float  # the coded load in points (scaled)
    uncoded_points: float
    planned_points: int  # N' (= N when N <= PLAN_POINTS)


def _last_plan(workload: Workload, name: str, planned: int) -> Plan:
    """Scheme ``name``'s first transition on random shuffles of ``planned`` points (a partial
    reshuffle if ``workload.fraction < 1``; with excess storage ``T > 1`` the second
    transition: its caches change with the deliveries)."""
    k = workload.workers
    scheme = get_scheme(name, workload.point_bytes)
    scheme.check(planned, k, workload.storage)
    scheme.check_point_bytes(k, workload.storage)
    rng = np.random.default_rng(workload.seed)
    new = random_assignment(planned, k, rng)
    state = scheme.initial_state(new, k, workload.storage)
    for epoch in range(2, 3 if workload.storage == 1 else 4):
        if workload.fraction == 1:
            new = random_assignment(planned, k, rng)
        else:
            new = workload.policy.next_assignment(new, workload.seed, epoch, k)
        plan = scheme.plan(state, new)
        state = scheme.next_state(state, plan, new)
    return plan


def planned_load(
    workload: Workload, chain: bool = False, order: Sequence[int] | None = None
) -> Load:
    """The scheme's load on a random reshuffle (:func:`_last_plan`), scaled to ``N``.

    ``chain``: also how far the streams travel down a chain in relay ``order`` (None:
    ``1..K``), coded and uncoded (what a chain costs on a shared medium or with a slow host;
    :func:`~coded_shuffle.costs.model.chain_reach_of`, which decodes every worker's program:
    slower at large ``K``)."""
    workload.check()
    k, n = workload.workers, workload.points
    planned = n if n <= PLAN_POINTS else k * max(1, PLAN_POINTS // k)
    plan = _last_plan(workload, workload.scheme, planned)
    scale = n / planned
    parts = byte_parts(workload.point_bytes, plan.fractions)
    sizes = [subpoint_bytes(b, p.splits) for p, b in zip(plan.plans, parts, strict=True)]
    coded = [round(p.num_symbols * scale) for p in plan.plans]
    uncoded = [round(p.uncoded_points * p.splits * scale) for p in plan.plans]
    uncoded_points = sum(
        p.uncoded_points * f for p, f in zip(plan.plans, plan.fractions, strict=True)
    )
    links = {}
    if chain:
        uncoded_plan = _last_plan(workload, "uncoded", planned)
        links = {
            "coded_reach": chain_reach_of(plan, workload.point_bytes, workload.chunk_bytes, order),
            "uncoded_reach": chain_reach_of(
                uncoded_plan, workload.point_bytes, workload.chunk_bytes, order
            ),
        }
    traffic = Traffic(
        workers=k,
        coded_bytes=framed_parts_bytes(coded, sizes, workload.chunk_bytes),
        uncoded_bytes=framed_parts_bytes(uncoded, sizes, workload.chunk_bytes),
        **links,
    )
    return Load(traffic, plan_load(plan) * scale, uncoded_points * scale, planned)


@dataclass(frozen=True)
class Row:
    delivery: str  # coded | uncoded
    transport: str
    seconds: float
    master_bytes: float
    vs_best_uncoded: float


def peer_load(workload: Workload) -> Load | None:
    """The decentralized scheme's load with the same storage (docs/decentralized.md), where
    the workers can code for each other (``T > 1``) and it plans for these sizes; else None."""
    if workload.storage <= 1:
        return None
    try:
        return planned_load(replace(workload, scheme="decentralized"))
    except UsageError:  # above its K, or sub-points too small: no decentralized row
        return None


def predict(
    workload: Workload, net: Network, load: Load | None = None, peers: Load | None = None
) -> list[Row]:
    """Every (delivery, transport) of the registry that can run: uncoded over every transport
    that carries rows, coded over the broadcasts (unless the scheme is ``uncoded``), and the
    workers' own decentralized delivery over the peer transports (``peers``: its load, where
    there is one); each transport prices its own (``Transport.cost``)."""
    net.check()
    load = load or planned_load(workload, chain=net.topology == "shared")
    t = load.traffic
    streams = {
        "uncoded": (t.uncoded_bytes, t.uncoded_reach),
        "coded": (t.coded_bytes, t.coded_reach),
    }
    if workload.scheme == "uncoded":
        del streams["coded"]
    rows = []
    for d in DELIVERIES:
        for name, cls in REGISTRY.items():
            if d not in cls.deliveries():
                continue
            if d == "decentralized" and peers is not None:
                stream, reach, traffic = cls.cost.peer_stream(peers.traffic), None, peers.traffic
            elif d in streams:
                (stream, reach), traffic = streams[d], t
            else:
                continue
            sec = cls.cost.seconds(stream, traffic, net, reach)
            rows.append(Row(d, name, sec, cls.cost.master_bytes(stream, t.workers), 0.0))
    best = min(r.seconds for r in rows if r.delivery == "uncoded")
    return [replace(r, vs_best_uncoded=r.seconds / best) for r in rows]


def render(
    workload: Workload, net: Network, load: Load, rows: list[Row], peers: Load | None = None
) -> list[str]:
    """The human table and its verdict."""
    t = load.traffic
    master = net.others()
    lines = [
        f"predicted delivery seconds of one epoch: K = {workload.workers}, N = {workload.points:,}"
        f" points of {workload.point_bytes} B, T = {workload.storage:g}, scheme {workload.scheme}"
        + ("" if workload.fraction == 1 else f", partial reshuffle Q = {workload.fraction:g}")
        + ";"
        f" {net.topology}, NICs {format_rate(net.rate)}{master}, MTU {net.mtu}",
        f"load: coded {load.load_points:,.0f} points = {t.coded_bytes / 1e6:,.1f} MB, uncoded "
        f"{load.uncoded_points:,.0f} points = {t.uncoded_bytes / 1e6:,.1f} MB "
        f"(ratio {t.coded_bytes / t.uncoded_bytes:.3f})"
        + (
            f"; planned on a random shuffle of N' = {load.planned_points:,} points "
            f"({load.planned_points // workload.workers} per worker) and scaled (fewer points per "
            "worker code less well: the coded bytes likely overestimate)"
            if load.planned_points != workload.points
            else "; planned on a random shuffle"
        ),
        *(
            [
                f"decentralized (the workers send from their storage T = {workload.storage:g}): "
                f"coded {peers.traffic.coded_bytes / 1e6:,.1f} MB, every symbol to each worker "
                f"keeping it {peers.traffic.uncoded_bytes / 1e6:,.1f} MB"
            ]
            if peers is not None
            else []
        ),
        f"{'delivery':13s} {'transport':14s} {'master MB':>10s} {'seconds':>9s} "
        f"{'vs best uncoded':>15s}",
    ]
    for r in rows:
        lines.append(
            f"{r.delivery:13s} {r.transport:14s} {r.master_bytes / 1e6:10.1f} "
            f"{r.seconds:9.3f} {r.vs_best_uncoded:15.2f}"
        )
    fastest = min(rows, key=lambda r: r.seconds)
    best_uncoded = min((r for r in rows if r.delivery == "uncoded"), key=lambda r: r.seconds)
    if fastest.delivery != "uncoded":
        verdict = (
            f"fastest: {fastest.delivery} over {fastest.transport}, {fastest.seconds:.3f} s = "
            f"{fastest.vs_best_uncoded:.2f}x the fastest uncoded ({best_uncoded.transport}, "
            f"{best_uncoded.seconds:.3f} s)"
        )
    else:
        verdict = f"fastest: uncoded over {fastest.transport}, {fastest.seconds:.3f} s"
    # where only the master holds data
    master = [r for r in rows if REGISTRY[r.transport].routing != "peers"]
    coded = [r for r in master if r.delivery == "coded"]
    if coded:
        best_coded = min(coded, key=lambda r: r.seconds)
        best_master = min((r for r in master if r.delivery == "uncoded"), key=lambda r: r.seconds)
        verdict += (
            f"; from the master alone: coded over {best_coded.transport} takes "
            f"{best_coded.seconds / best_master.seconds:.2f}x uncoded over {best_master.transport}"
        )
    lines.append(verdict)
    lines.append(why(net, fastest))
    lines.append(
        "(a prediction from the transports' cost models: network-bound, "
        f"{net.overhead_seconds * 1e3:g} ms fixed per delivery, p2p {net.peer_seconds * 1e3:g} "
        "ms per peer (--peer-seconds), both calibrated on the emulated cluster; "
        "docs/transports.md)"
    )
    return lines


def why(net: Network, fastest: Row) -> str:
    """The verdict's reason, the one docs/benchmarks.md draws from the time-to-accuracy runs:
    coding pays where several receivers' flows share one link."""
    if fastest.delivery == "decentralized":
        return (
            "why: the workers hold the data between them (storage T > 1): each sends what it "
            "stores, coded for several peers at once, and the master's link is out of the "
            "reshuffle"
        )
    if fastest.delivery == "coded":
        if net.topology == "shared":
            return (
                "why: on one shared medium every flow crosses the same link, and one coded "
                "symbol serves several workers: no uncoded exchange, p2p included, carries "
                "fewer bytes"
            )
        return (
            "why: only the master's link is shared here, and p2p's per-peer cost "
            "(--peer-seconds) outweighs its parallel links at this K"
        )
    if REGISTRY[fastest.transport].routing == "peers":
        return (
            "why: the workers reach each other over a switch: each one's own downlink bounds "
            "any reshuffle, and p2p's exchange (every NIC at once, nothing from the master) "
            "meets that bound; coding cannot beat it here"
        )
    return f"why: the uncoded delivery over {fastest.transport} has the fewest bytes to move"


def as_json(workload: Workload, net: Network, load: Load, rows: list[Row]) -> list[dict]:
    """One object per row, with the workload and the load beside it."""
    head = {
        **asdict(workload),
        "topology": net.topology,
        "rate_bits": net.rate,
        "master_rate_bits": net.master_rate,
        "mtu": net.mtu,
        "coded_bytes": load.traffic.coded_bytes,
        "uncoded_bytes": load.traffic.uncoded_bytes,
        "load_points": load.load_points,
        "uncoded_points": load.uncoded_points,
        "planned_points": load.planned_points,
    }
    return [{**head, **asdict(r)} for r in rows]
