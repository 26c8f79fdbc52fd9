"""``coded-shuffle cluster --kill/--lose/--cut/--stop/--corrupt HOST@WHEN``: what happens to a
host, and when (seconds after the start, or once the job has recorded an epoch, optionally a
delay later), fired while the hosts run; with ``--heal`` a cut or stopped host comes back
(its link up, its processes killed and started again, as a rebooted machine)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from coded_shuffle.distributed.fault_kinds import FAULTS
from coded_shuffle.errors import UsageError
from coded_shuffle.tools.cluster.netns import IFACE, Cluster, kill_namespace_processes
from coded_shuffle.tools.records import recorded_lines

WHEN = re.compile(r"(\d+)@(?:(\d+(?:\.\d*)?)|e(\d+)(?:\+(\d+(?:\.\d*)?))?)")


@dataclass
class Fault:
    """``--KIND HOST@WHEN``: what happens to a host, and when. Kinds: ``kill`` (every process
    killed and, with restarts, started again), ``lose`` (killed for good), ``cut`` (its link
    taken down), ``stop`` (every process stopped with SIGSTOP: a hung machine), ``corrupt``
    (one byte of the worker's newest store file flipped). ``WHEN`` is seconds after the start
    (``2@30``) or ``eN``: once the job has recorded epoch ``N`` in its ``metrics.jsonl``, or a
    ``--script`` has printed its ``N``-th line starting with ``epoch`` on host 0 (``2@e2``:
    mid-run whatever the machine's speed); ``eN+D``: ``D`` seconds after that (inside the
    next epoch)."""

    kind: str
    host: int
    at: float | None  # seconds after the start, or
    after_epoch: int | None = None  # ... once this many epochs are recorded
    delay: float = 0.0  # ... and this many seconds more
    metrics: Path | None = None  # the job's metrics.jsonl (for after_epoch), or
    console: Path | None = None  # ... host 0's log, for a script
    done_at: float | None = None
    restarted: bool = False
    healed_at: float | None = None
    seen_at: float | None = None  # when the epoch was first seen recorded

    @classmethod
    def parse(cls, kind: str, text: str, hosts: int) -> Fault:
        m = WHEN.fullmatch(text.strip())
        if not m:
            raise UsageError(
                f"--{kind} {text!r}: expected HOST@SECONDS or HOST@eEPOCH[+SECONDS], e.g. 2@20, "
                "2@e2 or 2@e2+0.5"
            )
        host = int(m.group(1))
        if not 0 <= host < hosts:
            raise UsageError(f"--{kind} {text}: host {host} out of range 0..{hosts - 1}")
        if FAULTS[kind].workers_only and host == 0:
            raise UsageError(f"--{kind} {text}: host 0 is the master, which keeps no store")
        if m.group(3) is None:
            return cls(kind, host, float(m.group(2)))
        if int(m.group(3)) < 1:
            raise UsageError(f"--{kind} {text}: epoch {m.group(3)} out of range: >= 1")
        return cls(kind, host, None, int(m.group(3)), float(m.group(4) or 0.0))

    def due(self, now: float) -> bool:
        if self.at is not None:
            return self.at <= now
        if self.seen_at is None:
            if self.console is not None:
                reached = printed_epochs(self.console) >= self.after_epoch
            else:
                reached = recorded_lines(self.metrics) >= self.after_epoch
            if not reached:
                return False
            self.seen_at = now
        return now >= self.seen_at + self.delay

    def record(self) -> dict:
        return {
            "kind": self.kind,
            "host": self.host,
            "at": self.at,
            "after_epoch": self.after_epoch,
            "delay": self.delay,
            "done_at": self.done_at,
            "restarted": self.restarted,
            "healed_at": self.healed_at,
        }


def printed_epochs(log: Path) -> int:
    """Lines starting with ``epoch`` that a script has printed on host 0 so far."""
    try:
        return len(re.findall(rb"^epoch\b", log.read_bytes(), re.M))
    except FileNotFoundError:
        return 0


def corrupt_store(stores: Path, worker: int) -> Path | None:
    """Flips the last byte (a row's, past the ``.npy`` header) of worker ``worker``'s newest
    store file under ``stores``; the file, or None where it has none yet."""
    files = sorted(
        (stores / f"worker-{worker}").glob("e*-part*.npy"),
        key=lambda f: int(re.match(r"e(\d+)", f.name).group(1)),  # type: ignore[union-attr]
    )
    if not files:
        return None
    with open(files[-1], "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    return files[-1]


class Faults:
    """Fires the faults at their time. A killed host is started again when the job restarts
    after failures (``restart``), as a replaced machine would be; with ``heal`` seconds, a cut
    or stopped host comes back that long after its fault: its link up, its processes killed
    and (with ``restart``) started again."""

    def __init__(
        self,
        cluster: Cluster,
        faults: Sequence[Fault],
        restart: Callable[[int], subprocess.Popen] | None,
        heal: float | None = None,
    ) -> None:
        self.cluster, self.pending, self.restart, self.heal = cluster, list(faults), restart, heal
        self.t0 = time.monotonic()
        self.lost: set[int] = set()  # hosts gone for good
        self.healing: list[Fault] = []

    def fire(self, procs: list[subprocess.Popen]) -> None:
        now = time.monotonic() - self.t0
        for fault in [f for f in self.pending if f.due(now)]:
            self.pending.remove(fault)
            self.apply(fault, procs)
            fault.done_at = round(now, 3)
            self.say(fault, now)
            if self.heal is not None and FAULTS[fault.kind].heals:
                self.healing.append(fault)
        for fault in [f for f in self.healing if now >= f.done_at + self.heal]:
            self.healing.remove(fault)
            _ip_quiet("-n", self.cluster.host_ns(fault.host), "link", "set", IFACE, "up")
            self.replace(fault, procs)
            fault.healed_at = round(now, 3)
            print(
                f"coded-shuffle cluster: host {fault.host} healed at {now:.1f} s", file=sys.stderr
            )

    def apply(self, fault: Fault, procs: list[subprocess.Popen]) -> None:
        """What ``fault`` does to its host."""
        ns = self.cluster.host_ns(fault.host)
        if fault.kind == "cut":
            _ip_quiet("-n", ns, "link", "set", IFACE, "down")
        elif fault.kind == "stop":
            kill_namespace_processes(ns, signal.SIGSTOP)
        elif fault.kind == "corrupt":
            assert fault.metrics is not None, "--corrupt needs the training job's run directory"
            corrupt_store(fault.metrics.parent / "stores", fault.host - 1)
        elif fault.kind == "lose":
            self.kill(fault.host, procs)
            self.lost.add(fault.host)
        elif fault.kind == "kill":
            self.replace(fault, procs)
        else:
            raise ValueError(f"the cluster has no action for fault kind {fault.kind!r}")

    def kill(self, host: int, procs: list[subprocess.Popen]) -> None:
        while kill_namespace_processes(self.cluster.host_ns(host)):
            time.sleep(0.05)
        procs[host].wait()

    def replace(self, fault: Fault, procs: list[subprocess.Popen]) -> None:
        """The host's processes killed and, with restarts, started again."""
        self.kill(fault.host, procs)
        if self.restart is not None:
            procs[fault.host] = self.restart(fault.host)
            fault.restarted = True

    @staticmethod
    def say(fault: Fault, now: float) -> None:
        after = "" if fault.at is not None else f" (after epoch {fault.after_epoch})"
        again = " (started again)" if fault.restarted else ""
        print(
            f"coded-shuffle cluster: {fault.kind} host {fault.host} at {now:.1f} s{after}{again}",
            file=sys.stderr,
            flush=True,
        )


def _ip_quiet(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, check=False)
