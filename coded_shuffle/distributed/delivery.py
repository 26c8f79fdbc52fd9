"""One epoch transition end to end: plan, prove, encode, decode, update the worker's store.

A :class:`Delivery` holds one :class:`DeliveryPlan` per *byte part* of a point. Plain schemes
use one part; memory sharing (docs/excess-storage.md, memory sharing) splits every point's bytes
into parts and runs one plan on each. The load of a delivery is the
byte-weighted sum of its parts' loads.
Every delivery is proved decodable by the generic index decoder before any byte is sent.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import torch

from coded_shuffle.codec.buffers import IN_MEMORY, Buffers
from coded_shuffle.codec.decode import (
    StreamDecoder,
    Workspace,
    batch_from_workspace,
    cache_bytes,
    decode_workspace,
)
from coded_shuffle.codec.digest import StreamDigest
from coded_shuffle.codec.encode import Encoder, GatherEncoder, encode
from coded_shuffle.codec.records import Records
from coded_shuffle.costs.wire import framed_parts_bytes
from coded_shuffle.math.index_decoder import decode_plan, decode_worker
from coded_shuffle.math.plan import DeliveryPlan, Plan, byte_parts, subpoint_bytes
from coded_shuffle.math.worker_program import WorkerProgram


def _plans_and_parts(
    plan: Plan, point_bytes: int
) -> tuple[tuple[DeliveryPlan, ...], tuple[int, ...]]:
    return plan.plans, byte_parts(point_bytes, plan.fractions)


@dataclass(frozen=True)
class Delivery:
    """A planned and proved delivery: one plan and one program per worker for every part."""

    plans: tuple[DeliveryPlan, ...]
    parts: tuple[int, ...]  # bytes of every point that each plan carries
    programs: tuple[tuple[WorkerProgram, ...], ...]
    kept: tuple[tuple[np.ndarray, ...], ...] = ()  # :meth:`prove`: the kept symbols only

    def keeps(self, part: int, worker: int) -> np.ndarray:
        """The symbols of ``part`` that ``worker`` keeps (its decoder's, in order)."""
        return self.kept[part][worker] if self.kept else self.programs[part][worker].symbol_ids

    @classmethod
    def prepare(cls, plan: Plan, point_bytes: int) -> Delivery:
        """Proves every part decodable at every worker (raises UndecodableError if not)."""
        plans, parts = _plans_and_parts(plan, point_bytes)
        return cls(plans, parts, tuple(tuple(decode_plan(p)) for p in plans))

    @classmethod
    def prove(cls, plan: Plan, point_bytes: int) -> Delivery:
        """The master's view: every worker's program proved decodable (UndecodableError if
        not), then only the symbols each worker keeps (its routes) are held, not the programs
        (each worker derives its own: at large ``N`` they are most of the plan's memory)."""
        plans, parts = _plans_and_parts(plan, point_bytes)
        kept = tuple(tuple(p.symbol_ids for p in decode_plan(part)) for part in plans)
        return cls(plans, parts, (), kept)

    @classmethod
    def prepare_worker(cls, plan: Plan, point_bytes: int, worker: int) -> Delivery:
        """One worker's view: only its own program is derived; the others' entries are None."""
        plans, parts = _plans_and_parts(plan, point_bytes)
        programs = tuple(
            tuple(decode_worker(p, worker) if k == worker else None for k in range(p.num_workers))
            for p in plans
        )
        for part in programs:
            _ = part[worker].ops  # compiled now (ahead of the delivery), not at the first byte
        return cls(plans, parts, programs)  # type: ignore[arg-type]

    @property
    def point_bytes(self) -> int:
        return sum(self.parts)

    @property
    def num_workers(self) -> int:
        return self.plans[0].num_workers

    @property
    def load_points(self) -> float:
        """Information-theoretic load in points: byte-weighted over the parts."""
        return sum(p.load_points * b for p, b in zip(self.plans, self.parts, strict=True)) / max(
            self.point_bytes, 1
        )

    @property
    def uncoded_points(self) -> float:
        total = sum(p.uncoded_points * b for p, b in zip(self.plans, self.parts, strict=True))
        return total / max(self.point_bytes, 1)

    def breakdown(self) -> dict[str, float]:
        """Symbols per part of the scheme, in point units."""
        out: dict[str, float] = {}
        for plan, b in zip(self.plans, self.parts, strict=True):
            for key, count in plan.breakdown.items():
                out[key] = out.get(key, 0.0) + count / plan.splits * b / max(self.point_bytes, 1)
        return out

    def symbol_bytes(self) -> list[int]:
        """Bytes of one symbol of every part (sub-point size, padding included)."""
        return [subpoint_bytes(b, p.splits) for p, b in zip(self.plans, self.parts, strict=True)]

    def payload_bytes(self) -> int:
        """Bytes of coded symbols on the link, sub-point padding included."""
        sizes = self.symbol_bytes()
        return sum(p.num_symbols * s for p, s in zip(self.plans, sizes, strict=True))

    def link_bytes(self, chunk_bytes: int) -> int:
        """Bytes on the shared link: every part's symbols as framed messages (one stream each)."""
        rows = [p.num_symbols for p in self.plans]
        return framed_parts_bytes(rows, self.symbol_bytes(), chunk_bytes)

    def uncoded_link_bytes(self, chunk_bytes: int) -> int:
        """The same for the uncoded delivery of the same transition (every needed sub-point)."""
        rows = [round(p.uncoded_points * p.splits) for p in self.plans]
        return framed_parts_bytes(rows, self.symbol_bytes(), chunk_bytes)

    def stores_whole_points(self, worker: int, points: np.ndarray) -> bool:
        """Whether ``worker``'s store before this delivery is exactly the whole ``points``
        (sorted): one part, points not split (no excess storage)."""
        plan = self.plans[0]
        return (
            len(self.plans) == 1
            and plan.splits == 1
            and np.array_equal(plan.caches[worker], points)
        )

    def column_slices(self) -> list[slice]:
        edges = np.concatenate([[0], np.cumsum(self.parts)]).astype(int)
        return [slice(int(a), int(b)) for a, b in itertools.pairwise(edges)]

    def encode(self, data: torch.Tensor | Records) -> list[torch.Tensor]:
        """Symbols of every part, each ``(num_symbols, sub_bytes)``."""
        array = data.array if isinstance(data, Records) else data
        if array is None:
            return [e.rows(0, e.shape[0]) for e in self.encoders(data)]
        return [
            encode(p, array[:, cols])
            for p, cols in zip(self.plans, self.column_slices(), strict=True)
        ]

    def encoders(self, data: torch.Tensor | Records) -> list[Encoder | GatherEncoder]:
        """Streaming encoders of every part (symbols encoded run by run as they are sent):
        records held as one array are read where they are, others gathered run by run."""
        array = data.array if isinstance(data, Records) else data
        if array is None:
            assert isinstance(data, Records)
            return [
                GatherEncoder(p, data, c)
                for p, c in zip(self.plans, self.column_slices(), strict=False)
            ]
        return [
            Encoder(p, array[:, cols])
            for p, cols in zip(self.plans, self.column_slices(), strict=True)
        ]

    def decode(
        self, worker: int, symbols: list[torch.Tensor], store: WorkerStore
    ) -> tuple[torch.Tensor, list[Workspace]]:
        """The worker's new batch ``(q, B)`` and its decode workspaces (one per part).

        ``symbols[part]``: the whole broadcast of the part, or only the worker's kept symbols.
        The batch may share memory with the workspaces; :meth:`WorkerStore.updated` copies.
        """
        workspaces = [
            decode_workspace(self.programs[part][worker], symbols[part], store.caches[part])
            for part in range(len(self.plans))
        ]
        return self.batch(worker, workspaces), workspaces

    def decoders(
        self,
        worker: int,
        symbols: list[torch.Tensor],
        store: WorkerStore,
        buffers: Buffers = IN_MEMORY,
        batch_slots: list[str | None] | None = None,
    ) -> list[StreamDecoder]:
        """Streaming decoders of every part: ``symbols[part]`` is the buffer the worker's kept
        symbols arrive in; each decoder runs what it can as rows arrive, into rows from
        ``buffers`` (part ``p``'s batch as ``batch_slots[p]``)."""
        slots = batch_slots or [None] * len(self.plans)
        return [
            StreamDecoder(
                self.programs[part][worker],
                symbols[part],
                store.caches[part],
                buffers,
                slots[part],
            )
            for part in range(len(self.plans))
        ]

    def digest_stream(self, worker: int, decoders: list[StreamDecoder]) -> StreamDigest:
        """The SHA-256 of :meth:`batch`, hashed as the :meth:`decoders` make its points final."""
        return StreamDigest(decoders, lambda works, points: self.batch(worker, works, points))

    def batch(
        self,
        worker: int,
        workspaces: list[Workspace],
        points: slice = slice(None),
        buffers: Buffers = IN_MEMORY,
    ) -> torch.Tensor:
        """The worker's new batch ``(q, B)`` (or its ``points``) from its decoded workspaces
        (one per part): the first part's rows themselves where they are the whole batch (one
        part of whole points), else joined into rows from ``buffers``."""
        pieces = [
            batch_from_workspace(work, self.programs[part][worker], self.parts[part], points)
            for part, work in enumerate(workspaces)
        ]
        if len(pieces) == 1 and pieces[0].is_contiguous():
            return pieces[0]
        out = buffers.empty(pieces[0].shape[0], self.point_bytes)
        return torch.cat(pieces, dim=1, out=out) if len(pieces) > 1 else out.copy_(pieces[0])


@dataclass
class WorkerStore:
    """The bytes one worker stores: per part, its cached sub-points in plan order.

    ``slots[part]``: the :class:`~coded_shuffle.codec.buffers.FileBuffers` slot whose file
    holds that part's rows (None: in memory), so that persisting the store renames the file
    it already is instead of writing a copy."""

    caches: list[torch.Tensor]
    slots: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.slots:
            self.slots = [None] * len(self.caches)

    @classmethod
    def from_master(cls, data: torch.Tensor, delivery: Delivery, worker: int) -> WorkerStore:
        """A worker's store cut from the master's data (initial placement, tests, CLI)."""
        caches = []
        for plan, cols in zip(delivery.plans, delivery.column_slices(), strict=True):
            caches.append(cache_bytes(data[:, cols], plan, worker))
        return cls(caches)

    def updated(
        self,
        workspaces: list[Workspace],
        next_caches: list[np.ndarray],
        buffers: Buffers = IN_MEMORY,
        slots: list[str | None] | None = None,
    ) -> WorkerStore:
        """The store after the delivery: ``next_caches[part]`` sub-points, from cache or
        decode, into ``buffers`` as ``slots[part]`` (the batch itself where the next cache is
        the batch: the decoders wrote it in that slot)."""
        slots = slots or [None] * len(workspaces)
        caches = [
            work.rows(ids, buffers, slot)
            for work, ids, slot in zip(workspaces, next_caches, slots, strict=True)
        ]
        return WorkerStore(caches, list(slots))

    def stored_bytes(self) -> int:
        return int(sum(c.numel() for c in self.caches))
