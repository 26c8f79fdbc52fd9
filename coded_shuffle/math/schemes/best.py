"""``best``: every epoch, the lowest-load applicable scheme (docs/schemes.md).

The candidates come from the registry: every scheme but ``best`` whose
:meth:`~coded_shuffle.math.schemes.base.Scheme.applicable` accepts ``(N, K, T)``. Schemes can only
be mixed epoch by epoch when they share a placement (what workers store, and how it is
updated), so candidates are grouped by
:meth:`~coded_shuffle.math.schemes.base.Scheme.placement_family`. At ``T = 1`` it takes the
whole-batch family (uncoded, attia-tandon, cycles) without a probe; with several it commits
at the placement to the family whose best member has the lowest worst case: the larger of its
loads on the cyclic shift and on one probe reshuffle (seeded, so the choice is reproducible;
on a tie the lower probe load), because the workers cannot change placement later without
extra traffic. Each plan's ``scheme`` names the winner, e.g. ``"best:cycles"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from coded_shuffle.errors import UsageError
from coded_shuffle.math.plan import DeliveryPlan, Plan, SharedPlan, plan_load
from coded_shuffle.math.schemes.base import Scheme
from coded_shuffle.math.shuffles import cyclic_shuffle
from coded_shuffle.math.state import CacheState

PROBE_SEED = 0


def probe_reshuffle(assignment: np.ndarray) -> np.ndarray:
    """A seeded random reshuffle *of this assignment* (a permutation of its labels).

    Drawn relative to the assignment, so it moves points even when the assignment itself was
    drawn from the same seed.
    """
    return assignment[np.random.default_rng(PROBE_SEED).permutation(assignment.size)]


def renamed(plan: Plan, scheme: str) -> Plan:
    """The same plan with ``scheme`` as its name (every part of a shared plan)."""
    parts = tuple(dataclasses.replace(p, scheme=scheme) for p in plan.plans)
    return parts[0] if isinstance(plan, DeliveryPlan) else SharedPlan(parts, plan.fractions)


def _family(members: dict[str, Scheme]) -> str:
    return type(next(iter(members.values()))).placement_family()


def winner_of(plan: Plan) -> str:
    """The scheme behind a ``best:NAME`` plan."""
    return plan.plans[0].scheme.split(":", 1)[1]


class Best(Scheme):
    """Per epoch, the lowest-load scheme of the chosen placement family.

    The family chosen at the placement travels in the state (``CacheState.members``), so the
    object holds nothing but its point size.
    """

    name = "best"
    summary = "per epoch the lowest-load applicable scheme (ties: registry order)"
    registry: ClassVar[Mapping[str, type[Scheme]]] = {}  # set by the scheme registry

    def member(self, name: str) -> Scheme:
        return self.registry[name](self.point_bytes)

    def candidates(self, num_points: int, num_workers: int, storage: float) -> dict[str, Scheme]:
        """Every other registered scheme the master sends that accepts ``(N, K, T)`` and the
        point size."""
        out: dict[str, Scheme] = {}
        for name, cls in self.registry.items():
            if cls is Best or cls.sender != "master":
                continue
            if not cls.applicable(num_points, num_workers, storage):
                continue
            scheme = self.member(name)
            try:
                scheme.check_point_bytes(num_workers, storage)
            except UsageError:
                continue  # its sub-points would be too small for these points
            out[name] = scheme
        return out

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
        if storage == 1:
            # Every family stores whole batches at T = 1, and the excess-storage ones deliver
            # the lower of their code and `cycles`: they won none of 180 random probes
            # (K <= 32, N/K <= 30), while probing them costs 130 s and 5 GB at N = 10^7
            # (scripts/bench_scale.py). The batch family is taken without a probe.
            families = [f for f in families if _family(f) == "batch"] or families
        states = [
            next(iter(f.values())).initial_state(assignment, num_workers, storage) for f in families
        ]
        chosen = 0
        if len(families) > 1:
            chosen = self._family_choice(families, states, np.asarray(assignment), num_workers)
        return dataclasses.replace(states[chosen], members=tuple(families[chosen]))

    def _family_choice(
        self,
        families: list[dict[str, Scheme]],
        states: list[CacheState],
        assignment: np.ndarray,
        num_workers: int,
    ) -> int:
        """The family with the lowest worst case: the larger of its best member's loads on the
        cyclic shift (the centralized schemes' worst shuffle, docs/model.md) and on the probe
        reshuffle; on a tie, the lower load on the probe, then registry order."""
        probe = probe_reshuffle(assignment)
        shift = cyclic_shuffle(assignment, num_workers)
        keys = []
        for members, state in zip(families, states, strict=True):
            on_probe = self._best_of(members, state, probe)[0]
            on_shift = self._best_of(members, state, shift)[0]
            keys.append((round(max(on_probe, on_shift), 9), round(on_probe, 9)))
        return min(range(len(families)), key=keys.__getitem__)

    def _best_of(
        self, members: dict[str, Scheme], state: CacheState, new_assignment: np.ndarray
    ) -> tuple[float, str, Plan]:
        best = None
        for name, scheme in members.items():
            plan = scheme.plan(state, new_assignment)
            load = plan_load(plan)
            if best is None or load < best[0]:
                best = (load, name, plan)
        assert best is not None
        return best

    def _members(self, state: CacheState) -> dict[str, Scheme]:
        if state.members:
            return {name: self.member(name) for name in state.members}
        if state.splits == 1 and state.labels is None:  # a whole-batch placement
            families = self.families(state.num_points, state.num_workers, 1)
            return next(f for f in families if _family(f) == "batch")
        raise UsageError("best: call initial_state before plan for an excess-storage placement")

    def plan(self, state: CacheState, new_assignment: np.ndarray) -> Plan:
        _, name, plan = self._best_of(self._members(state), state, new_assignment)
        return renamed(plan, f"{self.name}:{name}")

    def next_state(self, state: CacheState, plan: Plan, new_assignment: np.ndarray) -> CacheState:
        members = self._members(state)
        nxt = members[winner_of(plan)].next_state(state, plan, new_assignment)
        return dataclasses.replace(nxt, members=tuple(members))

    def stored_points_max(self, state: CacheState) -> float:
        return next(iter(self._members(state).values())).stored_points_max(state)

    def part_caches(self, state: CacheState, worker: int) -> list[np.ndarray]:
        return next(iter(self._members(state).values())).part_caches(state, worker)
