"""``coded-shuffle cluster``: one ``torchrun`` node per emulated host
(docs/transports.md, "The emulated cluster").

Host ``i`` runs ``torchrun --nnodes P --nproc-per-node 1 --node-rank i --master-addr <h0>`` inside
its namespace (``python -m coded_shuffle_train.node`` with the same options but for elastic
nodes: torchrun's node, its ranks forked from one server that imported torch once), with gloo
on the host's NIC (``GLOO_SOCKET_IFNAME=eth0``): the real multi-host code path, rendezvous by
address.
With ``--min-hosts M`` the nodes are elastic instead (``--nnodes M:P``, torch's c10d rendezvous
at host 0, every node named by its address, so that host 0, whose address sorts first, is rank
0: the master): after a failure the agents start the job again with the hosts that are left
(``--lose``: a host gone for good). The first form runs the training job (``-m
coded_shuffle_train``; ``workers = P - 1`` is set, and ``dist.elastic`` with ``--min-hosts``), the
second any torchrun script. Host 0's output goes to the console, every host's to ``LOGS/h<i>.log``;
``cluster.json`` beside them records the rates and what every NIC sent and received. When a host
fails the others get ``grace`` seconds to finish, then everything is killed; the namespaces go on
every exit path."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coded_shuffle.costs.model import PACE_SHARE, fastest_first
from coded_shuffle.costs.rates import format_rate
from coded_shuffle.distributed.settings import ShuffleSettings
from coded_shuffle.distributed.transports import REGISTRY, Transport
from coded_shuffle.errors import UsageError
from coded_shuffle.tools.cluster.faults import Fault, Faults
from coded_shuffle.tools.cluster.netns import IFACE, Cluster
from coded_shuffle.tools.tempdirs import SERVER_SOCKET_TAIL, socket_base

MASTER_PORT = 29500
# elastic rendezvous: a lost node is dropped after two missed 1 s keep-alives, and a round
# closes 1 s after the minimum of nodes has joined (torch's defaults: 5 s x 3, and 30 s); host
# 0 hosts the rendezvous store (``is_host``: torch's guess resolves the machine's name, which
# a namespace cannot)
RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2"
ENDED_GRACE = 60.0  # seconds the other hosts get to end once one ended the job with exit 0
MULTICAST_SHARE = PACE_SHARE  # default pacing of multicast: this share of the slowest NIC


@dataclass
class HostResult:
    host: int
    code: int | None
    log: Path
    lost: bool = False  # gone for good (``--lose``): its exit is not the job's failure


def _override(overrides: Sequence[str], key: str) -> str | None:
    """The value of ``key=VALUE`` among Hydra overrides (the last one wins)."""
    found = None
    for arg in overrides:
        m = re.fullmatch(rf"\+*{re.escape(key)}=(.*)", arg)
        if m:
            found = m.group(1)
    return found


def training_overrides(
    overrides: Sequence[str], cluster: Cluster, elastic: bool = False
) -> tuple[list[str], Path]:
    """The job's overrides with ``workers``, the run directory and multicast pacing set (and
    ``dist.elastic``: an elastic cluster's workers follow its hosts)."""
    out = list(overrides)
    if elastic and _override(out, "dist.elastic") is None:
        out.append("dist.elastic=true")
    workers = cluster.processes - 1
    given = _override(out, "workers")
    if given is not None and given != str(workers):
        raise UsageError(
            f"workers={given} does not fit --hosts {cluster.hosts}: the cluster runs "
            f"workers = processes - 1 = {workers} (leave workers out)"
        )
    if given is None:
        out.append(f"workers={workers}")
    run_dir = _override(out, "hydra.run.dir")
    if run_dir is None:
        run_dir = time.strftime(f"outputs/cluster-{cluster.run_id}-%Y%m%d-%H%M%S")
        out.append(f"hydra.run.dir={run_dir}")
    master = _override(out, "dist.master_rank")
    master_rank = int(master) if master and master.isdigit() else 0
    rates = {r: cluster.host_rate(cluster.host_of(r)) for r in range(cluster.processes)}
    master_rate = rates.pop(master_rank)
    out += pacing_overrides(out, [rates[r] for r in sorted(rates)], master_rate)
    if master_rank == 0:  # the workers' ranks are their roles
        out += relay_overrides(out, rates)
    return out, Path(run_dir)


def _transport(overrides: Sequence[str]) -> type[Transport]:
    """The job's transport class (its default where the overrides do not name one)."""
    name = _override(overrides, "dist.transport") or ShuffleSettings.transport
    return REGISTRY.get(name, Transport)


def relay_overrides(overrides: Sequence[str], rates: dict[int, int]) -> list[str]:
    """A relay's order where the overrides do not set it (a transport whose options take an
    ``order``: the chain): on an uneven cluster the workers fastest first
    (:func:`~coded_shuffle.costs.model.fastest_first`, the order ``predict`` prices).
    ``rates``: every worker rank's NIC rate."""
    cls = _transport(overrides)
    key = f"dist.{cls.options_key or cls.name}.order"
    relays = "order" in {f.name for f in dataclasses.fields(cls.Options)}
    if not relays or _override(overrides, key) is not None or len(set(rates.values())) < 2:
        return []
    return [f"{key}=[{','.join(map(str, fastest_first(rates)))}]"]


def multicast_pace(overrides: Sequence[str], rates: Sequence[int], master_rate: int) -> int | None:
    """The pace (bits/s) of a paced transport's stream where the overrides do not set it
    (None where they do, or where the transport does not pace): :data:`MULTICAST_SHARE` of
    the slowest worker's NIC where the workers send, else of the slower of the master's and
    the fastest worker's (``rates``: every worker's)."""
    cls = _transport(overrides)
    key = f"dist.{cls.options_key or cls.name}.rate"
    if not cls.cost.paced or _override(overrides, key) is not None:
        return None
    pace = min(rates) if cls.routing == "peers" else min(max(rates), master_rate)
    return int(pace * MULTICAST_SHARE)


def pacing_overrides(overrides: Sequence[str], rates: Sequence[int], master_rate: int) -> list[str]:
    """A paced transport's pacing where the overrides do not set it (its cost says it paces:
    multicast's mechanism), at :data:`MULTICAST_SHARE` of the NICs a stream crosses (``rates``:
    every worker's, in role order; the master's ``master_rate``).

    The master's multicast: ``dist.<options>.rate`` for the slower of the master and the
    fastest worker, and where the workers' NICs differ, ``receiver_rates`` for each worker's
    (a slow worker hears only what it keeps, at its rate: :mod:`~coded_shuffle.distributed.
    transports.multicast.lanes`). Where the workers send (``peer-multicast``): ``rate`` for
    the slowest worker, and the master's placement at ``master_rate``'s share; ``rate`` is
    :func:`multicast_pace`."""
    cls = _transport(overrides)
    if not cls.cost.paced:
        return []
    out, key = [], f"dist.{cls.options_key or cls.name}"
    peers = cls.routing == "peers"
    uneven = not peers and len(set(rates)) > 1
    stream = multicast_pace(overrides, rates, master_rate)
    if stream is not None:
        out.append(f"{key}.rate={format_rate(stream)}")
    if uneven and _override(overrides, f"{key}.receiver_rates") is None:
        each = ",".join(format_rate(int(r * MULTICAST_SHARE)) for r in rates)
        out.append(f"{key}.receiver_rates=[{each}]")
    if peers and _override(overrides, f"{key}.master_rate") is None:
        master = int(min(master_rate, *rates) * MULTICAST_SHARE)  # the slowest sender's
        out.append(f"{key}.master_rate={format_rate(master)}")
    return out


JOB_MODULE = "coded_shuffle_train"  # the training job's module: ``-m`` runs it on every host
NODE_MODULE = f"{JOB_MODULE}.node"  # torchrun's node, its ranks forked from one server


def check_training_config(overrides: Sequence[str]) -> None:
    """Validates the job's config before any namespace exists (one line on a bad value)."""
    out = subprocess.run(
        [sys.executable, "-m", JOB_MODULE, "--check", *overrides],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        lines = (out.stderr.strip() or out.stdout.strip() or "invalid config").splitlines()
        raise UsageError(re.sub(r"^[\w .-]+: error: ", "", lines[-1]))


def runs_job(target: Sequence[str]) -> bool:
    """Whether the hosts' target is the training job (``-m coded_shuffle_train ...``), not a
    script."""
    return list(target[:2]) == ["-m", JOB_MODULE]


def max_restarts(target: Sequence[str]) -> int:
    """``dist.max_restarts`` of the training job (0 for a script or when not given)."""
    value = _override(target, "dist.max_restarts") if runs_job(target) else None
    return int(value) if value and value.isdigit() else 0


def host_env(min_hosts: int | None = None) -> dict[str, str]:
    """What every host's torchrun runs with, besides the caller's environment: gloo on the
    host's NIC, and for elastic nodes a rendezvous store of each attempt's own
    (``coded_shuffle_train.entry.follow_world``)."""
    env = {"GLOO_SOCKET_IFNAME": IFACE, "PYTHONUNBUFFERED": "1"}
    if min_hosts is not None:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def torchrun_argv(
    cluster: Cluster,
    host: int,
    target: Sequence[str],
    port: int = MASTER_PORT,
    min_hosts: int | None = None,
) -> list[str]:
    """Host ``host``'s torchrun: a fixed node rank, or (``min_hosts``) an elastic node
    named by its address at the c10d rendezvous on host 0 (module docstring)."""
    if min_hosts is None:
        nodes = [
            "--nnodes",
            str(cluster.hosts),
            "--node-rank",
            str(host),
            "--master-addr",
            cluster.address(0),
            "--master-port",
            str(port),
        ]
    else:
        nodes = [
            "--nnodes",
            f"{min_hosts}:{cluster.hosts}",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{cluster.address(0)}:{port}",
            "--rdzv-id",
            f"cs-{cluster.run_id}",
            "--rdzv-conf",
            f"{RDZV_CONF},is_host={str(host == 0).lower()}",
            "--local-addr",
            cluster.address(host),
        ]
    # the project's node where every host is in the one rendezvous round; elastic nodes keep
    # torchrun: a node's fork server imports the job beside its agent and holds up its join,
    # and an elastic round closes 1 s after the minimum of nodes joined (one suite run started
    # the job on two of three hosts so)
    return [
        sys.executable,
        "-m",
        NODE_MODULE if min_hosts is None else "torch.distributed.run",
        *nodes,
        "--nproc-per-node",
        str(cluster.procs(host)),
        "--max-restarts",
        str(max_restarts(target)),
        *target,
    ]


def run_hosts(
    cluster: Cluster,
    target: Sequence[str],
    logs: Path,
    grace: float = 30.0,
    faults: Sequence[Fault] = (),
    port: int = MASTER_PORT,
    min_hosts: int | None = None,
    heal: float | None = None,
) -> list[HostResult]:
    """Starts ``torchrun ... target`` on every host and waits for all of them (the job's
    master at ``port`` of host 0: two jobs on one cluster take two ports).

    Host 0's output is echoed to the console. ``faults`` fire at their time: a killed host
    loses every process (and is started again when the job restarts after failures); a cut
    host's link goes down; with ``heal``, a cut or stopped host comes back that long after
    (:class:`~coded_shuffle.tools.cluster.faults.Faults`). After the first failure the others
    get ``grace`` seconds, then every process in the cluster is killed.
    """
    logs.mkdir(parents=True, exist_ok=True)
    results = [HostResult(i, None, logs / f"h{i}.log") for i in range(cluster.hosts)]
    files = [r.log.open("w") for r in results]
    # the hosts' temporary files (torchrun's log folders, the ranks' error files) in a folder
    # of the run's own, removed when it ends: torch leaves them in the system's otherwise
    prefix = f"coded-shuffle-{cluster.run_id}-"
    tail = len(f"/{prefix}XXXXXXXX") + SERVER_SOCKET_TAIL  # each node's fork server inside
    scratch = tempfile.TemporaryDirectory(prefix=prefix, dir=socket_base(tail))
    env = {**os.environ, **host_env(min_hosts), "TMPDIR": scratch.name}
    procs: list[subprocess.Popen] = []
    echo = None

    def start(i: int) -> subprocess.Popen:
        argv = cluster.exec_argv(i, torchrun_argv(cluster, i, target, port, min_hosts))
        out = subprocess.PIPE if i == 0 else files[i]
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    try:
        for i in range(cluster.hosts):
            procs.append(start(i))
        echo = threading.Thread(target=_tee, args=(procs[0].stdout, files[0]), daemon=True)
        echo.start()
        restart = start if max_restarts(target) > 0 else None
        _wait(procs, results, grace, Faults(cluster, faults, restart, heal))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if echo is not None:
            echo.join(timeout=5)
        for f in files:
            f.close()
        scratch.cleanup()
    return results


def _tee(stream, log) -> None:
    """Copies host 0's output to the console and to its log, line by line."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        sys.stdout.write(line)
        sys.stdout.flush()
        log.write(line)
        log.flush()


def _wait(
    procs: list[subprocess.Popen], results: list[HostResult], grace: float, faults: Faults
) -> None:
    """Until every host exited; ``grace`` seconds after the first failure, kills the rest, and
    :data:`ENDED_GRACE` seconds after a host ended the job cleanly, the hosts still running
    (a host that outlives the job's end waits on something that will not come)."""
    failed_at = ended_at = None
    while True:
        faults.fire(procs)
        for r, p in zip(results, procs, strict=True):
            r.code, r.lost = p.poll(), r.host in faults.lost
        if all(r.code is not None for r in results):
            return
        now, kept = time.monotonic(), [r for r in results if not r.lost]
        if failed_at is None and any(r.code not in (None, 0) for r in kept):
            failed_at = now
        if ended_at is None and any(r.code == 0 for r in kept):
            ended_at = now
        if failed_at is not None and now - failed_at > grace:
            _kill_running(procs, results, None)
        elif ended_at is not None and now - ended_at > ENDED_GRACE:
            _kill_running(procs, results, f"still running {ENDED_GRACE:g} s after the job ended")
        time.sleep(0.05)


def _kill_running(
    procs: list[subprocess.Popen], results: list[HostResult], why: str | None
) -> None:
    """Kills every host still running, saying ``why`` of each on stderr (None: silently)."""
    for r, p in zip(results, procs, strict=True):
        if p.poll() is None:
            if why is not None:
                print(f"coded-shuffle cluster: host {r.host} {why}: killed", file=sys.stderr)
            p.kill()
            p.wait()


def last_error(log: Path) -> str:
    """The most telling line of a failed host's log."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    # a rank's watchdog names the lost rank and its address; then the job's own one-line errors
    for pattern in (r"^rank \d+ \((master|worker \d+)\): ", r"error: ", r"Error", r"failed"):
        for line in reversed(lines):
            if re.search(pattern, line):
                return line
    return lines[-1] if lines else ""
