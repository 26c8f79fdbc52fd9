"""Per-feature standardisation with the training split's statistics, a block of rows at a
time, bit for bit what NumPy computes on the whole array (so that a set standardised in
blocks, by ``coded-shuffle pack``, is the set standardised in memory)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

STATS_ROWS = 1 << 16  # rows read at a time for the statistics


def standardise(x: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature zero mean and unit variance with the training split's statistics."""
    mean, std = column_stats(x)
    return _scaled(x, mean, std), _scaled(x_test, mean, std)


def column_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every column's mean and standard deviation (a zero deviation as 1), in float64, read
    :data:`STATS_ROWS` rows at a time (a memory-mapped file is never loaded whole)."""
    return block_stats(lambda: (x[a : a + STATS_ROWS] for a in range(0, x.shape[0], STATS_ROWS)))


def block_stats(blocks: Callable[[], Iterator[np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`column_stats` of the rows that ``blocks()`` yields in order (called twice).

    Bit for bit ``x.mean(axis=0, dtype=float64)`` and ``x.std(...)`` of the rows stacked:
    NumPy sums along the first axis row after row, so each block's sum goes on from the
    previous one's."""
    total = _row_sum(blocks(), lambda rows: rows)
    mean = total[0] / total[1]
    std = np.sqrt(_row_sum(blocks(), lambda rows: np.square(rows - mean))[0] / total[1])
    std[std == 0] = 1.0
    return mean, std


def _row_sum(
    blocks: Iterator[np.ndarray], term: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, int]:
    """``sum_i term(row_i)`` in float64, row by row in order, and the number of rows."""
    total: np.ndarray | None = None
    count = 0
    for block in blocks:
        rows = term(np.asarray(block, dtype=np.float64))
        total = np.add.reduce(rows if total is None else np.concatenate([total[None], rows]))
        count += block.shape[0]
    assert total is not None
    return total, count


def _scaled(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """``((x - mean) / std)`` in float64, stored as float32, a block of rows at a time (the
    same values as on the whole array, without a float64 copy of it)."""
    out = np.empty(x.shape, dtype=np.float32)
    scale_in_place(out, mean, std, source=x)
    return out


def scale_in_place(
    out: np.ndarray, mean: np.ndarray, std: np.ndarray, source: np.ndarray | None = None
) -> None:
    """``out = (source - mean) / std`` (``source`` None: ``out`` itself), computed in float64
    a block of :data:`STATS_ROWS` rows at a time, stored in ``out``'s dtype."""
    x = out if source is None else source
    for a in range(0, x.shape[0], STATS_ROWS):
        out[a : a + STATS_ROWS] = (x[a : a + STATS_ROWS] - mean) / std
