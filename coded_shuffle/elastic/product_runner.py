"""The master's loop for elastic matrix products (``job=elastic_matmul``, Yang et al. 2018 sec. 4).

One product per step with a fresh right factor (``x`` or ``B``, seeded by the step), under
the same elastic events as gradient descent. Methods:

* ``coded``: the cyclic usage of the stored coded blocks (:mod:`.products`); nothing moves
  on a departure, a joiner receives one coded block.
* ``uncoded``: ``A``'s rows split over the available workers, re-balanced with the fewest
  rows moved on every event (:func:`~.membership.rebalance`).
* ``nonadaptive``: MDS-coded computation: every available worker multiplies its whole
  coded block, the master decodes from the ``L`` fastest and never re-balances the work.

Every record has the exact product's relative error (computed at the master, not timed) and
the step's time split into the workers' compute (the slowest worker the method waits for),
the master's coding (encoding ``B`` and decoding) and the rest (communication and waiting).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from coded_shuffle.elastic.cyclic import CyclicUsage, GroupCode
from coded_shuffle.elastic.generator import systematic_generator, with_fresh_row
from coded_shuffle.elastic.membership import Event, Membership, initial_holdings, rebalance
from coded_shuffle.elastic.products import (
    COLUMN_CODED,
    ROW_CODED,
    coded_blocks,
    layout_for,
    mds_recover,
    recover,
    right_factors,
)
from coded_shuffle.elastic.protocol import Message, Op, WorkerChannel
from coded_shuffle.elastic.rounds import Rounds
from coded_shuffle.elastic.settings import Settings
from coded_shuffle.elastic.sinks import ListSink, Sink
from coded_shuffle.errors import UsageError

PRODUCT_METHODS = ("coded", "uncoded", "nonadaptive")
CODED, UNCODED = 0, 1  # store slots
NS = 1e-9


@dataclass(frozen=True)
class ProductProblem:
    """``A`` (``rows x cols``) and the right factors: ``rhs_cols = 1`` is ``A x``."""

    a: np.ndarray
    rhs_cols: int
    seed: int

    @property
    def rows(self) -> int:
        return int(self.a.shape[0])

    @property
    def layout(self) -> str:
        return layout_for(self.rhs_cols)

    def right(self, step: int) -> np.ndarray:
        """The step's right factor: ``x`` (a vector) or ``B`` (``cols x rhs_cols``)."""
        rng = np.random.default_rng([self.seed, 1, step])
        shape = (self.a.shape[1],) if self.rhs_cols == 1 else (self.a.shape[1], self.rhs_cols)
        return rng.standard_normal(shape)


def check_product_sizes(
    rows: int, cols: int, rhs_cols: int, workers: int, recovery_threshold: int
) -> None:
    """Refuses sizes whose coded blocks cannot be cut into ``P`` sub-blocks (one line)."""
    for key, value in (("rows", rows), ("cols", cols), ("rhs_cols", rhs_cols)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"job.problem.{key}={value!r} must be an integer >= 1")
    need = recovery_threshold * workers
    key, value = ("rows", rows) if rhs_cols == 1 else ("cols", cols)
    if value < need:
        what = "A x (Algorithm 1) splits rows" if rhs_cols == 1 else "A B (sec. 3.1) splits cols"
        raise UsageError(
            f"job.problem.{key}={value} does not split: {what} into L={recovery_threshold} "
            f"blocks of at least P={workers} sub-blocks; need {key} >= {need}"
        )


def make_product_problem(
    rows: int, cols: int, rhs_cols: int, workers: int, recovery_threshold: int, seed: int = 0
) -> ProductProblem:
    """A random ``A`` (seeded) of checked size."""
    check_product_sizes(rows, cols, rhs_cols, workers, recovery_threshold)
    a = np.random.default_rng([seed, 0]).standard_normal((rows, cols))
    return ProductProblem(a, rhs_cols, seed)


class ProductRun(Rounds):
    """One method: placement, events, one product per step, a record per step."""

    name = ""

    def __init__(
        self, problem: ProductProblem, settings: Settings, transport: WorkerChannel, sink: Sink
    ) -> None:
        self.problem, self.settings, self.transport, self.sink = problem, settings, transport, sink
        self.membership = Membership.initial(
            settings.workers, settings.recovery_threshold, settings.max_workers
        )
        self.comm = self.moved = 0
        self.compute = 0.0
        self.fresh()

    # hooks -------------------------------------------------------------------------------
    def fresh(self) -> None: ...

    def expected(self) -> dict[int, tuple[int, np.ndarray, int]]:
        """Per available worker: the slot, the array it must hold, and its row id."""
        raise NotImplementedError

    def apply(self, event: Event) -> None:
        raise NotImplementedError

    def product(self, right: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        raise NotImplementedError

    # shared machinery ----------------------------------------------------------------------
    def send(self, requests: Mapping[int, Message]) -> dict[int, Message]:
        return self.transport.exchange(requests)

    def place(self) -> int:
        return self.place_expected(self.expected())

    def ask(self, requests: Mapping[int, Message]) -> tuple[dict[int, Message], dict[int, float]]:
        """One round of products; the workers' compute seconds (wall) from their replies."""
        replies = self.exchange(requests)
        return replies, {i: int(r.ints[0]) * NS for i, r in replies.items()}

    def loop(self) -> None:
        s = self.settings
        self.comm = 0
        placement = self.place()
        for step in range(s.steps):
            self.moved, texts = 0, []
            for event in (e for e in s.events if e.step == step):
                self.apply(event)
                texts.append(event.describe())
            right = self.problem.right(step)
            self.comm = 0
            t0 = time.perf_counter()
            result, info = self.product(right)
            elapsed = time.perf_counter() - t0
            exact = self.problem.a @ right
            error = np.linalg.norm(result - exact) / max(float(np.linalg.norm(exact)), 1e-300)
            coding = float(info.pop("decode_seconds"))
            compute = float(info.pop("compute_seconds"))
            self.sink.write(
                {
                    "method": self.name,
                    "step": step,
                    "workers_available": self.membership.size,
                    "result_rel_error": float(error),
                    "step_seconds": elapsed,
                    "compute_seconds": compute,
                    "decode_seconds": coding,
                    "comm_seconds": max(elapsed - compute - coding, 0.0),
                    "comm_bytes": self.comm,
                    "moved_bytes": self.moved,
                    "placement_bytes": placement,
                    "events": texts,
                    **info,
                }
            )
            placement = 0
            if s.step_delay:
                time.sleep(s.step_delay)


class CodedProducts(ProductRun):
    """Algorithm 1 / sec. 3.1 over the cyclic usage of the stored coded blocks."""

    name = "coded"
    layout_fixed: str | None = None

    @property
    def layout(self) -> str:
        return self.layout_fixed or self.problem.layout

    def fresh(self) -> None:
        s = self.settings
        self.generator = systematic_generator(
            s.workers, s.recovery_threshold, s.generator, s.seed, s.max_condition
        )
        self.blocks = coded_blocks(self.problem.a, self.generator.rows, self.layout)
        self._code: tuple[tuple[int, ...], GroupCode] | None = None

    def expected(self) -> dict[int, tuple[int, np.ndarray, int]]:
        return {i: (CODED, self.blocks[r], r) for i, r in self.membership.row_of.items()}

    def apply(self, event: Event) -> None:
        """A departure moves nothing; a joiner gets one coded block (a fresh row if needed)."""
        for joined in self.membership.apply(event):
            if joined.fresh:
                self.generator = with_fresh_row(self.generator, self.settings.max_condition)
                row = self.generator.rows[-1:]
                fresh = coded_blocks(self.problem.a, row, self.layout)
                self.blocks = np.concatenate([self.blocks, fresh])
            self.store(joined.worker, CODED, self.blocks[joined.row], joined.row, new=True)

    def group_code(self) -> GroupCode:
        key = tuple(self.membership.available) + tuple(self.membership.position_rows())
        if self._code is None or self._code[0] != key:
            usage = CyclicUsage(
                self.membership.size, self.settings.recovery_threshold, self.blocks.shape[1]
            )
            rows = self.generator.rows[self.membership.position_rows()]
            self._code = (key, GroupCode.build(usage, rows))
        return self._code[1]

    def product(self, right: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """Coding time: encoding ``B`` (eq. (7)) and decoding (Algorithm 1) or the sum."""
        code, ids, layout = self.group_code(), self.membership.available, self.layout
        usage = code.usage
        t0 = time.perf_counter()
        factors = right_factors(code, right, layout)
        coding = time.perf_counter() - t0
        requests = {}
        for pos, i in enumerate(ids):
            starts, stops = usage.spans(pos)
            spans = [int(layout == COLUMN_CODED), CODED, usage.recovery_threshold, *starts, *stops]
            factor = factors[pos].reshape(factors[pos].shape[0], -1)
            requests[i] = Message.make(Op.PRODUCT, [*spans, *factor.shape], factor)
        replies, compute = self.ask(requests)
        t1 = time.perf_counter()
        shape = (-1,) if right.ndim == 1 else (-1, right.shape[1])
        results = [replies[i].floats.reshape(shape) for i in ids]
        result = recover(code, results, self.problem.rows, layout)
        coding += time.perf_counter() - t1
        used = usage.rows_used()
        return result, {
            "compute_seconds": max(compute.values()),
            "compute_cpu_seconds": max(int(r.ints[1]) * NS for r in replies.values()),
            "decode_seconds": coding,
            "rows_used_max": int(used.max()),
            "rows_used_min": int(used.min()),
            "cond_max": float(code.conditions.max()),
        }


class NonAdaptiveProducts(CodedProducts):
    """MDS-coded computation: whole blocks at every available worker, the first ``L`` decode."""

    name = "nonadaptive"
    layout_fixed = ROW_CODED

    def product(self, right: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        ids, size = self.membership.available, self.settings.recovery_threshold
        factor = right.reshape(right.shape[0], -1)
        message = Message.make(Op.PRODUCT, [0, CODED, 0, *factor.shape], factor)
        replies, compute = self.ask({i: message for i in ids})
        t0 = time.perf_counter()
        fastest = sorted(ids, key=lambda i: (compute[i], i))[:size]
        shape = (-1,) if right.ndim == 1 else (-1, right.shape[1])
        rows = self.generator.rows[[self.membership.row_of[i] for i in fastest]]
        results = [replies[i].floats.reshape(shape) for i in fastest]
        result = mds_recover(rows, results, self.problem.rows)
        return result, {
            "compute_seconds": compute[fastest[-1]],
            "compute_cpu_seconds": max(int(replies[i].ints[1]) * NS for i in fastest),
            "decode_seconds": time.perf_counter() - t0,
            "rows_used_max": int(self.blocks.shape[1]),
            "rows_used_min": int(self.blocks.shape[1]),
        }


class UncodedProducts(ProductRun):
    """``A``'s rows over the available workers, re-balanced on every event."""

    name = "uncoded"

    def fresh(self) -> None:
        self.holdings = initial_holdings(self.problem.rows, self.membership.available)

    def rows_array(self, ids: np.ndarray) -> np.ndarray:
        return np.column_stack([ids.astype(np.float64), self.problem.a[ids]])

    def expected(self) -> dict[int, tuple[int, np.ndarray, int]]:
        return {i: (UNCODED, self.rows_array(r), -1) for i, r in self.holdings.items()}

    def apply(self, event: Event) -> None:
        """Re-partition with the fewest rows moved; the master tracks each store's row order
        (kept rows, then the ones sent)."""
        before = dict(self.holdings)
        joined = {j.worker for j in self.membership.apply(event)}
        new, sent = rebalance(before, self.membership.available, self.problem.rows)
        order = {}
        for i in self.membership.available:
            kept = np.zeros(0, np.int64) if i in joined else before.get(i, np.zeros(0, np.int64))
            drop = np.setdiff1d(kept, new[i])
            order[i] = np.concatenate([kept[~np.isin(kept, drop)], sent[i]])
            if i in joined or drop.size or sent[i].size:
                data = self.rows_array(sent[i])
                ints = [drop.size, *drop, *data.shape, int(i in joined)]
                self.exchange({i: Message.make(Op.UPDATE, ints, data)}, moved=True)
        self.holdings = order

    def product(self, right: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        ids = self.membership.available
        factor = right.reshape(right.shape[0], -1)
        message = Message.make(Op.PRODUCT, [0, UNCODED, 0, *factor.shape], factor)
        replies, compute = self.ask({i: message for i in ids})
        t0 = time.perf_counter()
        result = np.empty((self.problem.rows, factor.shape[1]))
        for i in ids:
            result[self.holdings[i]] = replies[i].floats.reshape(-1, factor.shape[1])
        result = result.reshape(self.problem.rows) if right.ndim == 1 else result
        sizes = [self.holdings[i].size for i in ids]
        return result, {
            "compute_seconds": max(compute.values()),
            "compute_cpu_seconds": max(int(r.ints[1]) * NS for r in replies.values()),
            "decode_seconds": time.perf_counter() - t0,
            "rows_used_max": int(max(sizes)),
            "rows_used_min": int(min(sizes)),
        }


PRODUCT_RUNS: dict[str, type[ProductRun]] = {
    "coded": CodedProducts,
    "uncoded": UncodedProducts,
    "nonadaptive": NonAdaptiveProducts,
}


def run_products(
    problem: ProductProblem, settings: Settings, transport: WorkerChannel, sink: Sink
) -> None:
    """Every configured method in turn, on the same worker stores."""
    for name in settings.methods:
        PRODUCT_RUNS[name](problem, settings, transport, sink).loop()


def simulate_products(
    problem: ProductProblem, settings: Settings, root: str | os.PathLike[str]
) -> list[dict[str, Any]]:
    """Single-process run with simulated workers (stores under ``root``); the records."""
    from coded_shuffle.elastic.protocol import LocalChannel

    sink = ListSink()
    run_products(problem, settings, LocalChannel(root), sink)
    return sink.records
