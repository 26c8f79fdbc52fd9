"""Elastic matrix products (Yang et al. 2018): ``A x`` by Algorithm 1, ``A B`` by sec. 3.1.

Pure numpy, the master's side of one product with the workers available now:

* **Algorithm 1** (``A x``): ``A`` in ``L`` row blocks, worker ``s`` stores
  ``A~_s = sum_k g_sk A_k``; the worker at position ``i`` multiplies the sub-blocks
  ``i..i+L-1 (mod n)`` of its block by ``x``; the master decodes every sub-block group with
  ``G_j^{-1}`` (:meth:`GroupCode.decode`).
* **Sec. 3.1** (``A B``): ``A`` in ``L`` column blocks (stored transposed, so that the cyclic
  sub-blocks are rows of the stored array); the master encodes ``B``'s row blocks per group
  with ``H_j = (G_j^T)^{-1}`` (eq. (7)) and sums the workers' products (Lemma 3.1, eq. (8)).
* **Non-adaptive MDS** (the baseline): every available worker multiplies its whole row-coded
  block; the master decodes from the first ``L`` results, whatever the number available.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coded_shuffle.elastic.cyclic import GroupCode
from coded_shuffle.elastic.encoding import encode, split_blocks

ROW_CODED, COLUMN_CODED = "row", "column"


def layout_for(rhs_cols: int) -> str:
    """Algorithm 1's row blocks for ``A x`` (one right-hand column), sec. 3.1's column blocks
    for ``A B``."""
    return ROW_CODED if rhs_cols == 1 else COLUMN_CODED


def coded_blocks(a: np.ndarray, generator_rows: np.ndarray, layout: str) -> np.ndarray:
    """What the workers store, one block per generator row (eq. (1) or eq. (4)).

    Row layout: ``(R, ceil(rows/L), cols)``; column layout: ``(R, ceil(cols/L), rows)``, the
    coded column blocks transposed.
    """
    size = np.atleast_2d(generator_rows).shape[1]
    source = a if layout == ROW_CODED else a.T
    return encode(split_blocks(source, size), generator_rows)


def worker_product(used: np.ndarray, right: np.ndarray, layout: str) -> np.ndarray:
    """A worker's share: its used stored rows times the right factor (``A~_{s,i} x``), or
    their transpose times its coded right factor (``A~_{s,i} B~_{s,i}``, eq. (8))."""
    return used @ right if layout == ROW_CODED else used.T @ right


def right_factors(code: GroupCode, right: np.ndarray, layout: str) -> list[np.ndarray]:
    """What each position multiplies by: ``x`` itself (Algorithm 1), or its coded rows of
    ``B`` (eq. (7): member ``l`` of group ``j`` gets ``sum_k h_lk B_kj``)."""
    if layout == ROW_CODED:
        return [right] * code.usage.available
    return code.reencode(split_blocks(right, code.usage.recovery_threshold))


def recover(code: GroupCode, results: Sequence[np.ndarray], rows: int, layout: str) -> np.ndarray:
    """The product from every position's result: decoded per group (Algorithm 1) or summed
    (Lemma 3.1); padding rows dropped."""
    if layout == ROW_CODED:
        decoded = code.decode(list(results))
        return decoded.reshape(-1, *decoded.shape[2:])[:rows]
    return np.sum(results, axis=0)


def mds_recover(generator_rows: np.ndarray, results: Sequence[np.ndarray], rows: int) -> np.ndarray:
    """Non-adaptive MDS decoding: ``A x`` from ``L`` workers' whole-block products
    ``A~_s x`` (``generator_rows`` are those workers' rows, ``L x L``)."""
    stacked = np.stack(list(results))
    decoded = np.tensordot(np.linalg.inv(generator_rows), stacked, 1)
    return decoded.reshape(-1, *decoded.shape[2:])[:rows]
