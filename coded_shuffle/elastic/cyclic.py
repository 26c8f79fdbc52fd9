"""Cyclic use of the coded blocks and the two-round gradient (Yang et al. 2018, sec. 2.3-2.4, 3.2).

With ``n >= L`` available workers, every coded block (``b`` rows) is split into ``n``
sub-blocks; the worker at position ``i`` (workers sorted by id) uses sub-blocks
``i, i+1, ..., i+L-1 (mod n)``. Sub-block ``j`` (a *group*) is then used by the ``L`` workers at
positions ``j, j-1, ..., j-L+1 (mod n)``; their generator rows form ``G_j`` (``L x L``).

Round 1: worker ``s`` returns ``u_{s,j} = X~_{s,j} w``; the master decodes ``X^j w = G_j^{-1} U_j``
(Algorithm 1). Round 2: with ``z^j = X^j w - y^j`` it sends ``(G_j^{-1})^T z^j`` back, member
``l`` getting row ``l``; the reduced ``sum X~_{s,j}^T r_{s,j}`` is ``X^T (X w - y)`` (eq. (13)).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from coded_shuffle.errors import UsageError
from coded_shuffle.math.plan import ranges


@dataclass(frozen=True)
class CyclicUsage:
    """Which rows of its coded block every available position uses
    (Figure 1 of Yang et al. 2018)."""

    available: int
    recovery_threshold: int
    block_rows: int

    def __post_init__(self) -> None:
        n, size = self.available, self.recovery_threshold
        if n < size:
            raise UsageError(
                f"only {n} workers available, fewer than the recovery threshold L={size}"
            )

    @cached_property
    def bounds(self) -> np.ndarray:
        """Sub-block boundaries: sub-block ``j`` is rows ``bounds[j]:bounds[j+1]`` of a block."""
        return (np.arange(self.available + 1, dtype=np.int64) * self.block_rows) // self.available

    @cached_property
    def usage(self) -> np.ndarray:
        """``usage[i, l]``: the ``l``-th sub-block used by position ``i``, ``(i + l) mod n``."""
        n, size = self.available, self.recovery_threshold
        return (np.arange(n)[:, None] + np.arange(size)[None, :]) % n

    @cached_property
    def members(self) -> np.ndarray:
        """``members[j, l]``: the position whose ``l``-th sub-block is ``j``: ``j - l mod n``."""
        n, size = self.available, self.recovery_threshold
        return (np.arange(n)[:, None] - np.arange(size)[None, :]) % n

    @cached_property
    def sizes(self) -> np.ndarray:
        return np.diff(self.bounds)

    def spans(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """Starts and stops (within the block) of the ``L`` sub-blocks of ``position``."""
        subs = self.usage[position]
        return self.bounds[subs], self.bounds[subs + 1]

    def rows(self, position: int) -> np.ndarray:
        """The block rows ``position`` uses, its sub-blocks concatenated in usage order."""
        starts, stops = self.spans(position)
        return ranges(starts, stops - starts)

    def rows_used(self) -> np.ndarray:
        """Rows used by every position: ``L * b / n`` when ``n`` divides ``b`` (Theorem 2.1)."""
        return self.sizes[self.usage].sum(axis=1)

    @cached_property
    def offsets(self) -> np.ndarray:
        """``offsets[i, l]``: where sub-block ``usage[i, l]`` starts in position ``i``'s vector."""
        sizes = self.sizes[self.usage]
        return np.cumsum(sizes, axis=1) - sizes


@dataclass(frozen=True)
class GroupCode:
    """The ``L x L`` matrices ``G_j`` of every group and their inverses, for one ``n``."""

    usage: CyclicUsage
    matrices: np.ndarray  # (n, L, L): matrices[j, l] = generator row of members[j, l]
    inverses: np.ndarray  # (n, L, L)

    @classmethod
    def build(cls, usage: CyclicUsage, position_rows: np.ndarray) -> GroupCode:
        """``position_rows[i]``: the generator row of the block stored at position ``i``."""
        mats = np.asarray(position_rows, dtype=np.float64)[usage.members]
        return cls(usage, mats, np.linalg.inv(mats))

    @cached_property
    def conditions(self) -> np.ndarray:
        return np.linalg.cond(self.matrices)

    @cached_property
    def _gather(self) -> tuple[np.ndarray, np.ndarray]:
        """Where member ``l``'s result for block row ``r`` sits in the concatenated results
        (``(L, b)``), and the inverse of each block row's group (``(L, L, b)``)."""
        u = self.usage
        rows_used = u.rows_used()
        base = np.concatenate([[0], np.cumsum(rows_used)[:-1]])
        group = np.repeat(np.arange(u.available), u.sizes)
        within = np.arange(u.block_rows) - u.bounds[group]
        pos = u.members[group].T  # (L, b): the position of member l of row r's group
        index = base[pos] + u.offsets[pos, np.arange(u.recovery_threshold)[:, None]] + within
        return index, np.ascontiguousarray(self.inverses[group].transpose(1, 2, 0))

    def decode(self, results: list[np.ndarray]) -> np.ndarray:
        """``X w`` as ``(L, b, ...)`` from the positions' round-1 results ``X~_{s,used} w``
        (Algorithm 1: ``G_j^{-1}`` on every group's stacked results, one gather for all
        groups; a matrix ``w`` gives ``X w`` the same way)."""
        index, inverses = self._gather
        stacked = np.concatenate(results)[index]  # (L, b, ...)
        coef = inverses.reshape(*inverses.shape, *([1] * (stacked.ndim - 2)))
        out = np.zeros_like(stacked)
        for m in range(stacked.shape[0]):  # L^2 vectorised multiply-adds over the block rows
            for k in range(stacked.shape[0]):
                out[m] += coef[m, k] * stacked[k]
        return out

    def reencode(self, residual: np.ndarray) -> list[np.ndarray]:
        """Round-2 vectors per position: row ``l`` of ``(G_j^{-1})^T z^j`` for member ``l``
        (eq. (13)); with ``(L, b, d_B)`` blocks of ``B`` it is eq. (7)'s coded right factor,
        ``H_j = (G_j^T)^{-1}`` (sec. 3.1)."""
        u = self.usage
        parts = [
            np.tensordot(self.inverses[j].T, residual[:, u.bounds[j] : u.bounds[j + 1]], 1)
            for j in range(u.available)
        ]
        return [
            np.concatenate([parts[j][m] for m, j in enumerate(u.usage[i])])
            for i in range(u.available)
        ]


def worker_forward(used: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Round 1 at a worker: its used coded rows times ``w``."""
    return used @ w


def worker_backward(used: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Round 2 at a worker: ``X~_{s,used}^T r``; the master sums these (eq. (13))."""
    return used.T @ r
