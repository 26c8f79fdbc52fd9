"""Elastic events, who is available, who stores which coded row, and the uncoded baselines' rows.

Worker ids are ``1..P`` (the ranks of the job; rank 0 is the master). An event
``{step: s, leave: [ids]}`` pre-empts workers before step ``s``; ``{step: s, join: k}`` admits
``k`` machines (``join: [ids]`` names them). A joining machine takes the lowest free id (a
departed worker's rank) and receives one coded row: its own former row if still unused, else a
departed worker's row, else a fresh combination (Yang et al. 2018 sec.
2.3). Survivors never move data.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coded_shuffle.errors import UsageError

EVENT_KEYS = {"step", "leave", "join"}


@dataclass(frozen=True)
class Event:
    """One elastic event before ``step``: ids that leave, then machines that join."""

    step: int
    leave: tuple[int, ...] = ()
    join_ids: tuple[int, ...] = ()
    join_count: int = 0
    reason: str = "scheduled"

    def describe(self) -> str:
        parts = []
        if self.leave:
            parts.append(f"leave {','.join(map(str, self.leave))}")
        if self.join_ids:
            parts.append(f"join {','.join(map(str, self.join_ids))}")
        elif self.join_count:
            parts.append(f"join {self.join_count}")
        if self.reason == "scheduled":
            return " ".join(parts)
        return f"lost {','.join(map(str, self.leave))} ({self.reason})"


def _ids(value: Any, what: str) -> tuple[int, ...]:
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, Sequence) or isinstance(items, str):
        raise UsageError(f"{what}={value!r} must be a worker id or a list of worker ids")
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            raise UsageError(f"{what}={value!r}: worker ids are integers >= 1")
        out.append(int(item))
    if len(set(out)) != len(out):
        raise UsageError(f"{what}={value!r} repeats a worker id")
    return tuple(out)


def parse_event(raw: Any, steps: int) -> Event:
    """One event from its config mapping; :class:`UsageError` names any bad value."""
    if not isinstance(raw, Mapping):
        raise UsageError(f"elastic event {raw!r} must be a mapping like {{step: 10, leave: [2]}}")
    unknown = set(raw) - EVENT_KEYS
    if unknown:
        raise UsageError(f"elastic event {dict(raw)} has unknown keys {sorted(unknown)}")
    step = raw.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < steps:
        raise UsageError(f"elastic event step={step!r} out of range 0..{steps - 1} (job.steps)")
    if "leave" not in raw and "join" not in raw:
        raise UsageError(f"elastic event at step {step} needs 'leave' and/or 'join'")
    leave = _ids(raw["leave"], f"event step {step} leave") if "leave" in raw else ()
    join = raw.get("join")
    if join is None:
        return Event(step, leave)
    if isinstance(join, int) and not isinstance(join, bool):
        if join < 1:
            raise UsageError(f"event step {step} join={join} must be >= 1 (a count) or a list")
        return Event(step, leave, (), join)
    return Event(step, leave, _ids(join, f"event step {step} join"), 0)


def parse_events(raw: Any, steps: int) -> tuple[Event, ...]:
    """The event list, sorted by distinct steps."""
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise UsageError(f"job.elastic.events={raw!r} must be a list of events")
    events = tuple(parse_event(item, steps) for item in raw)
    for a, b in itertools.pairwise(events):
        if b.step <= a.step:
            raise UsageError(
                f"job.elastic.events must have increasing steps: step {b.step} after {a.step}"
            )
    return events


@dataclass(frozen=True)
class Joined:
    worker: int
    row: int
    fresh: bool


@dataclass
class Membership:
    """Available workers (sorted ids) and the generator row each one stores.

    ``max_workers`` bounds the ids (the job's worker processes); ``None`` lets a simulation
    admit new machines beyond ``P``.
    """

    available: list[int]
    row_of: dict[int, int]
    num_rows: int
    recovery_threshold: int
    max_workers: int | None = None
    former_row: dict[int, int] = field(default_factory=dict)

    @classmethod
    def initial(
        cls, workers: int, recovery_threshold: int, max_workers: int | None = None
    ) -> Membership:
        ids = list(range(1, workers + 1))
        return cls(ids, {i: i - 1 for i in ids}, workers, recovery_threshold, max_workers)

    @property
    def size(self) -> int:
        return len(self.available)

    def known(self) -> int:
        return max([*self.available, *self.former_row, 0])

    def position_rows(self) -> list[int]:
        return [self.row_of[i] for i in self.available]

    def leave(self, ids: Sequence[int], step: int) -> None:
        """Pre-empts ``ids``; stops with a clear message below ``L`` workers."""
        missing = [i for i in ids if i not in self.row_of]
        if missing:
            raise UsageError(
                f"event at step {step}: worker(s) {missing} cannot leave; available: "
                f"{self.available}"
            )
        left = self.size - len(ids)
        if left < self.recovery_threshold:
            raise UsageError(
                f"event at step {step}: the departure of worker(s) {list(ids)} leaves {left} "
                f"worker(s), fewer than the recovery threshold L={self.recovery_threshold}; "
                f"the coded data tolerates at most {self.size - self.recovery_threshold} more "
                "departure(s)"
            )
        for i in ids:
            self.former_row[i] = self.row_of.pop(i)
        self.available = sorted(self.row_of)

    def joining_ids(self, event: Event) -> list[int]:
        """Ids of the machines that join: the named ones, else the lowest free ids."""
        if event.join_ids:
            taken = [i for i in event.join_ids if i in self.row_of]
            if taken:
                raise UsageError(f"event at step {event.step}: worker(s) {taken} already present")
            ids = list(event.join_ids)
        else:
            free = [i for i in range(1, self.known() + 1) if i not in self.row_of]
            ids = (free + list(range(self.known() + 1, self.known() + 1 + event.join_count)))[
                : event.join_count
            ]
        if self.max_workers is not None and max(ids, default=0) > self.max_workers:
            raise UsageError(
                f"event at step {event.step}: joining worker id(s) {ids} exceed the "
                f"{self.max_workers} worker processes of the job (ranks 1..{self.max_workers})"
            )
        return ids

    def join(self, event: Event) -> list[Joined]:
        """Admits the joining machines, each with one coded row (never moving survivors' data)."""
        out = []
        for worker in self.joining_ids(event):
            used = set(self.row_of.values())
            orphans = sorted(set(range(self.num_rows)) - used)
            former = self.former_row.get(worker)
            if former is not None and former not in used:
                row, fresh = former, False
            elif orphans:
                row, fresh = orphans[0], False
            else:
                row, fresh = self.num_rows, True
                self.num_rows += 1
            self.row_of[worker] = row
            self.former_row.pop(worker, None)
            out.append(Joined(worker, row, fresh))
        self.available = sorted(self.row_of)
        return out

    def apply(self, event: Event) -> list[Joined]:
        if event.leave:
            self.leave(event.leave, event.step)
        return self.join(event) if event.join_ids or event.join_count else []

    def state(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "row_of": {str(k): v for k, v in self.row_of.items()},
            "num_rows": self.num_rows,
            "former_row": {str(k): v for k, v in self.former_row.items()},
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.row_of = {int(k): int(v) for k, v in state["row_of"].items()}
        self.available = sorted(self.row_of)
        self.num_rows = int(state["num_rows"])
        self.former_row = {int(k): int(v) for k, v in state["former_row"].items()}


def check_schedule(
    events: Sequence[Event], workers: int, recovery_threshold: int, max_workers: int | None
) -> None:
    """Replays the events on a fresh membership: raises :class:`UsageError` before any run."""
    membership = Membership.initial(workers, recovery_threshold, max_workers)
    for event in events:
        membership.apply(event)


# --- uncoded baselines --------------------------------------------------------------------


def initial_holdings(points: int, ids: Sequence[int]) -> dict[int, np.ndarray]:
    """Contiguous, balanced split of the row ids over ``ids`` (the uncoded placement)."""
    parts = np.array_split(np.arange(points, dtype=np.int64), len(ids))
    return dict(zip(ids, parts, strict=True))


def rebalance(
    holdings: Mapping[int, np.ndarray], available: Sequence[int], points: int
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Uncoded re-partition over ``available`` with the fewest rows moved.

    Every row of a departed worker moves; a worker above its balanced share drops its tail
    (free); workers below it receive rows. Returns the new holdings and the rows sent to each.
    """
    n = len(available)
    current = {i: np.asarray(holdings.get(i, np.zeros(0, np.int64))) for i in available}
    order = sorted(available, key=lambda i: (-current[i].size, i))
    target = {i: points // n + (k < points % n) for k, i in enumerate(order)}
    kept = {i: current[i][: target[i]] for i in available}
    departed = [np.asarray(r) for i, r in holdings.items() if i not in target]
    surplus = [current[i][target[i] :] for i in available]
    pool = np.concatenate([np.zeros(0, np.int64), *departed, *surplus])
    need = np.array([target[i] - kept[i].size for i in available])
    cuts = np.concatenate([[0], np.cumsum(need)])
    sent = {i: pool[cuts[k] : cuts[k + 1]] for k, i in enumerate(available)}
    new = {i: np.concatenate([kept[i], sent[i]]) for i in available}
    return new, sent
