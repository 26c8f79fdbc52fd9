"""Elmahdy-Mohajer coded shuffling with excess storage (Elmahdy & Mohajer 2018;
docs/excess-storage.md).

Placement (Elmahdy & Mohajer 2018, Section III): the point processed by worker ``h`` is split into
``C(K-1, t-1)`` sub-points labelled by the ``(t-1)``-subsets ``L`` of the other workers;
worker ``k != h`` caches the sub-points whose label contains ``k``. Every sub-point is known by
``L + {h}``: exactly ``t`` workers, and every worker stores ``t * q`` points.

Delivery for general ``N = q*K`` (Section VI-A): the shuffle's worker-to-worker multigraph is
``q``-regular, so it splits into ``q`` permutations (a maximum-cycle Birkhoff split, fixed points
first); each permutation is a canonical ``N = K`` problem on its own ``K`` points. For one
permutation in which worker ``k`` needs the point of worker ``pi(k)``, the sub-message of a
``t``-subset ``S`` is (the case checked by hand in docs/excess-storage.md, generalised)::

    X_S = XOR_{k in S} ( F_{pi(k)}^{S - k}  XOR  F_k^{S - k} )

where ``F_j^L`` with ``j in L`` is the *virtual* sub-point ``XOR_{a not in L} F_j^{L - j + a}``
(so ``F_k^{S-k}`` and ``F_{pi(k)}^{S-k}`` are both known to every member of ``S`` but ``k``, and
``k`` gets one equation in its own unknowns). With one representative per cycle of ``pi``
(fixed points are cycles) and ``u`` one of them (the *ignored worker*), the master sends
``X_S`` for every ``S`` of the other ``K-1`` workers except the subsets of the other
representatives: ``C(K-1, t) - C(g-1, t)`` sub-messages (Theorem 2; ``(K-t)/t`` points for a
single cycle, Theorem 1). Every plan is proved by the generic index decoder before use.

The project's additions (not in the paper): on random shuffles the delivery is the lowest of
the split above, the clique cover (:mod:`.clique_cover`: XOR multicasts across the
permutations) and, up to ``K = 8``, a mix of every permutation's code with the cliques
(:func:`permutations_and_cliques`: an LP by column generation, then whole uses by a MILP).

Update (Section IV, cache update and relabelling): the new processor ``h'`` keeps the point
whole; in the labels of a moved point ``h'`` is replaced by ``h``, so the old processor keeps
exactly the sub-points it must cache, and the structure is the same in every epoch.

The rooms: :mod:`.placement`, :mod:`.split` (the permutation split), :mod:`.delivery` (each
permutation's sub-messages), :mod:`.mix` (permutation codes with the clique cover); here, the
plan of a transition and the scheme.
"""

from __future__ import annotations

import numpy as np

from coded_shuffle.math.plan import DeliveryPlan
from coded_shuffle.math.schemes.base import batch_plan_fields
from coded_shuffle.math.schemes.clique_cover import (
    cover_problem,
    lower_with_clique_cover,
)
from coded_shuffle.math.schemes.cycles import Cycles
from coded_shuffle.math.schemes.elmahdy_mohajer.delivery import (
    SubProblems,
    em_symbol_rows,
    rows_with_points,
    sub_message_rows,
    sub_problems,
)
from coded_shuffle.math.schemes.elmahdy_mohajer.mix import (
    PermutationCodes,
    integer_uses,
    permutation_codes,
    permutation_uses,
    permutations_and_cliques,
    priced_permutations,
)
from coded_shuffle.math.schemes.elmahdy_mohajer.placement import (
    EMLabels,
    em_caches,
    em_initial_state,
    em_next_state,
    em_splits,
    em_state,
    label_rank,
    label_table,
)
from coded_shuffle.math.schemes.elmahdy_mohajer.split import (
    best_split,
    cycle_decomposition,
    cycles_of,
    heuristic_split,
    improve_split,
    max_cycle_permutation,
    pack_cycles,
    permutation_split,
    split_load,
    split_method,
    split_rows,
)
from coded_shuffle.math.schemes.memory_sharing import CornerScheme, grouped_blocks
from coded_shuffle.math.state import CacheState


def _symbols(blocks: tuple) -> int:
    return int(sum(b.shape[0] for b in blocks))


def em_plan(
    state: CacheState, new_assignment: np.ndarray, scheme: str, key: str | None = None
) -> DeliveryPlan:
    """The cycle-aware E-M delivery (Theorems 2 and 4 of Elmahdy & Mohajer 2018) for one transition.

    At ``t = 1`` (no excess storage) the lower of it and the project's ``cycles`` delivery
    of the same placement (``key (cycles)`` in the breakdown when that one is used): never
    worse than ``cycles``. At ``t >= 2`` the lowest of it, the clique cover, which codes
    across the permutations (:mod:`.clique_cover`), and the mix of permutation codes and
    cliques (:func:`permutations_and_cliques`); not tried when the shuffle is one permutation
    (``q = 1``), where E-M's code meets the lower bound of Theorem 3. The breakdown's key says
    how the shuffle was split into permutations (:func:`split_method`), or ``clique cover``
    or ``permutations + cliques``.
    """
    key = key or f"t={state.labels.t}"
    method = split_method(state.num_workers, new_assignment.size // state.num_workers)
    blocks = grouped_blocks(em_symbol_rows(state, new_assignment))
    count = int(sum(b.shape[0] for b in blocks))
    fields = batch_plan_fields(state, new_assignment)
    if state.labels.t == 1:
        plain = Cycles().plan(state, new_assignment)
        if plain.num_symbols < count:
            return DeliveryPlan(
                scheme=scheme,
                symbols=plain.symbols,
                breakdown={f"{key} (cycles)": plain.num_symbols},
                **fields,
            )
    named = f"{key} ({method})" if method else key
    breakdown = {named: count}
    if state.labels.t >= 2 and new_assignment.size > state.num_workers:  # q = 1: Theorem 3
        problem = cover_problem(state, new_assignment)
        blocks, breakdown = lower_with_clique_cover(problem, blocks, breakdown, key)
        mixed = permutations_and_cliques(state, new_assignment, problem)
        mixed = grouped_blocks(mixed) if mixed is not None else None
        if mixed is not None and _symbols(mixed) < _symbols(blocks):
            blocks, breakdown = mixed, {f"{key} (permutations + cliques)": _symbols(mixed)}
    return DeliveryPlan(scheme=scheme, symbols=blocks, breakdown=breakdown, **fields)


class ElmahdyMohajer(CornerScheme):
    """Elmahdy-Mohajer: optimal worst-case load ``q(K-t)/t`` at integer ``T = t``."""

    name = "elmahdy-mohajer"
    summary = "excess storage T: cycle-aware E-M delivery, memory sharing between integer T"
    # at N/K = 100, T = 2 a plan and its proof take ~10 s each at K = 32, ~45 s at K = 48
    max_workers = 32

    def corners(self, num_workers: int) -> list[tuple[int, float, int, float]]:
        k = num_workers
        return [(t, float(t), em_splits(k, t), (k - t) / t) for t in range(1, k + 1)]

    def corner_state(self, assignment: np.ndarray, num_workers: int, param: int) -> CacheState:
        return em_initial_state(assignment, num_workers, param)

    def corner_plan(self, state: CacheState, new_assignment: np.ndarray) -> DeliveryPlan:
        return em_plan(state, new_assignment, self.name)

    def corner_next(self, state: CacheState, new_assignment: np.ndarray) -> CacheState:
        return em_next_state(state, new_assignment)


__all__ = [
    "EMLabels",
    "ElmahdyMohajer",
    "PermutationCodes",
    "SubProblems",
    "best_split",
    "cycle_decomposition",
    "cycles_of",
    "em_caches",
    "em_initial_state",
    "em_next_state",
    "em_plan",
    "em_splits",
    "em_state",
    "em_symbol_rows",
    "heuristic_split",
    "improve_split",
    "integer_uses",
    "label_rank",
    "label_table",
    "max_cycle_permutation",
    "pack_cycles",
    "permutation_codes",
    "permutation_split",
    "permutation_uses",
    "permutations_and_cliques",
    "priced_permutations",
    "rows_with_points",
    "split_load",
    "split_method",
    "split_rows",
    "sub_message_rows",
    "sub_problems",
]
