"""``best``: every epoch, the lowest-load applicable scheme (interfaces: ``--scheme best``).

The candidates come from the registry: every scheme but ``best`` whose
:meth:`~coded_shuffle.schemes.base.Scheme.applicable` accepts ``(N, K, T)``. Schemes can only
be mixed epoch by epoch when they share a placement (what workers store, and how it is
updated), so candidates are grouped by
:meth:`~coded_shuffle.schemes.base.Scheme.placement_family`. With one family (``T = 1``:
uncoded, attia-tandon, cycles, all on whole batches) ``best`` uses it; with several it commits
at the placement to the family whose best member has the lowest load on one probe reshuffle
(seeded, so the choice is reproducible), because the workers cannot change placement later
without extra traffic. Each plan's ``scheme`` names the winner, e.g. ``"best:cycles"``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..delivery import SharedPlan
from ..errors import UsageError
from ..plan import DeliveryPlan
from .base import CacheState, Scheme

PROBE_SEED = 0


def plan_load(plan: DeliveryPlan | SharedPlan) -> float:
    """Load in points of a plan or of a memory-shared plan (fraction-weighted)."""
    if isinstance(plan, SharedPlan):
        return sum(p.load_points * f for p, f in zip(plan.plans, plan.fractions, strict=True))
    return plan.load_points


def probe_reshuffle(assignment: np.ndarray) -> np.ndarray:
    """A seeded random reshuffle *of this assignment* (a permutation of its labels).

    Drawn relative to the assignment, so it moves points even when the assignment itself was
    drawn from the same seed.
    """
    return assignment[np.random.default_rng(PROBE_SEED).permutation(assignment.size)]


def renamed(plan: DeliveryPlan | SharedPlan, scheme: str) -> DeliveryPlan | SharedPlan:
    """The same plan with ``scheme`` as its name (every part of a shared plan)."""
    if isinstance(plan, SharedPlan):
        return SharedPlan(tuple(renamed(p, scheme) for p in plan.plans), plan.fractions)
    return dataclasses.replace(plan, scheme=scheme)


def winner_of(plan: DeliveryPlan | SharedPlan) -> str:
    """The scheme behind a ``best:NAME`` plan."""
    inner = plan.plans[0] if isinstance(plan, SharedPlan) else plan
    return inner.scheme.split(":", 1)[1]


class Best(Scheme):
    """Per epoch, the lowest-load scheme of the chosen placement family."""

    name = "best"
    summary = "per epoch the lowest-load applicable scheme (ties: registry order)"

    def __init__(self) -> None:
        self.members: dict[str, Scheme] | None = None
        self.point_bytes: int | None = None

    def candidates(self, num_points: int, num_workers: int, storage: float) -> dict[str, Scheme]:
        """Every other registered scheme that accepts ``(N, K, T)`` and the point size."""
        from . import REGISTRY

        out: dict[str, Scheme] = {}
        for name, cls in REGISTRY.items():
            if cls is Best or not cls.applicable(num_points, num_workers, storage):
                continue
            scheme = cls()
            if self.point_bytes is not None:
                try:
                    scheme.fit_point_bytes(num_workers, storage, self.point_bytes)
                except UsageError:
                    continue  # its sub-points would be too small for these points
            out[name] = scheme
        return out

    def fit_point_bytes(self, num_workers: int, storage: float, point_bytes: int) -> None:
        """Remembers the point size: candidates that cannot fit it are left out."""
        self.point_bytes = point_bytes

    def check(self, num_points: int, num_workers: int, storage: float) -> None:
        super().check(num_points, num_workers, storage)
        if not self.candidates(num_points, num_workers, storage):
            raise UsageError(
                f"best: no scheme supports N={num_points}, K={num_workers}, T={storage}"
            )

    def families(
        self, num_points: int, num_workers: int, storage: float
    ) -> list[dict[str, Scheme]]:
        """The candidates grouped by placement family (in registry order of first member)."""
        groups: dict[str, dict[str, Scheme]] = {}
        for name, scheme in self.candidates(num_points, num_workers, storage).items():
            groups.setdefault(type(scheme).placement_family(), {})[name] = scheme
        return list(groups.values())

    def initial_state(self, assignment: np.ndarray, num_workers: int, storage: float) -> CacheState:
        """The placement of the chosen family (a probe reshuffle decides between families)."""
        num_points = int(np.asarray(assignment).size)
        self.check(num_points, num_workers, storage)
        families = self.families(num_points, num_workers, storage)
        states = [
            next(iter(f.values())).initial_state(assignment, num_workers, storage) for f in families
        ]
        chosen = 0
        if len(families) > 1:
            probe = probe_reshuffle(np.asarray(assignment))
            loads = [self._best_of(f, s, probe)[0] for f, s in zip(families, states, strict=True)]
            chosen = int(np.argmin(loads))
        self.members = families[chosen]
        return states[chosen]

    def _best_of(
        self, members: dict[str, Scheme], state: CacheState, new_assignment: np.ndarray
    ) -> tuple[float, str, DeliveryPlan | SharedPlan]:
        best = None
        for name, scheme in members.items():
            plan = scheme.plan(state, new_assignment)
            load = plan_load(plan)
            if best is None or load < best[0]:
                best = (load, name, plan)
        assert best is not None
        return best

    def _members(self, state: CacheState) -> dict[str, Scheme]:
        if self.members is not None:
            return self.members
        if state.splits == 1 and state.labels is None:  # a whole-batch placement
            families = self.families(state.num_points, state.num_workers, 1)
            return next(f for f in families if next(iter(f.values())).placement_family() == "batch")
        raise UsageError("best: call initial_state before plan for an excess-storage placement")

    def plan(self, state: CacheState, new_assignment: np.ndarray) -> DeliveryPlan | SharedPlan:
        _, name, plan = self._best_of(self._members(state), state, new_assignment)
        return renamed(plan, f"{self.name}:{name}")

    def next_state(
        self, state: CacheState, plan: DeliveryPlan | SharedPlan, new_assignment: np.ndarray
    ) -> CacheState:
        return self._members(state)[winner_of(plan)].next_state(state, plan, new_assignment)

    def stored_points_max(self, state: CacheState) -> float:
        return next(iter(self._members(state).values())).stored_points_max(state)

    def part_caches(self, state: CacheState, worker: int) -> list[np.ndarray]:
        return next(iter(self._members(state).values())).part_caches(state, worker)
