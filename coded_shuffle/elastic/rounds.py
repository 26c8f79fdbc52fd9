"""Message rounds with the workers and what they cost, and one method's run of the gradient
loop (placement, events, gradient rounds, records, checkpoints) that every method shares."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from coded_shuffle.elastic.membership import (
    Event,
    Membership,
)
from coded_shuffle.elastic.problem import Problem
from coded_shuffle.elastic.protocol import Message, Op, WorkerChannel, WorkerLost, digest_ints
from coded_shuffle.elastic.settings import Settings
from coded_shuffle.elastic.sinks import Sink


class Host(Protocol):
    """What a method's run needs of the master that runs it
    (:class:`~coded_shuffle.elastic.runner.ElasticMaster`)."""

    problem: Problem
    settings: Settings
    transport: WorkerChannel
    sink: Sink
    lr: float
    lost: list[int]
    restarts: int

    def save(self, state: dict[str, Any], pending: Sequence[int] = ()) -> None: ...


TIMED = (Op.FORWARD, Op.BACKWARD, Op.GRAD)  # replies carry the worker's compute time


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


class MethodRun(Rounds):
    """One method's run: placement, events, gradient rounds, records, checkpoints."""

    name = ""

    def __init__(self, master: Host, index: int, resume: Mapping[str, Any] | None):
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
                "moved_bytes": self.moved + moved_first,
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
