"""The project's mix of E-M's permutation codes with the clique cover (beyond the paper): an LP
by column generation over every permutation's code, then whole uses by a MILP."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from math import comb

import numpy as np
from scipy.sparse import csc_matrix, csr_matrix

from coded_shuffle.math.schemes.clique_cover import (
    CoverProblem,
    DemandTypes,
    cover_columns,
    cover_lp_with_prices,
    cover_rows,
)
from coded_shuffle.math.schemes.elmahdy_mohajer.delivery import rows_with_points, sub_message_rows
from coded_shuffle.math.schemes.elmahdy_mohajer.placement import _comb_table
from coded_shuffle.math.schemes.elmahdy_mohajer.split import cycles_of
from coded_shuffle.math.state import CacheState

PERMUTATION_CODE_WORKERS = 8  # E-M's permutation codes join the cover up to this K (8! priced)
PRICED_PER_ROUND = 100  # column generation: codes added per LP at most
PERMUTATION_MILP_NODES = 100  # branch-and-bound nodes of the whole uses' MILP at most


@functools.cache
def _all_needs(num_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Every permutation of the workers but the identity, as ``needs`` (worker ``k`` needs the
    point of ``needs[k]``), and its number of cycles (fixed points included)."""
    needs = np.array(list(itertools.permutations(range(num_workers)))[1:], dtype=np.int64)
    return needs, np.array([len(cycles_of(p)) for p in needs], dtype=np.int64)


def permutation_uses(types: DemandTypes, needs: np.ndarray) -> csr_matrix:
    """``(types, permutations)``: the sub-points of each type that one use of a permutation's
    code serves (one point per arc ``needs[k] -> k``: one sub-point of each of its types)."""
    workers = np.arange(needs.shape[1])
    holds = ((types.others[None, :] >> workers[:, None]) & 1).astype(bool)  # (K, types)
    uses = np.zeros((needs.shape[0], types.demander.size), dtype=np.int8)
    for k in workers:
        mine = types.demander == k
        moving = needs[:, k] != k
        uses[moving] += (holds[needs[moving, k]] & mine[None, :]).astype(np.int8)
    return csr_matrix(uses.T)


@dataclass(frozen=True)
class PermutationCodes:
    """E-M's code of every permutation of the workers as a column of the cover."""

    needs: np.ndarray  # (codes, K): worker k needs the point of needs[c, k]
    uses: csc_matrix  # (types, codes): sub-points of each type one use serves
    costs: np.ndarray  # (codes,): symbols per use, C(K-1,t) - C(g-1,t) for g cycles


def permutation_codes(types: DemandTypes, num_workers: int, t: int) -> PermutationCodes:
    """The codes of all ``K! - 1`` permutations (Theorem 2 of Elmahdy &
    Mohajer 2018 for their costs)."""
    needs, cycles = _all_needs(num_workers)
    costs = comb(num_workers - 1, t) - _comb_table(num_workers)[cycles - 1, t]
    return PermutationCodes(needs, permutation_uses(types, needs).tocsc(), costs.astype(float))


def priced_permutations(problem: CoverProblem, codes: PermutationCodes) -> np.ndarray:
    """The permutations the LP over cliques, single sub-points and every permutation code
    uses, found by column generation: start from the fractional clique cover and add the
    :data:`PRICED_PER_ROUND` codes of least negative reduced cost (cost minus the LP's
    prices of the sub-points a use serves) until none is negative, when the LP is optimal
    over all codes. Ties go to the first permutation in lexicographic order."""
    types = problem.types
    n, c = types.demander.size, problem.member.shape[0]
    chosen = np.zeros(0, dtype=np.int64)
    while True:
        cover = cover_columns(problem.member, n, codes.uses[:, chosen])
        costs = np.concatenate([np.ones(c + n), codes.costs[chosen]])
        solved = cover_lp_with_prices(types.counts, cover, costs)
        if solved is None:
            return np.zeros(0, dtype=np.int64)
        amounts, prices = solved
        reduced = codes.costs - codes.uses.T @ prices
        reduced[chosen] = 0.0
        more = np.flatnonzero(reduced < -1e-9)
        if more.size == 0:
            return np.sort(chosen[amounts[c + n :] > 1e-9])
        more = more[np.argsort(reduced[more], kind="stable")[:PRICED_PER_ROUND]]
        chosen = np.concatenate([chosen, more])


def integer_uses(problem: CoverProblem, codes: PermutationCodes, used: np.ndarray) -> np.ndarray:
    """Whole uses of the permutations ``used``: a MILP (HiGHS, at most
    :data:`PERMUTATION_MILP_NODES` branch-and-bound nodes, deterministic) over those codes'
    integer uses and the cliques' and single sub-points' amounts, relaxed (the clique cover
    rounds them after); zeros if HiGHS finds no integer point."""
    types = problem.types
    n, c = types.demander.size, problem.member.shape[0]
    cover = cover_columns(problem.member, n, codes.uses[:, used])
    costs = np.concatenate([np.ones(c + n), codes.costs[used]])
    integer = np.concatenate([np.zeros(c + n), np.ones(used.size)])
    # scipy.optimize loads in 0.2 s: only where a solver runs (the command starts faster)
    from scipy.optimize import Bounds, LinearConstraint, milp

    res = milp(
        costs,
        integrality=integer,
        bounds=Bounds(0, np.inf),
        constraints=LinearConstraint(cover, lb=types.counts.astype(float)),
        options={"node_limit": PERMUTATION_MILP_NODES, "disp": False},
    )
    if res.x is None:
        return np.zeros(used.size, dtype=np.int64)
    return np.round(res.x[c + n :]).astype(np.int64)


def permutations_and_cliques(
    state: CacheState, new_assignment: np.ndarray, problem: CoverProblem | None
) -> list[np.ndarray] | None:
    """E-M's permutation codes and XOR multicasts to cliques, mixed (the project's).

    One use of a permutation's code sends one point per arc (E-M's sub-messages,
    ``C(K-1,t) - C(g-1,t)`` symbols for ``g`` cycles; a missing point is a zero point). The
    LP over every maximal clique of ``problem`` (:func:`~.clique_cover.cover_problem`), every
    single sub-point and every permutation (:func:`priced_permutations`) names the codes
    worth using; a MILP gives them whole uses (:func:`integer_uses`), they get points, and
    the clique cover serves every other demand. ``None`` above
    :data:`PERMUTATION_CODE_WORKERS` workers, where the clique cover is not tried, or when no
    permutation is used.
    """
    k, t = state.num_workers, state.labels.t
    if k > PERMUTATION_CODE_WORKERS or not 2 <= t < k or problem is None:
        return None
    types = problem.types
    if problem.member is None or types.demander.size == 0:
        return None
    codes = permutation_codes(types, k, t)
    used = priced_permutations(problem, codes)
    uses = integer_uses(problem, codes, used) if used.size else used
    if not uses.any():
        return None
    rows = np.repeat(codes.needs[used[uses > 0]], uses[uses > 0], axis=0)
    sigmas = np.argsort(rows, axis=1)  # worker i's point goes to sigmas[m, i]
    sp = rows_with_points(state.assignment, np.asarray(new_assignment), k, sigmas, fixed=False)
    real = sp.points[sp.points >= 0]
    served = (real[:, None] * state.splits + np.arange(state.splits)).reshape(-1)
    return sub_message_rows(state, sp) + cover_rows(types.without(served), problem)
