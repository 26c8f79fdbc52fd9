"""Fully distributed coded elastic gradient descent, without a master (Yang et al. 2018, sec. 3.3).

Every available worker holds its coded block, every generator row in use and the targets
``y``. Per step:

1. round 1: ``u_i = X~_{s,used} w`` at every worker, then an **all-gather** of the ``u_i``;
2. every worker decodes ``X w`` for every group itself (``G_j^{-1}``, Algorithm 1), forms
   ``z = X w - y`` and its own round-2 vector (row ``l`` of ``(G_j^{-1})^T z^j`` for its
   sub-blocks, eq. (13)), multiplies, and an **all-reduce** sums ``X~_{s,used}^T r`` into
   ``X^T (X w - y)`` at every worker; every worker takes the same step.

The functions below are one worker's share; :func:`simulate_peers` runs them in one process (the
collectives are a list and a sum) and ``coded_shuffle_train/elastic_gd.py`` runs them over gloo."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coded_shuffle.elastic.cyclic import CyclicUsage, GroupCode, worker_backward, worker_forward
from coded_shuffle.elastic.encoding import encode, split_blocks
from coded_shuffle.elastic.generator import Generator
from coded_shuffle.elastic.membership import Event, Membership
from coded_shuffle.elastic.problem import Problem


def peer_code(membership: Membership, generator_rows: np.ndarray, block_rows: int) -> GroupCode:
    """The group code of the current members (every worker builds the same one)."""
    usage = CyclicUsage(membership.size, membership.recovery_threshold, block_rows)
    return GroupCode.build(usage, generator_rows[membership.position_rows()])


def peer_forward(block: np.ndarray, code: GroupCode, position: int, w: np.ndarray) -> np.ndarray:
    """Round 1 at one worker: its used coded rows times ``w``."""
    return worker_forward(block[code.usage.rows(position)], w)


def peer_backward(
    block: np.ndarray,
    code: GroupCode,
    position: int,
    gathered: Sequence[np.ndarray],
    targets: np.ndarray,
) -> np.ndarray:
    """Round 2 at one worker, after the all-gather: it decodes ``X w`` itself and returns
    ``X~_{s,used}^T r`` (the all-reduce of these is ``X^T (X w - y)``, eq. (13))."""
    xw = code.decode(list(gathered))
    mine = code.reencode(xw - targets)[position]
    return worker_backward(block[code.usage.rows(position)], mine)


def peer_gradient(total: np.ndarray, w: np.ndarray, points: int, ridge: float) -> np.ndarray:
    """The gradient every worker holds after the all-reduce."""
    return total / points + ridge * w


def ring_bytes(workers: int, gathered: int, reduced: int) -> int:
    """Bytes a ring all-gather of ``gathered`` float64 per worker and a ring all-reduce of
    ``reduced`` float64 move over all links together (gloo's own algorithms may move more)."""
    n = workers
    return 8 * (n * (n - 1) * gathered + 2 * (n - 1) * reduced)


def simulate_peers(
    problem: Problem,
    generator: Generator,
    recovery_threshold: int,
    steps: int,
    events: Sequence[Event],
    lr: float,
) -> list[dict]:
    """Every worker's computation in one process; per step the gradient every worker holds
    (all equal) against the exact one."""
    blocks = encode(split_blocks(problem.X, recovery_threshold), generator.rows)
    targets = split_blocks(problem.y, recovery_threshold)
    members = Membership.initial(generator.rows.shape[0], recovery_threshold)
    w = np.zeros(problem.features)
    out = []
    for step in range(steps):
        for event in (e for e in events if e.step == step):
            members.apply(event)
        code = peer_code(members, generator.rows, blocks.shape[1])
        mine = [blocks[members.row_of[i]] for i in members.available]
        gathered = [peer_forward(b, code, p, w) for p, b in enumerate(mine)]
        partials = [peer_backward(b, code, p, gathered, targets) for p, b in enumerate(mine)]
        grad = peer_gradient(np.sum(partials, axis=0), w, problem.num_points, problem.ridge)
        exact = problem.gradient(w)
        error = np.linalg.norm(grad - exact) / max(float(np.linalg.norm(exact)), 1e-300)
        out.append({"step": step, "workers_available": members.size, "grad_rel_error": error})
        w = w - lr * grad
    return out
