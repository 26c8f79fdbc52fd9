"""``coded-shuffle predict --job``: the seconds of a whole training run, epoch by epoch, for the
job that ``coded-shuffle cluster ... -- OVERRIDES`` would run and for every alternative a
user would weigh it against (docs/command.md, "The verdict for a run").

The job's shape and its compute come from ``python -m coded_shuffle_train --profile OVERRIDES`` (the
job's own config, the model's step timed on this machine); the loads from the schemes' plans on a
random reshuffle (:func:`~coded_shuffle.tools.predict.planned_load`); the seconds from each
transport's own cost (``Transport.cost``) and the run's model (:mod:`coded_shuffle.costs.run`)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from coded_shuffle.costs.model import BACKGROUND_SHARE, PACE_SHARE, Network, Traffic
from coded_shuffle.costs.rates import format_rate, parse_rate
from coded_shuffle.costs.run import (
    Compute,
    Part,
    Training,
    delivery,
    epoch_end,
    epoch_seconds,
    training,
)
from coded_shuffle.costs.wire import framed_bytes
from coded_shuffle.distributed.transports import REGISTRY, transport_cost
from coded_shuffle.errors import UsageError
from coded_shuffle.math.mixing import expected_mixing
from coded_shuffle.math.policies import ShufflePolicy
from coded_shuffle.tools.predict import Load, Workload, planned_load

MEDIA = ("switch", "shared")
DEFAULT_FRACTION = (
    0.25  # shuffle=partial's default Q (coded_shuffle_train/conf/shuffle/partial.yaml)
)
MASTER_SCHEMES_AT_T1 = "cycles"  # the coded alternative where the job's scheme is uncoded


@dataclass(frozen=True)
class Option:
    """One way to run the job: who codes, over what, and how much of each batch moves."""

    scheme: str
    transport: str
    shuffle: str  # full | partial | none
    fraction: float = 1.0  # Q of a partial reshuffle

    @property
    def label(self) -> str:
        policy = f"partial{self.fraction:g}" if self.shuffle == "partial" else self.shuffle
        return f"{policy}/{self.scheme}/{self.transport}"


@dataclass
class PricedRun:
    """An option's seconds: every epoch's parts and their sum."""

    option: Option
    deliveries: list[Part]  # one per epoch (the first: the placement)
    train: Part
    end: Part
    coverage_min: float
    label_tv_max: float
    job: bool = False
    fastest: bool = False
    prefetch: bool = True  # every epoch's delivery beside the training before it
    epoch_seconds: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        t, e = self.train, self.end
        rest = Part(t.network + e.network, t.cpu + e.cpu, t.seconds + e.seconds)
        self.epoch_seconds = epoch_seconds(self.deliveries, rest, self.prefetch)

    @property
    def seconds(self) -> float:
        return sum(self.epoch_seconds)

    @property
    def network_seconds(self) -> float:
        per_epoch = self.train.network + self.end.network
        return sum(d.network for d in self.deliveries) + per_epoch * len(self.deliveries)

    @property
    def cpu_seconds(self) -> float:
        per_epoch = self.train.cpu + self.end.cpu
        return sum(d.cpu for d in self.deliveries) + per_epoch * len(self.deliveries)


@dataclass(frozen=True)
class JobRun:
    """The job's profile (``python -m coded_shuffle_train --profile``) as the pricing reads it."""

    workers: int
    epochs: int
    scheme: str
    storage: float
    transport: str
    shuffle: str
    fraction: float
    points: int
    point_bytes: int
    chunk_bytes: int
    multicast_rate: str | None
    training: Training
    compute: Compute
    seed: int = 0
    placement: str = "random"
    label_shares: tuple[float, ...] = (1.0,)
    prefetch: bool = True  # dist.prefetch
    background_share: float = BACKGROUND_SHARE  # dist.multicast.background_share

    @property
    def option(self) -> Option:
        return Option(self.scheme, self.transport, self.shuffle, self.fraction)


def profile_job(overrides: Sequence[str]) -> JobRun:
    """The job's profile from its own config (one line on a bad override)."""
    return job_from_profile(profile_of(overrides))


def profile_of(overrides: Sequence[str]) -> dict:
    """``python -m coded_shuffle_train --profile OVERRIDES``'s JSON object (one line on a bad
    override)."""
    out = subprocess.run(
        [sys.executable, "-m", "coded_shuffle_train", "--profile", *overrides],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        lines = (out.stderr.strip() or out.stdout.strip() or "invalid config").splitlines()
        raise UsageError(lines[-1].removeprefix("python -m coded_shuffle_train: error: "))
    return json.loads(out.stdout.strip().splitlines()[-1])


def job_from_profile(profile: dict) -> JobRun:
    """The job as the pricing reads it, from its profile (``python -m coded_shuffle_train
    --profile``'s JSON object, or one recorded beside measured runs)."""
    p = {**profile, "label_shares": tuple(profile["label_shares"])}
    training = Training(**fields_of(Training, p))
    compute = Compute(**fields_of(Compute, p))
    return JobRun(**fields_of(JobRun, p), training=training, compute=compute)


def fields_of(cls: type, profile: dict) -> dict:
    """The profile's values of ``cls``'s fields (those a dataclass nests are built apart; a
    field a recorded profile lacks keeps its default)."""
    nested = {"training", "compute"}
    return {
        f.name: profile[f.name]
        for f in dataclasses.fields(cls)
        if f.name not in nested and f.name in profile
    }


def check_cluster(medium: str, rate: str, master_rate: str | None, mtu: int) -> Network:
    """The cluster ``coded-shuffle cluster --rate --medium --master-rate --mtu`` builds (one
    line on a bad value), multicast paced as that command paces it."""
    if medium not in MEDIA:
        raise UsageError(f"--medium {medium!r} unknown; valid: {', '.join(MEDIA)}")
    r = parse_rate(rate, "--rate")
    rm = parse_rate(master_rate, "--master-rate") if master_rate else r
    topology = "shared" if medium == "shared" else ("uplink" if rm < r else "switch")
    net = Network(topology, float(r), float(rm), mtu=mtu, pace_share=PACE_SHARE)
    net.check()
    return net


def network(medium: str, rate: str, master_rate: str | None, mtu: int, job: JobRun) -> Network:
    """:func:`check_cluster`'s network, :func:`paced` for the job."""
    return paced(check_cluster(medium, rate, master_rate, mtu), job)


def paced(net: Network, job: JobRun) -> Network:
    """``net`` with multicast paced as the job's ``dist.multicast.rate`` says, where it says
    so."""
    if not job.multicast_rate:
        return net
    pace = parse_rate(job.multicast_rate, "dist.multicast.rate")
    # what the cost paces for: the slowest worker's NIC, and the master's where it sends
    nic = net.slowest(job.workers) * 8
    if REGISTRY[job.transport].routing != "peers":
        nic = min(nic, net.master_rate)
    return replace(net, pace_share=min(1.0, pace / nic))


def options(job: JobRun) -> list[Option]:
    """The job's own option and every alternative: coded over each broadcast, uncoded
    ``unicast``/``p2p``/``multicast``, ``partial`` coded and uncoded, ``none``, and with
    storage ``T > 1`` the workers' own decentralized delivery."""
    coded = job.scheme
    if coded in ("uncoded", "decentralized"):
        coded = MASTER_SCHEMES_AT_T1 if job.storage == 1 else "best"
    q = job.fraction if job.shuffle == "partial" else DEFAULT_FRACTION
    found = [Option(coded, x, "full") for x, c in REGISTRY.items() if "coded" in c.deliveries()]
    found += [Option("uncoded", x, "full") for x in ("unicast", "p2p", "multicast")]
    found += [Option(coded, "multicast", "partial", q)]
    found += [Option("uncoded", x, "partial", q) for x in ("unicast", "p2p")]
    found += [Option("uncoded", "unicast", "none", 1.0)]
    if job.storage > 1:
        found += [Option("decentralized", x, "full") for x in ("peer-multicast", "peer-unicast")]
    if job.option not in found:
        found.insert(0, job.option)
    return found


class Loads:
    """Planned loads, one per (scheme, fraction), shared by the options that need them."""

    def __init__(self, job: JobRun, net: Network) -> None:
        self.job, self.net = job, net
        self._loads: dict[tuple[str, float], Load] = {}

    def get(self, scheme: str, fraction: float) -> Load:
        key = (scheme, fraction)
        if key not in self._loads:
            j = self.job
            workload = Workload(
                workers=j.workers,
                points=j.points,
                point_bytes=j.point_bytes,
                storage=j.storage,
                scheme=scheme,
                chunk_bytes=j.chunk_bytes,
                fraction=fraction,
            )
            chain = self.net.topology == "shared" or bool(self.net.worker_rates)
            order = self.net.relay_order(j.workers)
            self._loads[key] = planned_load(workload, chain, order)
        return self._loads[key]


def placement(option: Option, job: JobRun, net: Network) -> Part:
    """Epoch 1: the master places the data. With storage ``T = 1`` every point goes to one
    worker (``unicast``, whatever the transport); with ``T > 1`` a broadcast transport sends
    the set once, a routed one every worker what it stores (``T`` batches; under
    ``peer-unicast`` every point to every worker: each stores a piece of it)."""
    k, n, b = job.workers, job.points, job.point_bytes
    by, rows = transport_cost("unicast"), n
    if job.storage > 1:
        cost = transport_cost(option.transport)
        by, rows = cost.placement() or by, round(cost.placement_rows(n, job.storage, k))
    stream = framed_bytes(rows, b, job.chunk_bytes)
    traffic = Traffic(workers=k, coded_bytes=stream, uncoded_bytes=stream)
    seconds = by.seconds(stream, traffic, net)  # a chain: every relay forwards
    return delivery(seconds, by, job.training, job.compute)


def reshuffle(option: Option, job: JobRun, net: Network, loads: Loads) -> Part:
    """An epoch after the placement: the option's delivery of a random reshuffle (prefetched
    behind the training where the job prefetches: a paced stream then at
    ``background_share`` of its pace)."""
    if job.prefetch:
        net = net.behind_training(job.background_share)
    cost = transport_cost(option.transport)
    if option.shuffle == "none":  # no byte moves; the batches' digests are still taken
        return delivery(net.overhead_seconds, transport_cost("unicast"), job.training, job.compute)
    if option.scheme == "decentralized":
        p = loads.get("decentralized", 1.0).traffic
        stream, reach = cost.peer_stream(p), None
    else:
        coded = option.scheme != "uncoded"
        p = loads.get(option.scheme if coded else _coded(job), option.fraction).traffic
        stream = p.coded_bytes if coded else p.uncoded_bytes
        reach = p.coded_reach if coded else p.uncoded_reach
    return delivery(cost.seconds(stream, p, net, reach), cost, job.training, job.compute)


def _coded(job: JobRun) -> str:
    """The scheme whose plan gives an uncoded option's bytes (any plan carries both)."""
    return job.scheme if job.scheme not in ("uncoded", "decentralized") else "uncoded"


def mixing(option: Option, job: JobRun) -> dict[str, float]:
    """``coverage_min`` and ``label_tv_max`` after the last epoch, from the job's own
    assignments on labels in its classes' shares (:func:`expected_mixing`)."""
    policy = ShufflePolicy(option.shuffle, option.fraction)
    return expected_mixing(
        job.label_shares, job.points, job.workers, policy, job.placement, job.epochs, job.seed
    )


def coverage_min(option: Option, workers: int, epochs: int) -> float:
    """The expected share of the set every worker has trained on after ``epochs``: a point a
    worker has not seen comes to it in a reshuffle with probability ``Q / K`` (``Q = 1``:
    full; ``none``: never)."""
    q = 0.0 if option.shuffle == "none" else option.fraction
    return 1 - (1 - 1 / workers) * (1 - q / workers) ** (epochs - 1)


def price(
    option: Option, job: JobRun, net: Network, loads: Loads, mixed: dict[str, float]
) -> PricedRun:
    """One option's run: the placement, then the same priced reshuffle every epoch after;
    ``mixed``: its mixing after the last epoch (:func:`mixing`)."""
    deliveries = [placement(option, job, net)]
    if job.epochs > 1:
        deliveries += [reshuffle(option, job, net, loads)] * (job.epochs - 1)
    return PricedRun(
        option=option,
        deliveries=deliveries,
        train=training(job.training, net, job.compute),
        end=epoch_end(job.training, net, job.compute),
        coverage_min=mixed["coverage_min"],
        label_tv_max=mixed["label_tv_max"],
        job=option == job.option,
        prefetch=job.prefetch,
    )


def predict_job(job: JobRun, net: Network) -> list[PricedRun]:
    """Every option priced; the fastest marked. The mixing depends on the shuffle alone:
    one simulation per policy."""
    loads = Loads(job, net)
    found = options(job)
    policies = {(o.shuffle, o.fraction) for o in found}
    mixed = {key: mixing(Option("", "", *key), job) for key in policies}
    runs = [price(o, job, net, loads, mixed[(o.shuffle, o.fraction)]) for o in found]
    min(runs, key=lambda r: r.seconds).fastest = True
    return runs


def render(job: JobRun, net: Network, runs: list[PricedRun]) -> list[str]:
    t, c = job.training, job.compute
    master = net.others()
    sync = "gradients every step" if t.average_every <= 0 else f"local SGD H = {t.average_every}"
    lines = [
        f"predicted run: K = {job.workers}, N = {job.points:,} points of {job.point_bytes} B "
        f"({t.set_gb:.3g} GB), T = {job.storage:g}, {job.epochs} epochs, {t.steps} steps of "
        f"{t.batch_size} per epoch, {t.params:,} parameters, {sync}; {net.topology}, NICs "
        f"{format_rate(net.rate)}{master}, MTU {net.mtu}, multicast paced at "
        f"{net.pace_share:.0%}; "
        + (
            f"every delivery behind the training before it (prefetch; multicast there at "
            f"{job.background_share:.0%} of its pace)"
            if job.prefetch
            else "every delivery after the training before it (no prefetch)"
        ),
        f"compute on this machine: a step {c.step_seconds * 1e3:.3g} ms, {c.cores} cores shared "
        f"by the {job.workers + 1} hosts; per epoch: training {runs[0].train.seconds:.3f} s "
        f"(network {runs[0].train.network:.3f}, CPU {runs[0].train.cpu:.3f}), its end "
        f"{runs[0].end.seconds:.3f} s",
        f"{'run':34s} {'place s':>8s} {'reshuf s':>8s} {'epoch s':>8s} {'to end':>8s} "
        f"{'network':>8s} {'cpu':>8s} {'vs job':>7s} {'coverage':>8s} {'label tv':>8s}",
    ]
    mine = next(r for r in runs if r.job)
    for r in runs:
        mark = ("*" if r.job else " ") + ("<" if r.fastest else " ")
        later = r.deliveries[1].seconds if len(r.deliveries) > 1 else float("nan")
        row = (
            f"{r.option.label:34s} {r.deliveries[0].seconds:8.2f} {later:8.2f} "
            f"{r.epoch_seconds[-1]:8.2f} {r.seconds:8.2f} {r.network_seconds:8.2f} "
            f"{r.cpu_seconds:8.2f} {r.seconds / mine.seconds:7.2f} {r.coverage_min:8.3f} "
            f"{r.label_tv_max:8.3f} {mark}"
        )
        lines.append(row.rstrip())
    lines += verdict(job, runs, mine)
    lines.append(
        "(a prediction: the transports' and the run's cost models, calibrated on the emulated "
        'cluster at MTU 1500; docs/transports.md, "Predicting a run")'
    )
    return lines


def verdict(job: JobRun, runs: list[PricedRun], mine: PricedRun) -> list[str]:
    """The fastest option, and the fastest with a full reshuffle (the same mixing as a
    ``full`` job) against the best uncoded one."""
    best = next(r for r in runs if r.fastest)
    lines = [
        f"fastest: {best.option.label}, {best.seconds:.1f} s to the end of epoch {job.epochs} "
        f"({best.seconds / mine.seconds:.2f}x the job's {mine.seconds:.1f} s; * the job, < the "
        "fastest; coverage, label tv: coverage_min and label_tv_max after the last epoch, "
        "from the job's own assignments)"
    ]
    full = [r for r in runs if r.option.shuffle == "full"]
    uncoded = [r for r in full if r.option.scheme == "uncoded"]
    if full and uncoded:
        top = min(full, key=lambda r: r.seconds)
        base = min(uncoded, key=lambda r: r.seconds)
        lines.append(
            f"fastest with a full reshuffle: {top.option.label}, {top.seconds:.1f} s = "
            f"{top.seconds / base.seconds:.2f}x the best uncoded one ({base.option.label}, "
            f"{base.seconds:.1f} s)"
        )
    return lines


def as_json(job: JobRun, runs: list[PricedRun]) -> list[dict]:
    return [
        {
            "scheme": r.option.scheme,
            "transport": r.option.transport,
            "shuffle": r.option.shuffle,
            "fraction": r.option.fraction,
            "storage": job.storage,
            "seconds": r.seconds,
            "epoch_seconds": r.epoch_seconds,
            "delivery_seconds": [d.seconds for d in r.deliveries],
            "network_seconds": r.network_seconds,
            "cpu_seconds": r.cpu_seconds,
            "coverage_min": r.coverage_min,
            "label_tv_max": r.label_tv_max,
            "job": r.job,
            "fastest": r.fastest,
        }
        for r in runs
    ]


__all__ = [
    "Option",
    "PricedRun",
    "as_json",
    "network",
    "paced",
    "predict_job",
    "profile_job",
    "render",
]
