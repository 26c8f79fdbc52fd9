"""Liveness separate from work: heartbeats through the job's store, a watchdog on every rank.

A thread on every rank publishes, every ``interval`` seconds, a record in the job's TCP
store: a heartbeat count, the rank's progress (the stage it reached, a tick count that the
work loops raise: minibatch steps, messages), a detail for progress lines and its address.
The same thread reads every rank's record and ends the job, naming the culprit, when

* **lost**: a rank's heartbeat has not moved for ``deadline`` seconds (killed, frozen by
  ``SIGSTOP``, or its host unreachable),
* **cut off**: this rank has not reached the store for ``deadline`` seconds, or
* **hung** (only with ``watch_progress``): a rank is behind the others (an earlier stage) and
  its progress has not moved for ``deadline`` seconds while they wait for it.

A rank that works, however long, keeps ticking and is never taken for dead; so collectives
can wait for long work without a timeout of their own. A collective blocked in gloo cannot be
interrupted, so the watchdog prints one line naming the rank and its address, records it for
torch's elastic launcher (its error file) and exits the process.

:class:`~coded_shuffle.CodedShuffle` starts one (``timeout=``, ``heartbeat=``); the training
jobs start one before their data set loads and hand it to ``CodedShuffle(liveness=...)``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from coded_shuffle.distributed.roles import Roles

FIELDS = 6  # beat | stage count | stage | ticks | detail | address
LINGER_BEATS = 2  # heartbeat intervals a failing rank waits before it exits (see _fail)


def rank_label(rank: int, master: int = 0) -> str:
    """``rank 0 (master)``, ``rank 2 (worker 1)``: how every message names a rank."""
    return Roles(master, max(rank, master) + 1).label(rank)


def end_process(label: str, reason: str, exc: BaseException, linger: float = 0.0) -> None:
    """Prints ``label: reason`` (one line), records ``exc`` for a launcher's error file
    (torchrun's, the jobs' own: its summary names this rank and the reason) and ends this
    process with status 1; under a launcher's agent after ``linger`` seconds. For what cannot
    be raised where the work waits: a thread's failure while the main thread is blocked in a
    collective that gloo cannot interrupt."""
    print(f"{label}: {reason}", file=sys.stderr, flush=True)
    with contextlib.suppress(Exception):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        time.sleep(linger)
    os._exit(1)


class RankLost(RuntimeError):
    """Another rank died, hung or became unreachable (what the watchdog records)."""


def is_peer_loss(exc: BaseException) -> bool:
    """True for errors that a collective (or the socket data plane) raises when another rank
    died or stalled."""
    import torch.distributed as dist

    if isinstance(exc, (getattr(dist, "DistError", ()), ConnectionError, TimeoutError)):
        return True
    text = str(exc)
    return any(s in text for s in ("Connection closed by peer", "Timed out", "Connection reset"))


def first_line(exc: BaseException) -> str:
    """An error's first line without gloo's source location."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", first)


@dataclass
class Heartbeat:
    """One rank's record in the store."""

    beat: int
    stage_count: int
    stage: str
    ticks: int
    detail: str
    address: str

    def pack(self) -> str:
        values = (self.beat, self.stage_count, self.stage, self.ticks, self.detail, self.address)
        return "|".join(str(v).replace("|", "/") for v in values)

    @classmethod
    def unpack(cls, raw: bytes) -> Heartbeat:
        parts = raw.decode(errors="replace").split("|", FIELDS - 1)
        beat, count, stage, ticks, detail, address = parts + [""] * (FIELDS - len(parts))
        return cls(int(beat or 0), int(count or 0), stage, int(ticks or 0), detail, address)


def address_label() -> str:
    """How the other ranks' lines name this host: its address for them
    (:func:`~coded_shuffle.distributed.transports.sockets.local_address`), else its name."""
    from coded_shuffle.distributed.transports.sockets import local_address

    with contextlib.suppress(OSError):
        return local_address()
    return socket.gethostname()


def default_store_address() -> tuple[str, int]:
    """Where the default process group's TCP store listens (its host and port): the store the
    heartbeats go through, reached over a connection of the watchdog's own."""
    import torch.distributed as dist

    store: Any = dist.distributed_c10d._get_default_store()  # no public accessor (torch 2.13)
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        return store.host, int(store.port)
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    raise RuntimeError(
        f"the default process group's store is a {type(store).__name__}: liveness needs a "
        "TCPStore (init_process_group with env:// or tcp://), or pass heartbeat=0"
    )


WATCHED_WAIT = timedelta(days=7)
"""What a collective may wait while a watchdog runs: long work (an epoch's training, a large
delivery) is no failure, and the watchdog ends the job within its deadline of a lost peer."""


def wait_long(group: Any = None) -> None:
    """Collectives of ``group`` (None: the default group) may wait :data:`WATCHED_WAIT` from
    now on (a job whose rendezvous was bounded by a short timeout, once every rank is
    connected and a watchdog runs)."""
    # torch (2.13) has no public setter of a group's timeout; this is the project's one use
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(WATCHED_WAIT, group)


_running: weakref.WeakSet[Liveness] = weakref.WeakSet()  # started and not stopped


@atexit.register
def _stop_at_exit() -> None:
    """Stops every watchdog still running when the interpreter exits (a loop that never
    closed its ``CodedShuffle``): its threads may sit in a store call, and a daemon thread
    inside torch's C++ at the interpreter's teardown aborts the process."""
    for live in list(_running):
        live.stop()


class Liveness:
    """Publishes this rank's heartbeat and watches everyone's (start/stop; tick and mark)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        deadline: float,
        interval: float,
        store_address: tuple[str, int],
        prefix: str,
        on_progress: Callable[[dict[int, Heartbeat], float], None] | None = None,
        progress_seconds: float = 10.0,
        watch_progress: bool = True,
        master: int = 0,
    ) -> None:
        self.rank, self.world, self.master = rank, world_size, master
        self.deadline, self.interval = deadline, min(interval, deadline / 4)
        self.store_address, self.prefix = store_address, prefix
        self.on_progress, self.progress_seconds = on_progress, progress_seconds
        self.watch_progress = watch_progress
        self.record = Heartbeat(0, 0, "start", 0, "", address_label())
        self.seen: dict[int, Heartbeat] = {}
        self.beat_at: dict[int, float] = {}  # when each rank's heartbeat last moved (our clock)
        self.work_at: dict[int, float] = {}  # when each rank's progress last moved
        self.behind_at: dict[int, float] = {}  # when each rank fell behind the others
        self.t0 = self.stage_since = self.last_line = self.reached = time.monotonic()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a stage changed: publish it now
        self._failing = False
        self._threads: list[threading.Thread] = []
        self._store: Any = None

    @classmethod
    def for_default_group(
        cls, timeout: timedelta, heartbeat: float, prefix: str, **kwargs: Any
    ) -> Liveness:
        """A watchdog for this rank of the default process group, through its store."""
        import torch.distributed as dist

        return cls(
            dist.get_rank(),
            dist.get_world_size(),
            timeout.total_seconds(),
            heartbeat,
            default_store_address(),
            prefix,
            **kwargs,
        )

    # -- called by the work (main thread) ------------------------------------------------

    def mark(self, stage: str) -> None:
        """This rank reached ``stage`` (``"epoch 2 delivered"``)."""
        self.record.stage_count += 1
        self.record.stage = stage
        self.record.detail = ""
        self.stage_since = time.monotonic()
        self._wake.set()  # published at once, so a rank lost now is named where it was

    def tick(self, detail: str | None = None) -> None:
        """Progress inside a stage (a minibatch step, a message)."""
        self.record.ticks += 1
        if detail is not None:
            self.record.detail = detail

    # -- the threads -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return bool(self._threads) and not self._stop.is_set()

    def start(self) -> Liveness:
        self.t0 = self.reached = time.monotonic()
        self._threads = [
            threading.Thread(target=self._run, name="liveness", daemon=True),
            threading.Thread(target=self._guard, name="liveness-guard", daemon=True),
        ]
        for t in self._threads:
            t.start()
        _running.add(self)
        return self

    def stop(self) -> None:
        """Ends both threads (at most a store call's timeout later); idempotent."""
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        _running.discard(self)

    def await_verdict(self, exc: BaseException) -> None:
        """After a collective failed because a peer went away (its sockets closed): waits, up
        to the deadline and a few heartbeats, for the watchdog to name the lost rank and end
        this process with that line; raises :class:`RankLost` if it does not."""
        limit = time.monotonic() + self.deadline + 4 * self.interval
        while time.monotonic() < limit and self.running:
            time.sleep(self.interval / 2)
        reason = self.stalled() or f"no rank lost its heartbeat within {self.deadline:.0f} s"
        raise RankLost(f"{first_line(exc)}; {reason}") from exc

    def await_stage(self, rank: int, prefix: str, seconds: float) -> bool:
        """Until ``rank``'s published stage starts with ``prefix`` (read over a connection of
        its own every 50 ms), at most ``seconds``; whether it did."""
        store, key = self._connect(), f"hb/{rank}"
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if store.check([key]) and Heartbeat.unpack(store.get(key)).stage.startswith(prefix):
                return True
            time.sleep(0.05)
        return False

    def _connect(self) -> Any:
        import torch.distributed as dist

        host, port = self.store_address
        timeout = timedelta(seconds=max(2 * self.interval, 1.0))
        store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
        return dist.PrefixStore(self.prefix, store)

    def _run(self) -> None:
        """A heartbeat at once (a rank that dies early is still known by its address), then
        one every ``interval`` and one at every stage change, until :meth:`stop`."""
        while True:
            self._beat(time.monotonic())
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return

    def _beat(self, now: float) -> None:
        """Publishes this rank's record, reads everyone's, ends the job on a verdict."""
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
            # a rank whose heartbeat stopped while we still reached the store is lost (the
            # store may have gone with the master once it named that rank)
            verdict = self.verdict(now, before=self.reached - 2 * self.interval)
            if verdict:
                self._fail(verdict)
            return
        verdict = self.verdict(now)
        if verdict:
            self._fail(verdict)
        self._progress_line(now)

    def _check_contact(self, now: float) -> None:
        """Ends this process when the store has been out of reach for longer than the deadline
        (this host is cut off from the job)."""
        if now - self.reached > self.deadline and not self._stop.is_set():
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
        """Every rank's record: one ``multi_get`` once all of them have beaten (two round trips
        to the store whatever the world, where a check and a get per rank took ``2 (P - 1)``;
        rank 0's store serves every host's reads)."""
        others = [r for r in range(self.world) if r != self.rank]
        keys = [f"hb/{r}" for r in others]
        if keys and self._store.check(keys):
            found = dict(zip(others, self._store.multi_get(keys), strict=True))
        else:  # at start-up: the ranks that have beaten so far
            found = {
                r: self._store.get(k)
                for r, k in zip(others, keys, strict=True)
                if self._store.check([k])
            }
        for r in range(self.world):
            if r == self.rank:
                self.observe(r, self.record, now)
            elif r in found:
                self.observe(r, Heartbeat.unpack(found[r]), now)
        self.update_behind(now)

    def observe(self, rank: int, record: Heartbeat, now: float) -> None:
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

    def verdict(self, now: float, before: float | None = None) -> str:
        """Why the job must end ('' if it need not): a lost or a hung rank (with ``before``:
        only a rank whose heartbeat stopped before that time, and no hung rank)."""
        for r in range(self.world):
            since = self.beat_at.get(r, self.t0)
            if before is not None and since >= before:
                continue
            if r != self.rank and now - since > self.deadline:
                rec = self.seen.get(r)
                where = f"on {rec.address} at {rec.stage!r}" if rec else "(never started)"
                return (
                    f"{rank_label(r, self.master)} {where} lost: no heartbeat for "
                    f"{now - since:.0f} s (killed, stopped, or its host unreachable)"
                )
        if not self.watch_progress or before is not None:
            return ""
        behind, ahead = self._behind()
        for r in behind:
            # waiting was fine until the others moved on: count from the later of the two
            idle = now - max(self.work_at[r], self.behind_at.get(r, now))
            if idle > self.deadline:
                rec = self.seen[r]
                return (
                    f"{rank_label(r, self.master)} on {rec.address} hung: no progress for "
                    f"{idle:.0f} s at {rec.stage!r} (others reached {ahead!r})"
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
        names = ", ".join(f"{rank_label(r, self.master)} at {self.seen[r].stage!r}" for r in behind)
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
        """Prints ``reason``, records it for the launcher, ends this process (gloo cannot be
        woken from a blocked collective), under a launcher's agent (torchrun, the jobs' own)
        after :data:`LINGER_BEATS` heartbeat intervals: the other survivors reach their verdict
        within about one, and print it before the agent that saw this process end stops
        them."""
        if self._failing:
            return
        self._failing = True
        label = rank_label(self.rank, self.master)
        end_process(label, reason, RankLost(reason), LINGER_BEATS * self.interval)
