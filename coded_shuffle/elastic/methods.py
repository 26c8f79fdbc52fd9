"""The methods of Yang et al. 2018 sec. 4 as runs of the gradient loop: ``coded`` (sec. 3.2),
``nofailure``, ``ignore``, ``repartition`` and ``distr_bgd`` (Elastic Distr-BGD), and the
backtracking line search."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from coded_shuffle.elastic.cyclic import CyclicUsage, GroupCode
from coded_shuffle.elastic.encoding import encode, split_blocks
from coded_shuffle.elastic.generator import Generator, systematic_generator, with_fresh_row
from coded_shuffle.elastic.membership import (
    Event,
    initial_holdings,
    rebalance,
)
from coded_shuffle.elastic.protocol import Message, Op
from coded_shuffle.elastic.rounds import MethodRun
from coded_shuffle.elastic.settings import CODED, UNCODED


class CodedRun(MethodRun):
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


class UncodedRun(MethodRun):
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


RUNS: dict[str, type[MethodRun]] = {
    "coded": CodedRun,
    "nofailure": UncodedRun,
    "ignore": IgnoreRun,
    "repartition": RepartitionRun,
    "distr_bgd": DistrBGDRun,
}
