"""SHA-256 of a worker's batch: whole (:func:`digest`), or point by point while its symbols
arrive (:class:`StreamDigest`), so that a worker's report needs only the last points hashed
when its stream ends."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import torch

from coded_shuffle.codec.decode import StreamDecoder, Workspace
from coded_shuffle.math.worker_program import BATCH


def digest(rows: torch.Tensor) -> bytes:
    """SHA-256 of a tensor's bytes in row-major order (decoded batches)."""
    return hashlib.sha256(rows.contiguous().numpy()).digest()


class StreamDigest:
    """SHA-256 of a worker's new batch ``(q, B)`` (what :func:`digest` gives for
    :meth:`~coded_shuffle.distributed.delivery.Delivery.batch`), computed while the symbols
    arrive: after every :meth:`update` it hashes the points whose bytes are final in every
    part, in batch order, so that the check reads each decoded row while it is still in cache
    and only the last points are left when the stream ends.

    A batch row is final once its last writer has run (its ``need``,
    :func:`~coded_shuffle.math.worker_program.arrival_order`); a point once every sub-row of it
    is, in every part; the hash advances over the leading points that are final.
    """

    def __init__(
        self, decoders: list[StreamDecoder], batch: Callable[[list[Workspace], slice], torch.Tensor]
    ) -> None:
        self.decoders, self.batch = decoders, batch  # batch(workspaces, points): those points
        self.points = decoders[0].program.batch_rows.shape[0] if decoders else 0
        self.needs = [_point_need(d) for d in decoders]
        self.hasher = hashlib.sha256()
        self.hashed = 0  # points hashed so far

    def update(self) -> None:
        """Hashes every leading point that is final now."""
        ready = min(
            (
                int(np.searchsorted(need, d.ready, side="right"))
                for need, d in zip(self.needs, self.decoders, strict=True)
            ),
            default=0,
        )
        if ready > self.hashed:
            works = [d.workspace() for d in self.decoders]
            self.hasher.update(self.batch(works, slice(self.hashed, ready)).numpy())
            self.hashed = ready

    def digest(self) -> bytes:
        """The batch's SHA-256; every decoder must have finished."""
        self.update()
        if self.hashed != self.points:
            raise RuntimeError(f"digest of {self.hashed} of {self.points} points: not finished")
        return self.hasher.digest()


def _point_need(decoder: StreamDecoder) -> np.ndarray:
    """Per batch point, the kept symbols that must have arrived before its bytes are final,
    as a running maximum over the points (so that it is sorted: a prefix is final)."""
    program = decoder.program
    rows = np.zeros(program.batch_rows.size, dtype=np.int64)
    for st in decoder.staged:  # program order: the last writer of a row comes last
        if st.op.dest == BATCH:
            rows[st.op.targets] = st.need
    points = rows.reshape(program.batch_rows.shape).max(axis=1, initial=0)
    return np.maximum.accumulate(points) if points.size else points
