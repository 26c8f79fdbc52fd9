"""``coded-shuffle cluster --kill/--lose/--cut HOST@WHEN``: what happens to a host, and when
(seconds after the start, or once the job has recorded an epoch), fired while the hosts run."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coded_shuffle.errors import UsageError
from coded_shuffle.tools.cluster.netns import IFACE, Cluster, kill_namespace_processes


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
        return {
            "kind": self.kind,
            "host": self.host,
            "at": self.at,
            "after_epoch": self.after_epoch,
            "done_at": self.done_at,
            "restarted": self.restarted,
        }


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
