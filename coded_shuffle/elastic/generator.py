"""Systematic real-valued generators for coded elastic computing (Yang et al. 2018, eqs. (1)-(2)).

Coded block ``s`` is ``sum_k g_sk X_k``; the first ``L`` rows of ``G`` are the identity (the
systematic code of eq. (2)), and every ``L x L`` sub-matrix must be invertible (Lemma 2.1) and,
for exact float64 decoding, well conditioned: with ``n`` workers left, the master inverts the
``L x L`` matrix ``G_j`` of every group, and any ``L``-subset of the rows can become a group after
departures.

Default choice, ``gaussian``: the non-systematic rows are i.i.d. Gaussian, normalised to unit
length (the paper's own example of coefficients that satisfy Lemma 2.1 with probability one),
drawn from a seeded stream; of several candidates the one with the smallest worst condition
number over *all* ``L``-subsets is kept. Real Vandermonde (Chebyshev nodes) and Cauchy rows are
also available: they are invertible by construction, but their worst ``L``-subset conditioning
grows exponentially with ``L`` (``worst_condition`` measures it; see docs/elastic.md).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from coded_shuffle.errors import UsageError

KINDS = ("gaussian", "cauchy", "vandermonde")
EXHAUSTIVE_SUBSETS = 100_000  # above this many L-subsets the condition check samples
SAMPLED_SUBSETS = 20_000
SEARCH_BUDGET = 400_000  # candidates x subsets for the best-of search


@dataclass(frozen=True)
class Generator:
    """The generator rows in use: ``rows[s]`` are the coefficients of coded block ``s``.

    ``rows`` grows when a worker joins and no departed worker's row is free (a fresh
    combination). ``worst_condition`` is the largest 2-norm condition number over the
    ``L``-subsets of ``rows``; ``exact`` is true when every subset was checked.
    """

    kind: str
    recovery_threshold: int
    rows: np.ndarray
    seed: int
    worst_condition: float
    exact: bool

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[0])


def _subsets(count: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """All ``size``-subsets of ``range(count)`` (or a random sample when there are too many)."""
    total = math.comb(count, size)
    if total <= EXHAUSTIVE_SUBSETS:
        subs = np.fromiter(
            itertools.chain.from_iterable(itertools.combinations(range(count), size)),
            dtype=np.int64,
            count=total * size,
        )
        return subs.reshape(total, size), True
    sample = np.argsort(rng.random((SAMPLED_SUBSETS, count)), axis=1)[:, :size]
    return np.sort(sample, axis=1), False


def subset_conditions(rows: np.ndarray, subsets: np.ndarray) -> np.ndarray:
    """2-norm condition number of ``rows[subset]`` for every subset (inf when singular)."""
    out = np.empty(len(subsets))
    for start in range(0, len(subsets), 20_000):
        chunk = rows[subsets[start : start + 20_000]]
        s = np.linalg.svd(chunk, compute_uv=False)
        with np.errstate(divide="ignore"):
            out[start : start + 20_000] = s[:, 0] / s[:, -1]
    return out


def worst_condition(rows: np.ndarray, size: int, seed: int = 0) -> tuple[float, bool]:
    """Largest condition number over the ``size``-row sub-matrices of ``rows``, and exactness."""
    subs, exact = _subsets(rows.shape[0], size, np.random.default_rng(seed))
    return float(subset_conditions(rows, subs).max()), exact


def _normalised(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def cauchy_rows(count: int, size: int) -> np.ndarray:
    """Cauchy rows ``1/(x_s - y_k)`` on interlaced Chebyshev nodes (every minor non-zero)."""
    total = count + size
    nodes = np.cos(np.pi * (np.arange(total) + 0.5) / total)
    pick = np.zeros(total, dtype=bool)
    pick[np.linspace(0, total - 1, size).round().astype(int)] = True
    ys, xs = nodes[pick], nodes[~pick][:count]
    return _normalised(1.0 / (xs[:, None] - ys[None, :]))


def vandermonde_rows(total: int, size: int) -> np.ndarray:
    """Systematic real Vandermonde ``V V_top^{-1}`` on ``total`` Chebyshev nodes."""
    nodes = np.cos(np.pi * (np.arange(total) + 0.5) / total)
    v = np.vander(nodes, size, increasing=True)
    return (v @ np.linalg.inv(v[:size]))[size:]


def _gaussian_candidates(
    rng: np.random.Generator, count: int, size: int, tries: int
) -> list[np.ndarray]:
    return [_normalised(rng.standard_normal((count, size))) for _ in range(tries)]


def systematic_generator(
    workers: int,
    recovery_threshold: int,
    kind: str = "gaussian",
    seed: int = 0,
    max_condition: float = 1e6,
) -> Generator:
    """``P x L`` systematic generator (eq. (2)) whose worst ``L``-subset is well conditioned.

    Raises :class:`UsageError` for ``L`` outside ``1..P-1``, an unknown ``kind``, or a worst
    condition number above ``max_condition``.
    """
    p, size = int(workers), int(recovery_threshold)
    if not 1 <= size < p:
        raise UsageError(f"recovery_threshold L={size} out of range 1..{p - 1} (workers P={p})")
    if kind not in KINDS:
        raise UsageError(f"unknown generator {kind!r}; valid: {', '.join(KINDS)}")
    eye = np.eye(size)
    if kind == "gaussian":
        rng = np.random.default_rng([seed, p, size])
        tries = max(1, min(20, SEARCH_BUDGET // max(1, math.comb(p, size))))
        candidates = [np.vstack([eye, c]) for c in _gaussian_candidates(rng, p - size, size, tries)]
        scored = [(worst_condition(g, size, seed), g) for g in candidates]
        (cond, exact), rows = min(scored, key=lambda item: item[0][0])
    else:
        coded = cauchy_rows(p - size, size) if kind == "cauchy" else vandermonde_rows(p, size)
        rows = np.vstack([eye, coded])
        cond, exact = worst_condition(rows, size, seed)
    _check_condition(cond, max_condition, f"generator {kind} P={p} L={size}")
    return Generator(kind, size, rows, seed, cond, exact)


def _check_condition(cond: float, max_condition: float, what: str) -> None:
    if not cond <= max_condition:
        raise UsageError(
            f"{what}: worst L-subset condition number {cond:.3g} exceeds "
            f"max_condition={max_condition:.3g}; use fewer workers or a smaller L, "
            "or the gaussian generator"
        )


def with_fresh_row(gen: Generator, max_condition: float = 1e6, tries: int = 20) -> Generator:
    """Adds one new coded row for a joining worker ("some new linearly combined data", sec. 2.3).

    The row is Gaussian (whatever ``gen.kind``), the best of ``tries`` candidates by the worst
    condition of the ``L``-subsets that contain it (so every earlier guarantee still holds).
    """
    size, count = gen.recovery_threshold, gen.num_rows
    rng = np.random.default_rng([gen.seed, count, size, 1])
    subs, exact = _subsets(count, size - 1, rng)
    subs = np.hstack([subs, np.full((len(subs), 1), count, dtype=np.int64)])
    best: tuple[float, np.ndarray] | None = None
    for row in _gaussian_candidates(rng, 1, size, tries):
        rows = np.vstack([gen.rows, row])
        cond = float(subset_conditions(rows, subs).max())
        if best is None or cond < best[0]:
            best = (cond, rows)
    assert best is not None
    _check_condition(best[0], max_condition, f"fresh row {count} of the {gen.kind} generator")
    return replace(
        gen,
        rows=best[1],
        worst_condition=max(gen.worst_condition, best[0]),
        exact=gen.exact and exact,
    )
