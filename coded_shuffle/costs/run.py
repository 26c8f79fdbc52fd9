"""A whole run's seconds, epoch by epoch, on the clock of ``metrics.jsonl``'s
``elapsed_seconds`` (docs/transports.md, "Predicting a run").

An epoch of the training job is its delivery, the workers' training on their batches, and
the end of the epoch (worker 0's parameters to the master, its test evaluation, the records).
Without prefetch they follow each other; with it (``dist.prefetch``, the job's default) epoch
``e + 1``'s delivery runs beside epoch ``e``'s training and end (:func:`together`: the longer
of the two, unless together they need the cores or the link for longer). Every part is a
network-bound share (bytes over the busiest link, :mod:`.model`) and a CPU-bound one (seconds
of the CPU work on the cores that the hosts share):

* **delivery**: the transport's network seconds (its :class:`~.model.Cost`) and the CPU's for
  the digests (the master hashes every batch with SHA-256, every worker its own): the larger
  of the two, plus the part of the smaller that does not overlap it (``1 -``
  :data:`CPU_OVERLAP`). A run without a reshuffle (``none``) still pays the digests;
* **training**: every step's compute (the model's step timed on this machine, the workers
  sharing its cores), reading the batch's records (:data:`READ_SECONDS_PER_GB`), the time a
  step holds its worker besides (``debug.step_delay``: an accelerator's, neither CPU nor
  network here) and the gradients' ring all-reduce: its bytes (``2 (K - 1)`` shares of the
  gradients on a shared medium, ``2 (K - 1) / K`` per NIC on a switch) and its latency,
  :data:`SYNC_PHASE_SECONDS` for every one of its ``2 (K - 1)`` phases (a message to the next
  worker and its answer, through the hosts' schedulers and NICs); with local SGD (``H >= 1``)
  the parameters and momentum averaged every ``H`` steps and at the epoch's end;
* **end of epoch**: worker 0's parameters to the master and the test forward.

Every constant here was fitted on one set of measured runs and is checked on another
(``docs/measured_runs.json``, ``scripts/fit_run_model.py``, docs/benchmarks.md "Predicting a
run"); a change of a third to any of them makes the fitted runs' predictions worse, and
without any one of them some run is beyond 15% (``tests/test_predict_runs.py``).

No torch: the compute figures come in a :class:`Compute` (``python -m coded_shuffle_train
--profile`` measures them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from coded_shuffle.costs.model import Cost, Network

# the share of a delivery's CPU seconds (its digests) that overlaps its network seconds, and
# a paced sender's (multicast's: its NIC idles less while it is descheduled); fitted, as every
# constant here, by `scripts/fit_run_model.py` on the `fit` runs of docs/measured_runs.json.
# The transports' own data path (framing, copies, checks: 2-8 CPU seconds per GB through a
# NIC on the cluster) is not priced: on every measured run it hid behind the network seconds,
# and pricing it made both sets' predictions worse (docs/benchmarks.md, "Predicting a run")
CPU_OVERLAP = 0.55
PACED_CPU_OVERLAP = 0.88
# CPU seconds per GB of records the workers read in an epoch (minibatches gathered from a
# memory-mapped batch, turned into the model's floats), and what else an epoch's CPU costs per
# GB of the set: calibrated on the emulated cluster (the 1 GB reshuffle-bound run with no
# reshuffle, docs/benchmarks.md "Predicting a run")
READ_SECONDS_PER_GB = 2.2
EPOCH_SECONDS = 0.057  # per epoch: reports, records, the checkpoint (calibrated)
# the latency of one phase of a ring all-reduce (a message to the next worker and its answer):
# calibrated on the emulated cluster (K = 4 on the 2 cores here, 400 Mbit/s, no reshuffle,
# minibatches of 16 and 128, gradients of 20 and 80 KB): a step's all-reduce took 8-9 ms on a
# switch whatever the gradient's size, six phases of about 1.5 ms (docs/benchmarks.md)
SYNC_PHASE_SECONDS = 1.56e-3
# frames of store-and-forward per ring phase (calibrated on the emulated cluster, 4 Mbit/s,
# K = 4): on a shared medium the sender's NIC and the medium each hold a frame; on a switch
# the receiver's NIC takes the chunk while the sender's sends it
HOP_FRAMES = {"shared": 1.75, "switch": 0.44, "uplink": 0.44}


@dataclass(frozen=True)
class Compute:
    """The job's compute, measured on this machine (``python -m coded_shuffle_train --profile``)."""

    step_seconds: float  # one optimiser step on one minibatch, one process alone
    eval_seconds_per_point: float
    sha256_seconds_per_gb: float
    cores: int  # the CPUs the emulated cluster's hosts share


@dataclass(frozen=True)
class Training:
    """What every epoch trains: ``points`` N of ``point_bytes`` over ``workers`` K."""

    workers: int
    points: int
    point_bytes: int
    test_points: int
    params: int
    momentum: bool
    batch_size: int
    average_every: int  # H: 0 averages the gradients at every step
    step_delay: float = 0.0  # seconds every step holds its worker besides its own work

    @property
    def steps(self) -> int:
        return math.ceil(self.points // self.workers / self.batch_size)

    @property
    def set_gb(self) -> float:
        return self.points * self.point_bytes / 1e9


@dataclass(frozen=True)
class Part:
    """One part of an epoch: its network-bound and CPU-bound seconds, and its wall clock."""

    network: float
    cpu: float
    seconds: float


def allreduce_seconds(payload: float, workers: int, net: Network) -> float:
    """A ring all-reduce of ``payload`` bytes per worker among the ``workers`` (gloo): on a
    shared medium every worker's ``2 (K - 1) / K`` shares cross the one link; on a switch each
    NIC carries its own. Each of the ``2 (K - 1)`` phases waits for its frames to cross and
    for the next worker to answer (:data:`SYNC_PHASE_SECONDS`)."""
    if workers < 2:
        return 0.0
    share = 2 * (workers - 1) * payload
    busy = share if net.topology == "shared" else share / workers
    phases = 2 * (workers - 1)
    hop = HOP_FRAMES[net.topology] * min(net.mtu, payload / workers + 64) / (net.rate / 8)
    crossing = net.tcp(busy / phases) / (net.rate / 8)  # one phase's bytes over the link
    return phases * (max(crossing, SYNC_PHASE_SECONDS) + hop)


def digest_seconds(t: Training, c: Compute) -> float:
    """Every batch's SHA-256 at the master (one thread), and each worker's own (the workers
    on the shared cores)."""
    hashed = t.set_gb * c.sha256_seconds_per_gb
    return hashed + hashed / c.cores


def delivery(network: float, cost: Cost, t: Training, c: Compute) -> Part:
    """A delivery of ``network`` seconds over a transport that costs ``cost``, beside its
    digests' CPU."""
    cpu = digest_seconds(t, c)
    overlap = PACED_CPU_OVERLAP if cost.paced else CPU_OVERLAP
    return Part(network, cpu, max(network, cpu) + (1 - overlap) * min(network, cpu))


def training(t: Training, net: Network, c: Compute) -> Part:
    """The workers' steps and their synchronisation (the seconds a step holds its worker
    besides, ``step_delay``, in the part's wall seconds only)."""
    steps = t.steps
    contention = max(1.0, t.workers / c.cores)
    cpu = steps * c.step_seconds * contention + t.set_gb * READ_SECONDS_PER_GB / c.cores
    held = steps * t.step_delay
    if t.average_every <= 0:
        network = steps * allreduce_seconds(4 * t.params, t.workers, net)
    else:
        rounds = len({*range(t.average_every, steps + 1, t.average_every), steps})
        payload = 4 * t.params * (2 if t.momentum else 1)
        network = rounds * allreduce_seconds(payload, t.workers, net)
    return Part(network, cpu, network + cpu + held)


def epoch_end(t: Training, net: Network, c: Compute) -> Part:
    """Worker 0's parameters to the master and the test forward."""
    network = net.tcp(4 * t.params) / (min(net.rate, net.master_rate) / 8)
    cpu = t.test_points * c.eval_seconds_per_point
    return Part(network, cpu, network + cpu + EPOCH_SECONDS)


def together(a: Part, b: Part) -> float:
    """Wall seconds of ``a`` and ``b`` at once (a delivery beside training): the longer of
    the two, unless their CPU work together keeps the shared cores busy longer, or their bytes
    together the link."""
    return max(a.seconds, b.seconds, a.cpu + b.cpu, a.network + b.network)


def epoch_seconds(deliveries: list[Part], rest: Part, prefetch: bool) -> list[float]:
    """Every epoch's seconds on the master's clock: its delivery (the first: the placement),
    then ``rest`` (the training and the epoch's end); with ``prefetch`` every later delivery
    beside the epoch before's ``rest`` (:func:`together`), the epoch then waiting only for
    what is left of it."""
    if not prefetch:
        return [d.seconds + rest.seconds for d in deliveries]
    # the placement, then each epoch's rest beside the next delivery: the pair's seconds go to
    # the later epoch (its wait and its own rest, alike from epoch to epoch)
    return [deliveries[0].seconds + rest.seconds] + [together(rest, d) for d in deliveries[1:]]
