"""Master-worker messages and the worker's side of the elastic job, free of any transport.

A message is an opcode, an int64 vector and a float64 vector; on the link it is a 3-int64
header (opcode and the two lengths) followed by the two vectors, and :attr:`Message.nbytes`
counts all of it. :class:`WorkerNode` is everything a worker does; the torch.distributed job
and the single-process simulation (:class:`LocalChannel`) both drive it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Protocol

import numpy as np

from coded_shuffle.codec.blockstore import BlockStore, array_digest
from coded_shuffle.elastic.cyclic import worker_backward, worker_forward
from coded_shuffle.elastic.products import COLUMN_CODED, ROW_CODED, worker_product

HEADER_INTS = 3
SLOTS = ("coded", "uncoded")  # uncoded rows are stored as [row id, x..., y]


class Op(IntEnum):
    STOP = 0
    VERIFY = 1  # ints [slot] -> ints [present, rows, cols, digest(4)]
    STORE = 2  # ints [slot, rows, cols, row_id, new_machine] floats data -> ints digest(4)
    UPDATE = 3  # ints [n_drop, drop ids..., rows, cols] floats rows -> ints digest(4)
    FORWARD = 4  # ints [L, starts..., stops...] floats w -> ints [ns] floats X~_used w
    BACKWARD = 5  # floats r -> ints [ns] floats X~_used^T r
    GRAD = 6  # floats w -> ints [ns] floats [X_p^T (X_p w - y_p), rows]
    # ns: the worker's compute time for the reply (wall nanoseconds)
    NOOP = 7  # keep-alive for an idle worker, no reply
    HELLO = 8  # -> ints [previous incarnation ended cleanly: 1, killed: 0, first: -1]
    PRODUCT = 9  # ints [layout, slot, n, starts..., stops..., r, c] floats right (r x c)
    #             -> ints [wall ns, cpu ns] floats (used or used^T) @ right
    PEERS = 10  # ints [steps, L, b, N] floats [lr, ridge, G (P x L), y blocks (L x b)]
    #             -> no reply: the workers run the master-free loop (.peers, sec. 3.3)


@dataclass(frozen=True)
class Message:
    op: int
    ints: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    floats: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))

    @classmethod
    def make(cls, op: int, ints: object = (), floats: object = ()) -> Message:
        return cls(
            int(op),
            np.ascontiguousarray(ints, dtype=np.int64).reshape(-1),
            np.ascontiguousarray(floats, dtype=np.float64).reshape(-1),
        )

    @property
    def nbytes(self) -> int:
        """Bytes on the link: header, ints and floats."""
        return 8 * HEADER_INTS + self.ints.nbytes + self.floats.nbytes


def digest_ints(array: np.ndarray) -> np.ndarray:
    return np.frombuffer(array_digest(array), dtype="<i8").astype(np.int64)


class WorkerLost(RuntimeError):
    """The connection to these workers failed mid-step (a pre-empted or killed process)."""

    def __init__(self, workers: list[int]) -> None:
        super().__init__(f"lost worker(s) {workers}")
        self.workers = workers


class WorkerNode:
    """One worker: its persistent store and the two rounds of the coded gradient."""

    def __init__(self, store: BlockStore) -> None:
        self.store = store
        self._used: tuple[bytes, np.ndarray] | None = None
        self._operand: tuple[bytes, np.ndarray] | None = None

    def handle(self, msg: Message) -> Message:
        if msg.op in (Op.FORWARD, Op.BACKWARD, Op.GRAD):
            start = time.perf_counter_ns()
            reply = self._compute(msg)
            return Message(reply.op, np.array([time.perf_counter_ns() - start]), reply.floats)
        op, ints, floats = Op(msg.op), msg.ints, msg.floats
        if op is Op.VERIFY:
            array = self.store.load(SLOTS[ints[0]])
            if array is None:
                return Message.make(op, np.zeros(7, np.int64))
            return Message.make(op, [1, *array.shape, *digest_ints(array)])
        if op is Op.STORE:
            slot, rows, cols, row_id, new_machine = (int(v) for v in ints)
            if new_machine:
                self.store.wipe()
            self._used = self._operand = None
            data = floats.reshape(rows, cols)
            self.store.save(SLOTS[slot], data, {"row": row_id})
            return Message.make(op, digest_ints(data))
        if op is Op.UPDATE:
            self._operand = None
            return Message.make(op, digest_ints(self._update(ints, floats)))
        if op is Op.PRODUCT:
            return self._product(ints, floats)
        raise ValueError(f"unexpected opcode {op}")

    def _compute(self, msg: Message) -> Message:
        """The gradient rounds (their compute is timed by :meth:`handle`)."""
        op, ints, floats = Op(msg.op), msg.ints, msg.floats
        if op is Op.FORWARD:
            size = int(ints[0])
            key = ints.tobytes()
            if self._used is None or self._used[0] != key:
                block = self._slot("coded")
                starts, stops = ints[1 : 1 + size], ints[1 + size : 1 + 2 * size]
                used = np.concatenate([block[a:b] for a, b in zip(starts, stops, strict=True)])
                self._used = (key, used)
            return Message.make(op, floats=worker_forward(self._used[1], floats))
        if op is Op.BACKWARD:
            if self._used is None:
                raise RuntimeError("BACKWARD before FORWARD")
            return Message.make(op, floats=worker_backward(self._used[1], floats))
        if op is Op.GRAD:
            rows = self.store.load("uncoded")
            if rows is None or rows.shape[0] == 0:
                return Message.make(op, floats=np.zeros(floats.size + 1))
            x, y = rows[:, 1:-1], rows[:, -1]
            return Message.make(op, floats=[*(x.T @ (x @ floats - y)), rows.shape[0]])
        raise ValueError(f"unexpected opcode {op}")

    def _product(self, ints: np.ndarray, floats: np.ndarray) -> Message:
        """Elastic products (:mod:`.products`): the used rows of a slot (all of them when no
        spans are given; an uncoded slot without its id column) times the right factor."""
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        layout, slot, size = (int(v) for v in ints[:3])
        key = ints[: 3 + 2 * size].tobytes()
        if self._operand is None or self._operand[0] != key:
            stored = self._slot(SLOTS[slot])
            stored = stored[:, 1:] if SLOTS[slot] == "uncoded" else stored
            if size:
                starts, stops = ints[3 : 3 + size], ints[3 + size : 3 + 2 * size]
                stored = np.concatenate([stored[a:b] for a, b in zip(starts, stops, strict=True)])
            self._operand = (key, stored)
        right = floats.reshape(int(ints[-2]), int(ints[-1]))
        out = worker_product(self._operand[1], right, (ROW_CODED, COLUMN_CODED)[layout])
        took = [time.perf_counter_ns() - wall, time.thread_time_ns() - cpu]
        return Message.make(Op.PRODUCT, took, out)

    def _slot(self, slot: str) -> np.ndarray:
        array = self.store.load(slot)
        if array is None:
            raise RuntimeError(f"worker store {self.store.root} has no valid {slot} slot")
        return array

    def _update(self, ints: np.ndarray, floats: np.ndarray) -> np.ndarray:
        n_drop = int(ints[0])
        drop = ints[1 : 1 + n_drop]
        rows, cols, new_machine = (int(v) for v in ints[1 + n_drop : 4 + n_drop])
        if new_machine:
            self.store.wipe()
        current = self.store.load("uncoded")
        if current is None:
            current = np.zeros((0, cols))
        keep = current[~np.isin(current[:, 0].astype(np.int64), drop)]
        data = np.concatenate([keep, floats.reshape(rows, cols)])
        self.store.save("uncoded", data)
        return data


class WorkerChannel(Protocol):
    """Sends one request to each listed worker and returns their replies.

    Raises :class:`WorkerLost` naming the first worker whose connection failed.
    """

    def exchange(self, requests: Mapping[int, Message]) -> dict[int, Message]: ...


class LocalChannel:
    """Simulated workers in this process, each with its own store under ``root/worker_<id>``.

    ``kill(worker)`` makes the next exchange with that worker fail, like a killed process.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.nodes: dict[int, WorkerNode] = {}
        self.killed: set[int] = set()

    def node(self, worker: int) -> WorkerNode:
        if worker not in self.nodes:
            self.nodes[worker] = WorkerNode(BlockStore(self.root / f"worker_{worker}"))
        return self.nodes[worker]

    def kill(self, worker: int) -> None:
        self.killed.add(worker)

    def exchange(self, requests: Mapping[int, Message]) -> dict[int, Message]:
        dead = sorted(set(requests) & self.killed)
        if dead:
            raise WorkerLost(dead[:1])
        return {w: self.node(w).handle(m) for w, m in requests.items()}
