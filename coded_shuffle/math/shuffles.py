"""The shuffles a scheme is judged on (docs/model.md, "Which shuffles"): the cyclic shift, every
cycle type of a whole-batch permutation, a shuffle that splits every batch over the others,
random reshuffles; and the worst of them for a scheme (:func:`worst_case`).

The converses of the papers (Theorem 3 of Attia & Tandon; Wan et al.'s decentralized one) are
worst cases over every shuffle. No finite search proves a maximum over all of them; the
project's worst case is the largest load over the shuffles here, and names the one that
attained it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from coded_shuffle.math.assignment import batch_size, random_assignment

RANDOM_SHUFFLES = 2  # random reshuffles beside the structured ones


@dataclass(frozen=True)
class Shuffle:
    """One candidate shuffle: how it is made (``name``) and the new assignment."""

    name: str
    new: np.ndarray


def cyclic_shuffle(assignment: np.ndarray, num_workers: int) -> np.ndarray:
    """The cyclic shift: every worker's whole batch moves to the next worker."""
    return (assignment + 1) % num_workers


def cycle_types(num_workers: int) -> Iterator[tuple[int, ...]]:
    """Every partition of ``K`` but the identity's (all ones), parts in decreasing order."""

    def parts(rest: int, largest: int) -> Iterator[tuple[int, ...]]:
        if rest == 0:
            yield ()
            return
        for first in range(min(rest, largest), 0, -1):
            for tail in parts(rest - first, first):
                yield (first, *tail)

    for partition in parts(num_workers, num_workers):
        if partition[0] > 1:
            yield partition


def permutation_of_type(cycle_type: tuple[int, ...]) -> np.ndarray:
    """The permutation of the workers whose cycles have the lengths of ``cycle_type``, laid
    out in worker order (``(3, 1)``: ``0 -> 1 -> 2 -> 0``, ``3`` fixed)."""
    perm = np.empty(sum(cycle_type), dtype=np.int64)
    start = 0
    for length in cycle_type:
        members = np.arange(start, start + length)
        perm[members] = np.roll(members, -1)
        start += length
    return perm


def cycle_type_shuffle(
    assignment: np.ndarray, num_workers: int, cycle_type: tuple[int, ...]
) -> np.ndarray:
    """Every worker's whole batch to its image under the permutation of ``cycle_type``."""
    if sum(cycle_type) != num_workers:
        raise ValueError(f"cycle type {cycle_type} is no partition of K = {num_workers}")
    return permutation_of_type(cycle_type)[assignment]


def split_shuffle(assignment: np.ndarray, num_workers: int) -> np.ndarray:
    """Every batch spread over the other workers, none kept: the ``j``-th point (in id order) of
    worker ``k``'s batch goes to worker ``k + 1 + (j mod (K - 1))``. Balanced: a worker gets
    from the ``K - 1`` others one residue class of ``j`` each, ``q`` points in all."""
    if num_workers < 2:
        return assignment.copy()
    order = np.argsort(assignment, kind="stable")
    q = batch_size(assignment.size, num_workers)
    rank = np.empty_like(order)
    rank[order] = np.arange(assignment.size) % q
    return (assignment + 1 + rank % (num_workers - 1)) % num_workers


def structured_shuffles(assignment: np.ndarray, num_workers: int) -> list[Shuffle]:
    """Every cycle type's shuffle (the cyclic shift is ``cycles K``) and the split shuffle."""
    found = [
        Shuffle(f"cycles {'+'.join(map(str, t))}", cycle_type_shuffle(assignment, num_workers, t))
        for t in cycle_types(num_workers)
    ]
    found.append(Shuffle("split over the others", split_shuffle(assignment, num_workers)))
    return found


def candidate_shuffles(
    assignment: np.ndarray, num_workers: int, rng: np.random.Generator
) -> list[Shuffle]:
    """The shuffles of :func:`worst_case`: the structured ones and :data:`RANDOM_SHUFFLES`
    random reshuffles."""
    return structured_shuffles(assignment, num_workers) + [
        Shuffle(f"random {i + 1}", random_assignment(assignment.size, num_workers, rng))
        for i in range(RANDOM_SHUFFLES)
    ]


def worst_of(
    load_of: Callable[[np.ndarray], float],
    shuffles: list[Shuffle],
    bound_of: Callable[[np.ndarray], float] | None = None,
) -> tuple[Shuffle, float]:
    """The shuffle with the largest ``load_of(new)`` (the first found on a tie) and that load.
    ``bound_of``: a cheaper upper bound on ``load_of``; a shuffle whose bound is no larger than
    the worst load so far is not asked for its load (it cannot be the worst)."""
    worst: tuple[Shuffle, float] | None = None
    for shuffle in shuffles:
        bounded = worst is not None and bound_of is not None
        if bounded and bound_of(shuffle.new) <= worst[1] + 1e-9:
            continue
        load = load_of(shuffle.new)
        if worst is None or load > worst[1] + 1e-9:
            worst = (shuffle, load)
    assert worst is not None
    return worst


def worst_case(
    load_of: Callable[[np.ndarray], float],
    assignment: np.ndarray,
    num_workers: int,
    rng: np.random.Generator,
) -> tuple[Shuffle, float]:
    """The candidate shuffle of ``assignment`` with the largest ``load_of(new)`` (the first
    found on a tie) and that load."""
    return worst_of(load_of, candidate_shuffles(assignment, num_workers, rng))
