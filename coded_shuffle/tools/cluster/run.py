"""``coded-shuffle cluster``: one ``torchrun`` node per emulated host
(docs/transports.md, "The emulated cluster").

Host ``i`` runs ``torchrun --nnodes P --nproc-per-node 1 --node-rank i --master-addr <h0>``
inside its namespace, with gloo on the host's NIC (``GLOO_SOCKET_IFNAME=eth0``): the real
multi-host code path, rendezvous by address. With ``--min-hosts M`` the nodes are elastic
instead (``--nnodes M:P``, torch's c10d rendezvous at host 0, every node named by its address,
so that host 0, whose address sorts first, is rank 0: the master): after a failure the agents
start the job again with the hosts that are left (``--lose``: a host gone for good). The first
form runs the training job (``-m train``; ``workers = P - 1`` is set, and ``dist.elastic``
with ``--min-hosts``), the second any torchrun script. Host 0's output
goes to the console, every host's to ``LOGS/h<i>.log``; ``cluster.json`` beside them records
the rates and what every NIC sent and received. When a host fails the others get ``grace``
seconds to finish, then everything is killed; the namespaces go on every exit path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coded_shuffle.costs.model import PACE_SHARE
from coded_shuffle.costs.rates import format_rate
from coded_shuffle.errors import UsageError
from coded_shuffle.tools.cluster.netns import IFACE, Cluster, kill_namespace_processes

MASTER_PORT = 29500
# elastic rendezvous: a lost node is dropped after two missed 1 s keep-alives, and a round
# closes 1 s after the minimum of nodes has joined (torch's defaults: 5 s x 3, and 30 s); host
# 0 hosts the rendezvous store (``is_host``: torch's guess resolves the machine's name, which
# a namespace cannot)
RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2"
MULTICAST_SHARE = PACE_SHARE  # default pacing of multicast: this share of the slowest NIC


@dataclass
class HostResult:
    host: int
    code: int | None
    log: Path
    lost: bool = False  # gone for good (``--lose``): its exit is not the job's failure


@dataclass
class Fault:
    """``--kill``, ``--lose`` or ``--cut HOST@WHEN``: what happens to a host (killed and, with
    restarts, started again; killed for good; its link taken down), and when. ``WHEN``
    is seconds after the start (``2@30``) or ``eN``: once the job has recorded epoch ``N``
    in its ``metrics.jsonl``, or a ``--script`` has printed its ``N``-th line starting with
    ``epoch`` on host 0 (``2@e2``: mid-run whatever the machine's speed)."""

    kind: str  # "kill" | "lose" | "cut"
    host: int
    at: float | None  # seconds after the start, or
    after_epoch: int | None = None  # ... once this many epochs are recorded
    metrics: Path | None = None  # the job's metrics.jsonl (for after_epoch), or
    console: Path | None = None  # ... host 0's log, for a script
    done_at: float | None = None
    restarted: bool = False

    @classmethod
    def parse(cls, kind: str, text: str, hosts: int) -> Fault:
        m = re.fullmatch(r"(\d+)@(?:(\d+(?:\.\d*)?)|e(\d+))", text.strip())
        if not m:
            raise UsageError(
                f"--{kind} {text!r}: expected HOST@SECONDS or HOST@eEPOCH, e.g. 2@20 or 2@e2"
            )
        host = int(m.group(1))
        if not 0 <= host < hosts:
            raise UsageError(f"--{kind} {text}: host {host} out of range 0..{hosts - 1}")
        if m.group(3) is not None:
            if int(m.group(3)) < 1:
                raise UsageError(f"--{kind} {text}: epoch {m.group(3)} out of range: >= 1")
            return cls(kind, host, None, int(m.group(3)))
        return cls(kind, host, float(m.group(2)))

    def due(self, now: float) -> bool:
        if self.at is not None:
            return self.at <= now
        if self.console is not None:
            return printed_epochs(self.console) >= self.after_epoch
        return recorded_epochs(self.metrics) >= self.after_epoch

    def record(self) -> dict:
        return {"kind": self.kind, "host": self.host, "at": self.at,
                "after_epoch": self.after_epoch, "done_at": self.done_at,
                "restarted": self.restarted}  # fmt: skip


def recorded_epochs(metrics: Path | None) -> int:
    """Epochs the job has written to ``metrics.jsonl`` so far (0 before the file exists)."""
    try:
        return metrics.read_bytes().count(b"\n") if metrics is not None else 0
    except FileNotFoundError:
        return 0


def printed_epochs(log: Path) -> int:
    """Lines starting with ``epoch`` that a script has printed on host 0 so far."""
    try:
        return len(re.findall(rb"^epoch\b", log.read_bytes(), re.M))
    except FileNotFoundError:
        return 0


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
    workers = cluster.hosts - 1
    given = _override(out, "workers")
    if given is not None and given != str(workers):
        raise UsageError(
            f"workers={given} does not fit --hosts {cluster.hosts}: the cluster runs "
            f"workers = hosts - 1 = {workers} (leave workers out)"
        )
    if given is None:
        out.append(f"workers={workers}")
    run_dir = _override(out, "hydra.run.dir")
    if run_dir is None:
        run_dir = time.strftime(f"outputs/cluster-{cluster.run_id}-%Y%m%d-%H%M%S")
        out.append(f"hydra.run.dir={run_dir}")
    if (
        _override(out, "dist.transport") == "multicast"
        and _override(out, "dist.multicast.rate") is None
    ):
        slowest = min(cluster.host_rate(i) for i in range(cluster.hosts))
        out.append(f"dist.multicast.rate={format_rate(int(slowest * MULTICAST_SHARE))}")
    return out, Path(run_dir)


def check_training_config(overrides: Sequence[str]) -> None:
    """Validates the job's config before any namespace exists (one line on a bad value)."""
    out = subprocess.run(
        [sys.executable, "-m", "train", "--check", *overrides], capture_output=True, text=True
    )
    if out.returncode:
        lines = (out.stderr.strip() or out.stdout.strip() or "invalid config").splitlines()
        raise UsageError(re.sub(r"^[\w .-]+: error: ", "", lines[-1]))


def max_restarts(target: Sequence[str]) -> int:
    """``dist.max_restarts`` of the training job (0 for a script or when not given)."""
    value = _override(target, "dist.max_restarts") if "train" in target[:2] else None
    return int(value) if value and value.isdigit() else 0


def host_env(min_hosts: int | None = None) -> dict[str, str]:
    """What every host's torchrun runs with, besides the caller's environment: gloo on the
    host's NIC, and for elastic nodes a rendezvous store of each attempt's own
    (``train.entry.follow_world``)."""
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
        nodes = ["--nnodes", str(cluster.hosts), "--node-rank", str(host),
                 "--master-addr", cluster.address(0), "--master-port", str(port)]  # fmt: skip
    else:
        nodes = ["--nnodes", f"{min_hosts}:{cluster.hosts}", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"{cluster.address(0)}:{port}",
                 "--rdzv-id", f"cs-{cluster.run_id}",
                 "--rdzv-conf", f"{RDZV_CONF},is_host={str(host == 0).lower()}",
                 "--local-addr", cluster.address(host)]  # fmt: skip
    return [
        sys.executable, "-m", "torch.distributed.run", *nodes, "--nproc-per-node", "1",
        "--max-restarts", str(max_restarts(target)), *target,
    ]  # fmt: skip


def run_hosts(
    cluster: Cluster,
    target: Sequence[str],
    logs: Path,
    grace: float = 30.0,
    faults: Sequence[Fault] = (),
    port: int = MASTER_PORT,
    min_hosts: int | None = None,
) -> list[HostResult]:
    """Starts ``torchrun ... target`` on every host and waits for all of them (the job's
    master at ``port`` of host 0: two jobs on one cluster take two ports).

    Host 0's output is echoed to the console. ``faults`` fire at their time: a killed host
    loses every process (and is started again when the job restarts after failures); a cut
    host's link goes down. After the first failure the others get ``grace`` seconds, then
    every process in the cluster is killed.
    """
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **host_env(min_hosts)}
    results = [HostResult(i, None, logs / f"h{i}.log") for i in range(cluster.hosts)]
    files = [r.log.open("w") for r in results]
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
        _wait(procs, results, grace, Faults(cluster, faults, restart))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if echo is not None:
            echo.join(timeout=5)
        for f in files:
            f.close()
    return results


def _tee(stream, log) -> None:
    """Copies host 0's output to the console and to its log, line by line."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        sys.stdout.write(line)
        sys.stdout.flush()
        log.write(line)
        log.flush()


class Faults:
    """Fires ``--kill`` and ``--cut`` at their time; a killed host is started again when the
    job restarts after failures (``restart``), as a replaced machine would be."""

    def __init__(self, cluster: Cluster, faults: Sequence[Fault], restart) -> None:
        self.cluster, self.pending, self.restart = (
            cluster,
            list(faults),
            restart,
        )
        self.t0 = time.monotonic()
        self.lost: set[int] = set()  # hosts gone for good

    def fire(self, procs: list[subprocess.Popen]) -> None:
        now = time.monotonic() - self.t0
        for fault in [f for f in self.pending if f.due(now)]:
            self.pending.remove(fault)
            ns = self.cluster.host_ns(fault.host)
            if fault.kind == "cut":
                _ip_quiet("-n", ns, "link", "set", IFACE, "down")
            else:
                while kill_namespace_processes(ns):
                    time.sleep(0.05)
                procs[fault.host].wait()
                if fault.kind == "lose":
                    self.lost.add(fault.host)
                elif self.restart is not None:
                    procs[fault.host] = self.restart(fault.host)
                    fault.restarted = True
            fault.done_at = round(now, 3)
            print(
                f"coded-shuffle cluster: {fault.kind} host {fault.host} at {now:.1f} s"
                f"{'' if fault.at is not None else f' (after epoch {fault.after_epoch})'}"
                f"{' (started again)' if fault.restarted else ''}",
                file=sys.stderr,
                flush=True,
            )


def _ip_quiet(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, check=False)


def _wait(
    procs: list[subprocess.Popen], results: list[HostResult], grace: float, faults: Faults
) -> None:
    """Until every host exited; ``grace`` seconds after the first failure, kills the rest."""
    failed_at = None
    while True:
        faults.fire(procs)
        for r, p in zip(results, procs, strict=True):
            r.code, r.lost = p.poll(), r.host in faults.lost
        codes = [r.code for r in results]
        if all(c is not None for c in codes):
            return
        failing = [r.code for r in results if not r.lost]
        if failed_at is None and any(c not in (None, 0) for c in failing):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)


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


# the columns of /proc/stat's "cpu" line (proc(5)), in USER_HZ ticks
PROC_STAT_FIELDS = (
    "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice"
)  # fmt: skip


def machine_cpu_ticks(stat: Path = Path("/proc/stat")) -> dict[str, int]:
    """The machine's CPU time so far by kind (every core summed; empty where unreadable)."""
    try:
        line = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return {}
    return dict(zip(PROC_STAT_FIELDS, (int(v) for v in line[1:]), strict=False))


def machine_cpu_use(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Shares of the machine's CPU time between two samples: ``busy`` (all but idle and
    iowait; softirq, where the kernel's network stack runs, included), and its parts."""
    if not before or not after:
        return {}
    delta = {k: after[k] - before[k] for k in before if k in after}
    # guest time is already inside user and nice
    total = sum(v for k, v in delta.items() if not k.startswith("guest"))
    if total <= 0:
        return {}
    idle = delta.get("idle", 0) + delta.get("iowait", 0)
    return {
        "cores": os.cpu_count() or 1,
        "busy_share": (total - idle) / total,
        "user_share": (delta.get("user", 0) + delta.get("nice", 0)) / total,
        "system_share": delta.get("system", 0) / total,
        "softirq_share": (delta.get("softirq", 0) + delta.get("irq", 0)) / total,
    }


TRANSPORT_RECORD = {  # Cluster.transport_counters' keys -> cluster.json's per host
    "retransmits": "tcp_retransmitted_segments",
    "timeouts": "tcp_timeouts",
    "tx_drops": "queue_drops_sending",
    "rx_drops": "queue_drops_receiving",
}


@dataclass
class Counters:
    """The cluster's NIC and medium counters at one moment."""

    nics: list[dict[str, int]]
    medium: dict[str, int]
    transport: list[dict[str, int]]  # per host: TCP retransmits and timeouts, queue drops

    @classmethod
    def read(cls, cluster: Cluster) -> Counters:
        return cls(cluster.nic_counters(), cluster.medium_counters(),
                   cluster.transport_counters())  # fmt: skip


def medium_record(cluster: Cluster, before: Counters, after: Counters) -> dict:
    """What ``cluster.json`` says of the medium: a switch, or the shared medium's rate and
    what crossed it (Ethernet frames: headers included)."""
    if cluster.medium != "shared":
        return {"kind": cluster.medium}
    return {
        "kind": "shared",
        "rate_bits": cluster.rate,
        "bytes": after.medium["tx_bytes"] - before.medium["tx_bytes"],
        "frames": after.medium["tx_packets"] - before.medium["tx_packets"],
        "queue_drops": after.medium["drops"] - before.medium["drops"],
    }


def write_record(
    path: Path,
    cluster: Cluster,
    before: Counters,
    after: Counters,
    results,
    wall: float,
    faults: Sequence[Fault] = (),
    cpu: dict[str, float] | None = None,
    min_hosts: int | None = None,
) -> None:
    hosts = []
    for i in range(cluster.hosts):
        hosts.append(
            {
                "host": i,
                "address": cluster.address(i),
                "rate_bits": cluster.host_rate(i),
                "exit_code": results[i].code,
                "lost": results[i].lost,
                "nic_tx_bytes": after.nics[i]["tx_bytes"] - before.nics[i]["tx_bytes"],
                "nic_rx_bytes": after.nics[i]["rx_bytes"] - before.nics[i]["rx_bytes"],
                **{
                    name: after.transport[i][key] - before.transport[i][key]
                    for key, name in TRANSPORT_RECORD.items()
                },
            }
        )
    record = {
        "run_id": cluster.run_id,
        "mtu": cluster.mtu,
        "min_hosts": min_hosts,  # elastic nodes from this many up (None: fixed)
        "wall_seconds": wall,
        "medium": medium_record(cluster, before, after),
        "hosts": hosts,
        "faults": [f.record() for f in faults],
        "machine_cpu": cpu or {},
    }
    path.write_text(json.dumps(record, indent=2) + "\n")
