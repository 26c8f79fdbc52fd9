"""The master's loop: full-batch gradient descent under elastic events, coded and baselines.

Methods (Yang et al. 2018 sec. 4): ``coded`` (sec. 3.2: cyclic use of stored coded blocks, exact
gradient, nothing moves on a departure), ``nofailure`` (uncoded, all ``P`` workers, scheduled
events ignored), ``ignore`` (uncoded; a departed worker's rows are dropped from the gradient
until a joiner receives them) and ``repartition`` (uncoded; the rows of departed workers are
re-sent to survivors, with the fewest rows moved).

The loop talks to workers only through a :class:`~.protocol.WorkerChannel`, so the same code runs
simulated workers in one process and real ones over torch.distributed. Every step writes one
record; every step is checkpointed, and a restarted master resumes from the checkpoint, treats
the workers lost in the crash as departed and first verifies every survivor's stored data.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from coded_shuffle.codec.blockstore import array_digest
from coded_shuffle.elastic.cyclic import CyclicUsage, GroupCode
from coded_shuffle.elastic.encoding import block_rows, encode, split_blocks
from coded_shuffle.elastic.generator import KINDS, Generator, systematic_generator, with_fresh_row
from coded_shuffle.elastic.membership import (
    Event,
    Membership,
    check_schedule,
    initial_holdings,
    parse_events,
    rebalance,
)
from coded_shuffle.elastic.problem import Problem
from coded_shuffle.elastic.protocol import Message, Op, WorkerChannel, WorkerLost, digest_ints
from coded_shuffle.errors import UsageError

METHODS = ("coded", "nofailure", "ignore", "repartition", "distr_bgd")
CODED, UNCODED = 0, 1  # store slots
TIMED = (Op.FORWARD, Op.BACKWARD, Op.GRAD)  # replies carry the worker's compute time


@dataclass(frozen=True)
class Settings:
    """Validated job settings (``workers`` is ``P``, ``recovery_threshold`` is ``L``)."""

    workers: int
    recovery_threshold: int
    steps: int
    events: tuple[Event, ...] = ()
    methods: tuple[str, ...] = METHODS
    generator: str = "gaussian"
    seed: int = 0
    max_condition: float = 1e6
    lr: float | None = None
    max_workers: int | None = None
    step_delay: float = 0.0
    line_search: bool = False


def make_settings(
    workers: int,
    recovery_threshold: int,
    steps: int,
    events: Any = None,
    methods: Sequence[str] = METHODS,
    generator: str = "gaussian",
    seed: int = 0,
    max_condition: float = 1e6,
    lr: float | None = None,
    max_workers: int | None = None,
    step_delay: float = 0.0,
    valid_methods: Sequence[str] = METHODS,
    line_search: bool = False,
) -> Settings:
    """Checks every value and replays the events (:class:`UsageError` on the first bad one);
    ``methods`` must come from ``valid_methods`` (the job's)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 2:
        raise UsageError(f"workers P={workers!r} must be an integer >= 2")
    size = recovery_threshold
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size < workers:
        raise UsageError(
            f"job.elastic.recovery_threshold L={size!r} out of range 1..{workers - 1} (P-1)"
        )
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise UsageError(f"job.steps={steps!r} must be an integer >= 1")
    methods = tuple(methods)
    bad = [m for m in methods if m not in valid_methods]
    if not methods or bad or len(set(methods)) != len(methods):
        raise UsageError(
            f"job.elastic.methods={list(methods)} must list distinct names from "
            f"{list(valid_methods)}"
        )
    if generator not in KINDS:
        raise UsageError(f"job.elastic.generator={generator!r}; valid: {', '.join(KINDS)}")
    if step_delay < 0:
        raise UsageError(f"job.elastic.step_delay={step_delay} must be >= 0")
    parsed = parse_events(events, steps)
    check_schedule(parsed, workers, size, max_workers)
    return Settings(
        workers,
        size,
        steps,
        parsed,
        methods,
        generator,
        int(seed),
        float(max_condition),
        lr,
        max_workers,
        float(step_delay),
        bool(line_search),
    )


# --- records and checkpoints ---------------------------------------------------------------


class Sink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def truncate(self, keep: Callable[[dict[str, Any]], bool]) -> None: ...


@dataclass
class ListSink:
    records: list[dict[str, Any]] = field(default_factory=list)

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def truncate(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        self.records = [r for r in self.records if keep(r)]


@dataclass
class JsonlSink:
    """``metrics.jsonl``: one JSON object per line, flushed after every step."""

    path: Path

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def truncate(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # blank, or cut short by a kill mid-write
                continue
            if keep(record):
                kept.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(ln + "\n" for ln in kept))
        os.replace(tmp, self.path)


class Checkpoint(Protocol):
    def save(self, state: dict[str, Any]) -> None: ...

    def load(self) -> dict[str, Any] | None: ...


@dataclass
class MemoryCheckpoint:
    state: dict[str, Any] | None = None

    def save(self, state: dict[str, Any]) -> None:
        self.state = pickle.loads(pickle.dumps(state))

    def load(self) -> dict[str, Any] | None:
        return None if self.state is None else pickle.loads(pickle.dumps(self.state))


@dataclass
class FileCheckpoint:
    """The master's checkpoint file, replaced atomically after every step."""

    path: Path

    def save(self, state: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def load(self) -> dict[str, Any] | None:
        try:
            with open(self.path, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return None


# --- the master --------------------------------------------------------------------------


class ElasticMaster:
    """Runs every configured method in turn; resumes from ``checkpoint`` after a crash."""

    def __init__(
        self,
        problem: Problem,
        settings: Settings,
        transport: WorkerChannel,
        sink: Sink | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        self.problem = problem
        self.settings = settings
        self.transport = transport
        self.sink = sink if sink is not None else ListSink()
        self.checkpoint = checkpoint if checkpoint is not None else MemoryCheckpoint()
        self.lr = problem.step_size(settings.lr)
        self.lost: list[int] = []
        self.restarts = 0
        self.state: dict[str, Any] = {}
        self.fingerprint = fingerprint(problem, settings)

    def run(self, killed: Sequence[int] | None = None) -> None:
        """All methods from the checkpoint on; ``killed``: workers that died since it was saved.

        A restarted master learns of losses from the transport when it can tell (``killed``:
        ranks whose process died without an exit record); otherwise from the checkpoint's
        ``pending_lost``, the worker whose connection failed mid-step. The first is
        authoritative: when the launcher tears the job down, a survivor's connection may fail
        before the dead worker's does.
        """
        saved = self.checkpoint.load()
        if saved is not None and (
            saved.get("finished") or saved.get("fingerprint") != self.fingerprint
        ):
            saved = None  # a finished run, or another configuration: start afresh
        if saved is None:
            self.sink.truncate(lambda r: False)
        start = 0
        self.lost = sorted(set(killed or ()))
        if saved is not None:
            self.restarts = int(saved["restarts"]) + 1
            losses = saved["pending_lost"] if killed is None else killed
            saved = {**saved, "pending_lost": sorted(set(losses))}
            self.lost = sorted({*saved["lost"], *saved["pending_lost"]})
            start = int(saved["method_index"])
            order = self.settings.methods
            done = (start, int(saved["step"]))
            self.sink.truncate(
                lambda r: (
                    (order.index(r["method"]), r["step"]) < done
                    if r.get("method") in order
                    else True
                )
            )
        try:
            for index in range(start, len(self.settings.methods)):
                resume = saved if saved is not None and index == start else None
                RUNS[self.settings.methods[index]](self, index, resume).loop()
        except UsageError as exc:  # too few workers left: the run is over, even if restarted
            self.state = {"finished": True, "stopped": str(exc), "fingerprint": self.fingerprint}
            self.checkpoint.save(self.state)
            raise
        self.state = {"finished": True, "fingerprint": self.fingerprint}
        self.checkpoint.save(self.state)

    def save(self, state: dict[str, Any], pending: Sequence[int] = ()) -> None:
        self.state = {**state, "lost": self.lost, "pending_lost": list(pending)}
        self.state["fingerprint"] = self.fingerprint
        self.state["restarts"] = self.restarts
        self.checkpoint.save(self.state)

    def summary(self) -> dict[str, Any]:
        p = self.problem
        return {
            "points": p.num_points,
            "features": p.features,
            "workers": self.settings.workers,
            "recovery_threshold": self.settings.recovery_threshold,
            "block_rows": block_rows(p.num_points, self.settings.recovery_threshold),
            "lr": self.lr,
            "ridge": p.ridge,
            "methods": list(self.settings.methods),
            "events": [{"step": e.step, "text": e.describe()} for e in self.settings.events],
        }


def fingerprint(problem: Problem, settings: Settings) -> str:
    """What a checkpoint must match to be resumed: the settings and the data."""
    h = array_digest(np.column_stack([problem.X, problem.y]))
    return f"{settings!r}|ridge={problem.ridge!r}|{h.hex()}"


class Rounds:
    """Message rounds with the workers and what they cost: ``comm`` (bytes of the step's
    rounds), ``moved`` (data sent to workers), ``compute`` (the slowest worker per timed
    round, seconds). Shared by the gradient runs and the product runs."""

    comm: int
    moved: int
    compute: float

    def send(self, requests: Mapping[int, Message]) -> dict[int, Message]:
        raise NotImplementedError

    def exchange(self, requests: Mapping[int, Message], moved: bool = False) -> dict[int, Message]:
        """One round with the workers; bytes go to ``comm``, or to ``moved`` for data."""
        replies = self.send(requests)
        sent = sum(msg.nbytes for msg in requests.values())
        self.comm += sum(msg.nbytes for msg in replies.values()) + (0 if moved else sent)
        self.moved += sent if moved else 0
        if replies and all(m.op in TIMED for m in requests.values()):
            self.compute += max(int(r.ints[0]) for r in replies.values()) * 1e-9  # the slowest
        return replies

    def store(self, worker: int, slot: int, data: np.ndarray, row: int, new: bool) -> None:
        message = Message.make(Op.STORE, [slot, *data.shape, row, int(new)], data)
        self.exchange({worker: message}, moved=True)

    def place_expected(self, expected: Mapping[int, tuple[int, np.ndarray, int]]) -> int:
        """Verifies the workers' stores by digest; sends what is missing or stale; returns the
        bytes sent."""
        self.moved = 0
        replies = self.exchange(
            {i: Message.make(Op.VERIFY, [slot]) for i, (slot, _, _) in expected.items()}
        )
        for i, (slot, data, row) in expected.items():
            if not np.array_equal(replies[i].ints[3:], digest_ints(data)):
                self.store(i, slot, data, row, new=False)
        return self.moved


class _Run(Rounds):
    """One method's run: placement, events, gradient rounds, records, checkpoints."""

    name = ""

    def __init__(self, master: ElasticMaster, index: int, resume: Mapping[str, Any] | None):
        s = master.settings
        self.m, self.index, self.problem = master, index, master.problem
        self.membership = Membership.initial(s.workers, s.recovery_threshold, s.max_workers)
        self.w = np.zeros(self.problem.features)
        self.step = 0
        self.pending: list[int] = []
        self.resumed = resume is not None
        self.comm = self.moved = 0
        self.compute = self.coding = 0.0  # this step's seconds: workers' rounds, master's coding
        if resume is None:
            lost = [i for i in master.lost if i in self.membership.row_of]
            if lost:
                self.membership.leave(lost, 0)
            self.fresh()
        else:
            self.membership.restore(resume["membership"])
            self.w = np.array(resume["w"], dtype=np.float64)
            self.step = int(resume["step"])
            self.pending = [i for i in resume["pending_lost"] if i in self.membership.row_of]
            self.restore(resume)

    # hooks -----------------------------------------------------------------------------
    def fresh(self) -> None: ...

    def restore(self, resume: Mapping[str, Any]) -> None: ...

    def extra_state(self) -> dict[str, Any]:
        return {}

    def expected(self) -> dict[int, tuple[int, np.ndarray, int]]:
        """Per available worker: the slot, the array it must hold, and its row id."""
        raise NotImplementedError

    def apply(self, event: Event) -> int:
        raise NotImplementedError

    def gradient(self, w: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        raise NotImplementedError

    # shared machinery --------------------------------------------------------------------
    def send(self, requests: Mapping[int, Message]) -> dict[int, Message]:
        """The transport's round; a lost worker checkpoints the step before the error."""
        try:
            return self.m.transport.exchange(requests)
        except WorkerLost as lost:
            self.m.save(self.checkpoint_state(), pending=lost.workers)
            raise

    def place(self) -> int:
        """Every available worker's store verified (workers lost in a crash, ``pending``, are
        skipped: they leave at the first step)."""
        return self.place_expected(
            {i: v for i, v in self.expected().items() if i not in self.pending}
        )

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "method_index": self.index,
            "step": self.step,
            "w": self.w.copy(),
            "membership": self.membership.state(),
            **self.extra_state(),
        }

    def loop(self) -> None:
        s, problem = self.m.settings, self.problem
        self.comm = 0
        placed = self.place()
        placement, moved_first = (0, placed) if self.resumed else (placed, 0)
        if self.pending:
            lost_event = Event(self.step, tuple(self.pending), reason="process died, job restarted")
        while self.step < s.steps:
            t0 = time.perf_counter()
            self.moved, texts = 0, []
            self.compute = self.coding = 0.0
            events = [e for e in s.events if e.step == self.step]
            if self.pending:
                events.insert(0, lost_event)
                self.m.lost = sorted({*self.m.lost, *self.pending})
                self.pending = []
            for event in events:
                text = self.handle(event)
                if text:
                    texts.append(text)
            grad, extra = self.gradient(self.w)
            elapsed = time.perf_counter() - t0
            exact = problem.gradient(self.w)
            loss = problem.loss(self.w)
            record = {
                "method": self.name,
                "step": self.step,
                "workers_available": self.membership.size,
                "train_loss": loss,
                "grad_rel_error": float(
                    np.linalg.norm(grad - exact) / max(np.linalg.norm(exact), 1e-300)
                ),
                "bytes_moved": self.moved + moved_first,
                "placement_bytes": placement,
                "test_loss": problem.test_loss(self.w),
                "comm_bytes": self.comm,
                "step_seconds": elapsed,
                "compute_seconds": self.compute,
                "decode_seconds": self.coding,
                "comm_seconds": max(elapsed - self.compute - self.coding, 0.0),
                "events": texts,
                "restarts": self.m.restarts,
                **extra,
            }
            lr = self.m.lr if not s.line_search else armijo_step(problem, self.w, grad, self.m.lr)
            record["lr"] = lr
            placement = moved_first = self.comm = 0
            self.w = self.w - lr * grad
            self.step += 1
            self.m.sink.write(record)
            self.m.save(self.checkpoint_state())
            if s.step_delay:
                time.sleep(s.step_delay)

    def handle(self, event: Event) -> str:
        """Applies ``event``; returns its description for the record ('' if not applied)."""
        self.apply(event)
        return event.describe()

    def uncoded_gradient(self, w: np.ndarray) -> tuple[np.ndarray, int]:
        replies = self.exchange(
            {i: Message.make(Op.GRAD, floats=w) for i in self.membership.available}
        )
        t0 = time.perf_counter()
        total = self.combine({i: r.floats for i, r in replies.items()})
        rows = round(float(total[-1]))
        grad = total[:-1] / max(rows, 1) + self.problem.ridge * w
        self.coding += time.perf_counter() - t0
        return grad, rows

    def combine(self, partials: Mapping[int, np.ndarray]) -> np.ndarray:
        """The sum of the workers' partial gradients (and row counts)."""
        return sum(partials.values())


LINE_SEARCH_GROWTH = 4.0  # the first trial step is this times 1 / smoothness
LINE_SEARCH_HALVINGS = 30
ARMIJO = 1e-4


def armijo_step(problem: Problem, w: np.ndarray, grad: np.ndarray, base: float) -> float:
    """Backtracking line search (the paper's experiments, sec. 4): from ``4 * base``, halve
    until ``f(w - a g) <= f(w) - 1e-4 a |g|^2``, at most 30 times (then the last trial).

    The trial losses are evaluated at the master on the full training data (its copy; a
    distributed evaluation would cost one more round-1 exchange per trial), the same rule
    for every method, so a method's steps differ only through its gradient.
    """
    now, slope = problem.loss(w), float(grad @ grad)
    step = LINE_SEARCH_GROWTH * base
    for _ in range(LINE_SEARCH_HALVINGS):
        if problem.loss(w - step * grad) <= now - ARMIJO * step * slope:
            return step
        step /= 2
    return step


class CodedRun(_Run):
    """Sec. 3.2 of Yang et al. 2018: two rounds per step over the cyclic usage of stored blocks."""

    name = "coded"

    def fresh(self) -> None:
        s = self.m.settings
        self.generator = systematic_generator(
            s.workers, s.recovery_threshold, s.generator, s.seed, s.max_condition
        )
        self._encode()

    def restore(self, resume: Mapping[str, Any]) -> None:
        self.fresh()
        rows = np.asarray(resume["generator_rows"])
        self.generator = Generator(
            self.generator.kind,
            self.generator.recovery_threshold,
            rows,
            self.generator.seed,
            float(resume["worst_condition"]),
            bool(resume["condition_exact"]),
        )
        self._encode()

    def _encode(self) -> None:
        """Encoding at the master, once (eq. (1)); repeated only to add a fresh row."""
        size = self.m.settings.recovery_threshold
        self.blocks = split_blocks(self.problem.X, size)
        self.targets = split_blocks(self.problem.y, size)
        self.coded = encode(self.blocks, self.generator.rows)
        self._code: tuple[tuple[int, ...], GroupCode] | None = None

    def extra_state(self) -> dict[str, Any]:
        return {
            "generator_rows": self.generator.rows.copy(),
            "worst_condition": self.generator.worst_condition,
            "condition_exact": self.generator.exact,
        }

    def expected(self) -> dict[int, tuple[int, np.ndarray, int]]:
        return {i: (CODED, self.coded[r], r) for i, r in self.membership.row_of.items()}

    def apply(self, event: Event) -> int:
        joined = self.membership.apply(event)
        for j in joined:
            if j.fresh:
                self.generator = with_fresh_row(self.generator, self.m.settings.max_condition)
                fresh = encode(self.blocks, self.generator.rows[-1])
                self.coded = np.concatenate([self.coded, fresh])
            self.store(j.worker, CODED, self.coded[j.row], j.row, new=True)
        return len(joined)

    def group_code(self) -> GroupCode:
        key = tuple(self.membership.available) + tuple(self.membership.position_rows())
        if self._code is None or self._code[0] != key:
            usage = CyclicUsage(
                self.membership.size, self.m.settings.recovery_threshold, self.blocks.shape[1]
            )
            rows = self.generator.rows[self.membership.position_rows()]
            self._code = (key, GroupCode.build(usage, rows))
        return self._code[1]

    def gradient(self, w: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        code, ids = self.group_code(), self.membership.available
        usage = code.usage
        first = {}
        for pos, i in enumerate(ids):
            starts, stops = usage.spans(pos)
            first[i] = Message.make(Op.FORWARD, [usage.recovery_threshold, *starts, *stops], w)
        replies = self.exchange(first)
        t0 = time.perf_counter()
        xw = code.decode([replies[i].floats for i in ids])
        back = code.reencode(xw - self.targets)
        self.coding += time.perf_counter() - t0
        partial = self.exchange(
            {i: Message.make(Op.BACKWARD, floats=back[pos]) for pos, i in enumerate(ids)}
        )
        t0 = time.perf_counter()
        total = sum(r.floats for r in partial.values())
        grad = total / self.problem.num_points + self.problem.ridge * w
        self.coding += time.perf_counter() - t0
        return grad, {
            "rows_used_max": int(usage.rows_used().max()),
            "rows_used_min": int(usage.rows_used().min()),
            "cond_max": float(code.conditions.max()),
        }


class UncodedRun(_Run):
    """Uncoded rows ``[id, x, y]`` at every worker; one round (``X_p^T (X_p w - y_p)``)."""

    name = "nofailure"

    def fresh(self) -> None:
        self.holdings = initial_holdings(self.problem.num_points, self.membership.available)
        self.lost_parts: dict[int, np.ndarray] = {}

    def restore(self, resume: Mapping[str, Any]) -> None:
        self.holdings = {int(k): np.asarray(v) for k, v in resume["holdings"].items()}
        self.lost_parts = {int(k): np.asarray(v) for k, v in resume["lost_parts"].items()}

    def extra_state(self) -> dict[str, Any]:
        return {"holdings": dict(self.holdings), "lost_parts": dict(self.lost_parts)}

    def rows_array(self, ids: np.ndarray) -> np.ndarray:
        p = self.problem
        return np.column_stack([ids.astype(np.float64), p.X[ids], p.y[ids]])

    def expected(self) -> dict[int, tuple[int, np.ndarray, int]]:
        return {i: (UNCODED, self.rows_array(r), -1) for i, r in self.holdings.items()}

    def handle(self, event: Event) -> str:
        if event.reason == "scheduled" and self.name == "nofailure":
            return ""  # the no-failure baseline ignores scheduled events
        return super().handle(event)

    def apply(self, event: Event) -> int:
        """Real losses in the no-failure run: re-partition to keep the gradient exact."""
        return self.repartition(event)

    def repartition(self, event: Event) -> int:
        before = dict(self.holdings)
        joined = {j.worker for j in self.membership.apply(event)}
        new, sent = rebalance(before, self.membership.available, self.problem.num_points)
        for i in self.membership.available:
            kept = before.get(i, np.zeros(0, np.int64)) if i not in joined else np.zeros(0, int)
            drop = np.setdiff1d(kept, new[i])
            if i in joined or drop.size or sent[i].size:
                data = self.rows_array(sent[i])
                ints = [drop.size, *drop, *data.shape, int(i in joined)]
                self.exchange({i: Message.make(Op.UPDATE, ints, data)}, moved=True)
        self.holdings = new
        return 0

    def gradient(self, w: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        grad, rows = self.uncoded_gradient(w)
        sizes = [self.holdings[i].size for i in self.membership.available]
        return grad, {
            "rows_used_max": int(max(sizes)),
            "rows_used_min": int(min(sizes)),
            "rows_total": rows,
        }


class RepartitionRun(UncodedRun):
    name = "repartition"


class IgnoreRun(UncodedRun):
    """Departed rows are dropped; a joiner receives one lost part (its own id's, if lost)."""

    name = "ignore"

    def apply(self, event: Event) -> int:
        if event.leave:
            self.membership.leave(event.leave, event.step)
            for i in event.leave:
                self.lost_parts[i] = self.holdings.pop(i)
        if not (event.join_ids or event.join_count):
            return 0
        for j in self.membership.join(event):
            key = j.worker if j.worker in self.lost_parts else min(self.lost_parts, default=None)
            rows = self.lost_parts.pop(key) if key is not None else np.zeros(0, np.int64)
            self.holdings[j.worker] = rows
            self.taken(key)
            self.store(j.worker, UNCODED, self.rows_array(rows), -1, new=True)
        return 0

    def taken(self, part: int | None) -> None:
        """A joiner took over the lost part of worker ``part``."""


class DistrBGDRun(IgnoreRun):
    """Elastic Distr-BGD (Yang et al. 2018's baseline, its ref. [49]): a departed worker's last
    partial gradient stands in for its part, stale, until a joiner takes the part over."""

    name = "distr_bgd"

    def fresh(self) -> None:
        super().fresh()
        self.last: dict[int, np.ndarray] = {}

    def restore(self, resume: Mapping[str, Any]) -> None:
        super().restore(resume)
        self.last = {int(k): np.asarray(v) for k, v in resume["last_partials"].items()}

    def extra_state(self) -> dict[str, Any]:
        return {**super().extra_state(), "last_partials": dict(self.last)}

    def combine(self, partials: Mapping[int, np.ndarray]) -> np.ndarray:
        self.last.update(partials)
        stale = [self.last[i] for i in self.lost_parts if i in self.last]
        return sum(partials.values()) + sum(stale)

    def taken(self, part: int | None) -> None:
        if part is not None:
            self.last.pop(part, None)


RUNS: dict[str, type[_Run]] = {
    "coded": CodedRun,
    "nofailure": UncodedRun,
    "ignore": IgnoreRun,
    "repartition": RepartitionRun,
    "distr_bgd": DistrBGDRun,
}


def simulate(
    problem: Problem,
    settings: Settings,
    root: str | os.PathLike[str],
    checkpoint: Checkpoint | None = None,
) -> list[dict[str, Any]]:
    """Single-process run with simulated workers (stores under ``root``); returns the records."""
    from coded_shuffle.elastic.protocol import LocalChannel

    master = ElasticMaster(problem, settings, LocalChannel(root), ListSink(), checkpoint)
    master.run()
    assert isinstance(master.sink, ListSink)
    return master.sink.records


__all__ = [
    "METHODS",
    "ElasticMaster",
    "FileCheckpoint",
    "JsonlSink",
    "ListSink",
    "MemoryCheckpoint",
    "Settings",
    "make_settings",
    "simulate",
]
