"""What every worker tells the master after a delivery, and how the master checks it: the
batch digests (the delivery's verification) and every host's byte counts."""

from __future__ import annotations

import dataclasses
import resource
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from coded_shuffle.distributed.transports import HostBytes, Peer
from coded_shuffle.errors import VerificationError

DIGEST_BYTES = 32
COUNTS = tuple(f.name for f in dataclasses.fields(HostBytes))  # this host's transport bytes
# what every worker tells the master after each delivery
REPORT = np.dtype(
    [
        ("digest", "u1", DIGEST_BYTES),  # SHA-256 of the decoded batch
        ("decode_seconds", "<f8"),
        ("stored_bytes", "<i8"),
        *((name, "<i8") for name in COUNTS),
        ("cpu_user_seconds", "<f8"),  # this process's CPU in the delivery (HostCpu)
        ("cpu_system_seconds", "<f8"),
        ("started", "<f8"),  # wall clock (time.time) when this worker's delivery began
        ("finished", "<f8"),  # ... and when it had its batch, decoded and hashed
        ("anon_bytes", "<i8"),  # this process's anonymous resident memory then (anon_bytes)
    ]
)


@dataclass
class HostCpu:
    """CPU seconds this process (every thread: the transport's, gloo's, the decoder's) spent
    since :meth:`start`, split into user and kernel (``getrusage(RUSAGE_SELF)``), and the wall
    clock when it started (``started``: a delivery between the workers, ``p2p``, is timed by
    their clocks, :func:`peers_seconds`).

    Started on another thread than the main one (a delivery in the background while the loop
    trains), the main thread's own CPU meanwhile is left out, from the user seconds: the
    training's steps are not the delivery's (what the loop's other threads spend, torch's
    intra-op pool and gloo's, still counts: with one thread, as the job runs, there are few).
    The subtraction reads the kernel's runtime clocks of the process and of the main thread;
    the process's leaves out what another running thread spent since the last tick (4 ms
    here), the main thread's own does not, so the difference is floored at what the thread
    that started it spent itself (a short delivery came out at 0 s)."""

    user: float = 0.0
    system: float = 0.0
    started: float = 0.0
    process: float = 0.0  # the process's CPU clock at the start, where the main thread is left out
    main: float | None = None  # the main thread's CPU clock at the start, where it is left out
    own: float = 0.0  # this thread's CPU clock at the start

    @classmethod
    def start(cls) -> HostCpu:
        r = resource.getrusage(resource.RUSAGE_SELF)
        user, system = r.ru_utime, r.ru_stime
        process = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)  # before the main thread's
        return cls(-user, -system, time.time(), process, _main_thread_cpu(), time.thread_time())

    def stop(self) -> HostCpu:
        main = _main_thread_cpu()  # before the process's: what the main thread spent between
        r = resource.getrusage(resource.RUSAGE_SELF)  # the two readings counts as the delivery's
        user, system = self.user + r.ru_utime, self.system + r.ru_stime
        if self.main is not None and main is not None:
            process = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID) - self.process
            ours = max(process - (main - self.main), time.thread_time() - self.own)
            system = min(max(0.0, system), ours)  # the main thread off the user seconds first
            user = ours - system
        return HostCpu(user, system, self.started)

    @property
    def total(self) -> float:
        return self.user + self.system


def _main_thread_cpu() -> float | None:
    """The main thread's CPU seconds, where the caller runs on another thread (else None)."""
    if threading.current_thread() is threading.main_thread():
        return None
    ident = threading.main_thread().ident
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident or 0))
    except (OSError, AttributeError):  # a platform without per-thread clocks: all counted
        return None


def anon_bytes(status: str = "/proc/self/status") -> int:
    """This process's anonymous resident memory (``RssAnon``, proc(5)): what it allocated
    itself, not the pages of files it maps (a memory-mapped data set, the stores); 0 where
    the kernel does not say."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def verify_digests(epoch: int, reported: Sequence[bytes], expected: Sequence[bytes]) -> bool:
    """True when every worker's batch digest equals the master's; else VerificationError.

    A worker that decoded a wrong batch, or skipped its decode, reports a digest that differs
    from the master's.
    """
    if len(reported) != len(expected):
        raise VerificationError(
            f"epoch {epoch}: {len(reported)} reports for {len(expected)} workers"
        )
    for k, (mine, theirs) in enumerate(zip(reported, expected, strict=True)):
        if mine != theirs:
            raise VerificationError(
                f"epoch {epoch}: worker {k} decoded a batch with SHA-256 {mine.hex()[:16]}, "
                f"the master's is {theirs.hex()[:16]}"
            )
    return True


def cpu_per_gb(busy: Sequence[float], egress: Sequence[int], ingress: Sequence[int]) -> float:
    """The largest CPU seconds per GB (10^9 bytes) that crossed a host's NIC (both ways), over
    the hosts that moved any byte: how much CPU the data path costs where it costs most."""
    rates = [c / ((e + i) / 1e9) for c, e, i in zip(busy, egress, ingress, strict=True) if e + i]
    return max(rates, default=0.0)


def worker_report(
    batch_digest: bytes,
    decode_seconds: float,
    stored_bytes: int,
    counts: HostBytes,
    cpu: HostCpu,
) -> np.ndarray:
    """A worker's :data:`REPORT` of one delivery (``batch_digest``: the SHA-256 of its new
    batch); ``cpu`` started with the delivery runs until the report is made."""
    mine = np.zeros(1, dtype=REPORT)
    mine["digest"][0] = np.frombuffer(batch_digest, dtype=np.uint8)
    used = cpu.stop()
    mine["cpu_user_seconds"], mine["cpu_system_seconds"] = used.user, used.system
    mine["started"], mine["finished"] = used.started, time.time()
    mine["anon_bytes"] = anon_bytes()
    mine["decode_seconds"] = decode_seconds
    mine["stored_bytes"] = stored_bytes
    for key in COUNTS:
        mine[key] = getattr(counts, key)
    return mine


def peers_seconds(reports: np.ndarray) -> float:
    """A delivery between the workers (``p2p``): from the earliest worker's start to the
    latest one's batch, by the hosts' wall clocks. The master's own clock would start late
    (it may still evaluate the last epoch while the workers exchange) and end late (it
    gathers the reports once it is done)."""
    return float(reports["finished"].max() - reports["started"].min())


def gather_reports(mine: np.ndarray, peer: Peer) -> np.ndarray | None:
    """Every worker's :data:`REPORT` at the master, worker 0 first (``None`` elsewhere; the
    master passes an empty report of its own), over the peer's group."""
    buf = torch.from_numpy(np.frombuffer(mine.tobytes(), dtype=np.uint8).copy())
    master = peer.at(0)
    if peer.rank != 0:
        dist.gather(buf, dst=master, group=peer.group)
        return None
    out = [torch.zeros_like(buf) for _ in range(peer.world_size)]
    dist.gather(buf, gather_list=out, dst=master, group=peer.group)
    workers = peer.roles.by_role(out)[1:]
    return np.frombuffer(b"".join(t.numpy().tobytes() for t in workers), dtype=REPORT)
