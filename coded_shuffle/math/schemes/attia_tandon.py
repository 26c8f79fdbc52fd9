"""Attia-Tandon coded shuffling without excess storage (Attia & Tandon 2016,
Theorem 1; docs/schemes.md).

Phase 1 sends ``min(S_ij, S_ji)`` symbols ``x_ij XOR x_ji`` for every pair ``i < j``. Phase 2
combines the leftovers ``Omega = S - min(S, S^T)``: one *ignored* worker ``u`` (the maximiser
of ``sum_j Omega_uj``, lowest id on ties) and, at every other worker, every incoming leftover
paired with one outgoing leftover. Load (eq. (20)):

    R = sum_{i<j} max(S_ij, S_ji) - max_k sum_j Omega_kj.

Which incoming leftover is paired with which outgoing one is free; the count is always
``sum_{k != u} sum_j Omega_kj``. Pairing along a decomposition of ``Omega`` into simple cycles
keeps ``u``'s decoding chains short: a cycle through ``u`` is opened at ``u`` (``L - 1``
symbols, ``u`` peels ``L - 1 <= K - 1`` steps), every other cycle is closed (``L`` symbols,
each of its workers decodes in one step). Every simple cycle through ``u`` uses exactly one
arc out of ``u``, so the symbols are ``|Omega| - sum_j Omega_uj``: exactly Theorem 1.
"""

from __future__ import annotations

import numpy as np

from coded_shuffle.math.assignment import leftover_matrix
from coded_shuffle.math.bounds import off_diagonal
from coded_shuffle.math.schemes.cycle_plan import (
    CycleScheme,
    CycleSet,
    greedy_cycles,
    open_at,
    pair_cycles,
)


def theorem1_load(shuffle: np.ndarray) -> int:
    """Theorem 1 of Attia & Tandon 2016: ``sum_{i<j} max(S_ij, S_ji) - max_k sum_j Omega_kj``."""
    s = off_diagonal(shuffle)
    return int(np.triu(np.maximum(s, s.T), 1).sum() - leftover_matrix(s).sum(axis=1).max())


def ignored_worker(omega: np.ndarray) -> int:
    """``argmax_k sum_j Omega_kj``, the lowest id on ties."""
    return int(np.argmax(omega.sum(axis=1)))


def leftover_cycles(omega: np.ndarray, ignored: int) -> CycleSet:
    """``Omega`` as simple cycles: opened at ``ignored`` when they pass through it, else closed."""
    return open_at(greedy_cycles(omega), ignored)


class AttiaTandon(CycleScheme):
    """Attia & Tandon 2016, Theorem 1: pairs, then leftover combining with one ignored worker."""

    name = "attia-tandon"
    summary = (
        "no excess storage: pairwise XORs, then leftover combining (Attia & Tandon 2016, Theorem 1)"
    )

    def decompose(self, shuffle: np.ndarray) -> tuple[CycleSet, CycleSet]:
        pairs, omega = pair_cycles(shuffle)
        return pairs, leftover_cycles(omega, ignored_worker(omega))
