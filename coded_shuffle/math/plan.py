"""Delivery plans and XOR programs: the index-level description of a coded delivery.

A point is split into ``splits`` equal *sub-points*; sub-point ``j`` of point ``p`` has the
id ``p * splits + j``. A *symbol* is the XOR of a set of sub-points; a plan is the list of
symbols that the master puts on the shared link plus, for every worker, what it caches before
the delivery and which points it must hold after it (docs/model.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class XorBlock:
    """``row[targets[i]] = XOR_c row[sources[i, c]]`` for every ``i`` (rows are independent)."""

    targets: np.ndarray  # (n,) int64
    sources: np.ndarray  # (n, d) int64

    def __len__(self) -> int:
        return int(self.targets.shape[0])


@dataclass(frozen=True)
class DeliveryPlan:
    """One epoch transition: symbols on the link, caches before, batches after."""

    scheme: str
    num_workers: int
    num_points: int
    splits: int
    symbols: tuple[np.ndarray, ...]  # blocks of shape (n_d, d): sub-point ids XORed per symbol
    caches: tuple[np.ndarray, ...]  # per worker: sorted sub-point ids held before the delivery
    new_batches: tuple[np.ndarray, ...]  # per worker: sorted point ids it must hold after it
    breakdown: Mapping[str, int] = field(default_factory=dict)  # symbols per part of the scheme
    # per block, the worker that sends each symbol (a decentralized plan); empty: the master
    senders: tuple[np.ndarray, ...] = ()

    @property
    def plans(self) -> tuple[DeliveryPlan, ...]:
        """The plan's byte parts: itself (the interface it shares with :class:`SharedPlan`)."""
        return (self,)

    @property
    def fractions(self) -> tuple[float, ...]:
        return (1.0,)

    @property
    def num_symbols(self) -> int:
        return int(sum(b.shape[0] for b in self.symbols))

    @property
    def load_points(self) -> float:
        """Information-theoretic load ``R`` in point units (symbols are sub-point sized)."""
        return self.num_symbols / self.splits

    def demands(self, worker: int) -> np.ndarray:
        """Sub-points of ``worker``'s new batch that it does not cache (sorted)."""
        needed = subpoints_of(self.new_batches[worker], self.splits)
        return np.setdiff1d(needed, self.caches[worker], assume_unique=True)

    @property
    def uncoded_points(self) -> float:
        """Load of sending every demanded sub-point once, uncoded
        (docs/model.md, uncoded delivery)."""
        return sum(self.demands(k).size for k in range(self.num_workers)) / self.splits

    def symbol_terms(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CSR view: ``(offsets, symbol_of_term, term)`` over all symbols in order."""
        degrees = np.concatenate(
            [np.full(b.shape[0], b.shape[1], dtype=np.int64) for b in self.symbols]
            or [np.zeros(0, dtype=np.int64)]
        )
        offsets = np.zeros(degrees.size + 1, dtype=np.int64)
        np.cumsum(degrees, out=offsets[1:])
        terms = np.concatenate([b.reshape(-1) for b in self.symbols] or [np.zeros(0, np.int64)])
        symbol_of_term = np.repeat(np.arange(degrees.size, dtype=np.int64), degrees)
        return offsets, symbol_of_term, terms.astype(np.int64, copy=False)


def subpoints_of(points: np.ndarray, splits: int) -> np.ndarray:
    """All sub-point ids of ``points`` (point-major order)."""
    points = np.asarray(points, dtype=np.int64)
    return (points[:, None] * splits + np.arange(splits, dtype=np.int64)).reshape(-1)


def symbol_blocks(rows: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Drops empty blocks and makes every block a contiguous int64 matrix."""
    out = []
    for block in rows:
        b = np.ascontiguousarray(block, dtype=np.int64)
        if b.ndim == 1:
            b = b[:, None]
        if b.shape[0]:
            out.append(b)
    return tuple(out)


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for every pair, vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    offsets = np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths)
    return offsets + np.arange(total, dtype=np.int64)


def new_owners(plan: DeliveryPlan) -> np.ndarray:
    """Per point, the worker whose new batch holds it."""
    owner = np.full(plan.num_points, -1, dtype=np.int64)
    for k, batch in enumerate(plan.new_batches):
        owner[batch] = k
    return owner


def held_at(cache: np.ndarray, ids: np.ndarray) -> np.ndarray | None:
    """Positions of sub-points ``ids`` in a sorted ``cache``, or None if it lacks any."""
    at = np.searchsorted(cache, ids).clip(max=max(cache.size - 1, 0))
    if ids.size and (cache.size == 0 or not np.array_equal(cache[at], ids)):
        return None
    return at


def direct_routes(plan: DeliveryPlan) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """Point-to-point routes of an uncoded plan: per worker, its symbols and who holds them.

    Every symbol of an uncoded plan is one sub-point, demanded by exactly one worker (its new
    owner) and cached by at least one (the lowest such worker is its sender). Returns
    ``(needs, holders)``: ``needs[k]`` the sorted symbol ids worker ``k`` must receive,
    ``holders[k]`` the 0-based worker that caches each of them. Raises ``ValueError`` for a
    coded plan (a symbol of degree > 1 serves several workers at once).
    """
    if any(b.shape[1] != 1 for b in plan.symbols):
        raise ValueError(f"{plan.scheme}: coded symbols cannot travel point to point")
    subs = np.concatenate([b[:, 0] for b in plan.symbols] or [np.zeros(0, np.int64)])
    owner = new_owners(plan)
    holder = np.full(plan.num_points * plan.splits, -1, dtype=np.int64)
    for k in reversed(range(plan.num_workers)):
        holder[plan.caches[k]] = k
    receiver = owner[subs // plan.splits]
    needs = tuple(np.flatnonzero(receiver == k) for k in range(plan.num_workers))
    holders = tuple(holder[subs[n]] for n in needs)
    if any(np.any(h < 0) for h in holders):
        raise ValueError(f"{plan.scheme}: a symbol is cached by no worker")
    return needs, holders


@dataclass(frozen=True)
class SharedPlan:
    """Memory sharing (docs/excess-storage.md, memory sharing): ``plans[i]`` runs on
    ``fractions[i]`` of every point's bytes.

    Every plan has ``plans`` and ``fractions``: a :class:`DeliveryPlan` is the one-part case, so
    code that handles a plan never asks which kind it holds.
    """

    plans: tuple[DeliveryPlan, ...]
    fractions: tuple[float, ...]


Plan = DeliveryPlan | SharedPlan


def plan_load(plan: Plan) -> float:
    """Load in points of a plan: fraction-weighted over its parts
    (docs/excess-storage.md, memory sharing)."""
    return float(sum(p.load_points * f for p, f in zip(plan.plans, plan.fractions, strict=True)))


def byte_parts(point_bytes: int, fractions: tuple[float, ...]) -> tuple[int, ...]:
    """Splits ``point_bytes`` into parts by ``fractions`` (the last part takes the rest)."""
    cuts = [round(point_bytes * f) for f in fractions[:-1]]
    return (*cuts, point_bytes - sum(cuts))


def subpoint_bytes(point_bytes: int, splits: int) -> int:
    """Bytes of one sub-point: ``ceil(B / s)`` (zero padding completes the last one)."""
    return -(-point_bytes // splits)
