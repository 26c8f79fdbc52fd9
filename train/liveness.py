"""Liveness separate from work: heartbeats through the job's store, a watchdog on every rank.

A thread on every rank publishes, every ``interval`` seconds, a record in the job's TCP
store: a heartbeat count, the rank's progress (the stage it reached, a tick count that the
work loops raise: minibatch steps, messages), a detail for progress lines and its address.
The same thread reads every rank's record and ends the job, naming the culprit, when

* **lost**: a rank's heartbeat has not moved for ``deadline`` seconds (killed, frozen, or its
  host unreachable),
* **cut off**: this rank has not reached the store for ``deadline`` seconds, or
* **hung**: a rank is behind the others (an earlier stage) and its progress has not moved
  for ``deadline`` seconds while they wait for it.

A rank that works, however long, keeps ticking and is never taken for dead; so the job's
collectives can wait for long work without a timeout of their own. A collective blocked in
gloo cannot be interrupted, so the watchdog records the reason for the launcher (torch's
error file) and exits the process.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

FIELDS = 6  # beat | stage count | stage | ticks | detail | address


def rank_label(rank: int) -> str:
    return "rank 0 (master)" if rank == 0 else f"rank {rank} (worker {rank - 1})"


class PeerLost(RuntimeError):
    """Another rank died, hung or became unreachable."""


@dataclass
class Record:
    beat: int
    stage_count: int
    stage: str
    ticks: int
    detail: str
    address: str

    def pack(self) -> str:
        return "|".join(
            str(v).replace("|", "/")
            for v in (
                self.beat,
                self.stage_count,
                self.stage,
                self.ticks,
                self.detail,
                self.address,
            )
        )

    @classmethod
    def unpack(cls, raw: bytes) -> Record:
        parts = raw.decode(errors="replace").split("|", FIELDS - 1)
        beat, count, stage, ticks, detail, address = parts + [""] * (FIELDS - len(parts))
        return cls(int(beat or 0), int(count or 0), stage, int(ticks or 0), detail, address)


def local_address() -> str:
    """This host's address on the job's network (GLOO_SOCKET_IFNAME's, else the hostname)."""
    name = os.environ.get("GLOO_SOCKET_IFNAME")
    if name:
        try:
            import fcntl
            import struct

            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            return socket.inet_ntoa(packed[20:24])  # SIOCGIFADDR
        except OSError:
            pass
    return socket.gethostname()


class Liveness:
    """Publishes this rank's record and watches everyone's (start/stop; tick and mark)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        deadline: float,
        interval: float,
        store_address: tuple[str, int],
        prefix: str,
        on_progress: Callable[[dict[int, Record], float], None] | None = None,
        progress_seconds: float = 10.0,
    ) -> None:
        self.rank, self.world = rank, world_size
        self.deadline, self.interval = deadline, interval
        self.store_address, self.prefix = store_address, prefix
        self.on_progress, self.progress_seconds = on_progress, progress_seconds
        self.record = Record(0, 0, "start", 0, "", local_address())
        self.seen: dict[int, Record] = {}
        self.beat_at: dict[int, float] = {}  # when each rank's heartbeat last moved (our clock)
        self.work_at: dict[int, float] = {}  # when each rank's progress last moved
        self.behind_at: dict[int, float] = {}  # when each rank fell behind the others
        self.t0 = self.stage_since = self.last_line = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store = None

    # -- called by the work (main thread) ------------------------------------------------

    def mark(self, stage: str) -> None:
        """This rank reached ``stage`` (``"epoch 2 delivered"``)."""
        self.record.stage_count += 1
        self.record.stage = stage
        self.record.detail = ""
        self.stage_since = time.monotonic()

    def tick(self, detail: str | None = None) -> None:
        """Progress inside a stage (a minibatch step, a message)."""
        self.record.ticks += 1
        if detail is not None:
            self.record.detail = detail

    # -- the thread ------------------------------------------------------------------------

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.reached = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._thread.start()
        guard = threading.Thread(target=self._guard, name="liveness-guard", daemon=True)
        guard.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _connect(self):
        import torch.distributed as dist

        host, port = self.store_address
        timeout = timedelta(seconds=max(2 * self.interval, 1.0))
        store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
        return dist.PrefixStore(self.prefix, store)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            try:
                if self._store is None:
                    self._store = self._connect()
                self.record.beat += 1
                self._store.set(f"hb/{self.rank}", self.record.pack())
                self._read_all(now)
                self.reached = now
            except Exception:  # the store is unreachable: this host may be cut off
                self._store = None
                self._check_contact(now)
                continue
            verdict = self.verdict(now)
            if verdict:
                self._fail(verdict)
            self._progress_line(now)

    def _check_contact(self, now: float) -> None:
        """Ends this process when the store has been out of reach for longer than the deadline
        (this host is cut off from the job)."""
        if now - self.reached > self.deadline:
            self._fail(
                f"lost contact with the job: its store at {self.store_address[0]} "
                f"unreachable for {now - self.reached:.0f} s (this host is cut off)"
            )

    def _guard(self) -> None:
        """The same check from a second thread: a store call on a dead link can block without
        a timeout (``TCPStore.check``), and then only this thread still runs."""
        while not self._stop.wait(self.interval):
            self._check_contact(time.monotonic())

    def _read_all(self, now: float) -> None:
        for r in range(self.world):
            key = f"hb/{r}"
            if r == self.rank:
                self.observe(r, self.record, now)
            elif self._store.check([key]):
                self.observe(r, Record.unpack(self._store.get(key)), now)
        self.update_behind(now)

    def observe(self, rank: int, record: Record, now: float) -> None:
        """Takes in a rank's record read at ``now``: when did its heartbeat, its work move."""
        old = self.seen.get(rank)
        if old is None or old.beat != record.beat:
            self.beat_at[rank] = now
        if old is None or (old.stage_count, old.ticks) != (record.stage_count, record.ticks):
            self.work_at[rank] = now
        self.seen[rank] = record

    def update_behind(self, now: float) -> None:
        """Notes when each rank fell behind the others (forgotten once it catches up)."""
        behind, _ = self._behind()
        for r in list(self.behind_at):
            if r not in behind:
                del self.behind_at[r]
        for r in behind:
            self.behind_at.setdefault(r, now)

    def verdict(self, now: float) -> str:
        """Why the job must end ('' if it need not): a lost or a hung rank."""
        for r in range(self.world):
            since = self.beat_at.get(r, self.t0)
            if r != self.rank and now - since > self.deadline:
                rec = self.seen.get(r)
                where = f"on {rec.address} at {rec.stage!r}" if rec else "(never started)"
                return (
                    f"{rank_label(r)} {where} lost: no heartbeat for {now - since:.0f} s "
                    "(killed, or its host unreachable)"
                )
        behind, ahead = self._behind()
        for r in behind:
            # waiting was fine until the others moved on: count from the later of the two
            idle = now - max(self.work_at[r], self.behind_at.get(r, now))
            if idle > self.deadline:
                rec = self.seen[r]
                return (
                    f"{rank_label(r)} on {rec.address} hung: no progress for {idle:.0f} s at "
                    f"{rec.stage!r} (others reached {ahead!r})"
                )
        return ""

    def _behind(self) -> tuple[list[int], str]:
        """The ranks at the earliest stage while others are further, and the furthest stage."""
        if len(self.seen) < self.world:
            return [], ""
        counts = {r: rec.stage_count for r, rec in self.seen.items()}
        low, top = min(counts.values()), max(counts.values())
        if low == top:
            return [], ""
        ahead = next(rec.stage for rec in self.seen.values() if rec.stage_count == top)
        return sorted(r for r, c in counts.items() if c == low), ahead

    def stalled(self) -> str:
        """The ranks furthest behind, for the error a failed collective raised."""
        behind, ahead = self._behind()
        if not behind:
            return ""
        names = ", ".join(f"{rank_label(r)} at {self.seen[r].stage!r}" for r in behind)
        return f"stalled: {names} (others reached up to {ahead!r})"

    def _progress_line(self, now: float) -> None:
        """Every ``progress_seconds`` of one long stage, ``on_progress`` tells the console."""
        if self.on_progress is None or now - self.last_line < self.progress_seconds:
            return
        if now - self.stage_since < self.progress_seconds:
            return
        self.last_line = now
        with contextlib.suppress(Exception):
            self.on_progress(dict(self.seen), now - self.stage_since)

    def _fail(self, reason: str) -> None:
        """Records ``reason`` for the launcher and ends this process (gloo cannot be woken)."""
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        print(f"{rank_label(self.rank)}: {reason}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            ErrorHandler().record_exception(PeerLost(reason))
        os._exit(1)
