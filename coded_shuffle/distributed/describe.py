"""The data set, from the master to every rank: its checks, its shape, and (``by_label``) the
first assignment. The master checks; every rank fails with the same line, or learns the same
shape (control bytes, before the placement)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from coded_shuffle.codec.records import RecordLayout, check_labels, item_labels
from coded_shuffle.distributed.context import DataShape
from coded_shuffle.distributed.roles import Roles
from coded_shuffle.distributed.settings import ShuffleSettings
from coded_shuffle.errors import UsageError
from coded_shuffle.math.policies import by_label_assignment


def describe(dataset: Any | None, roles: Roles, settings: ShuffleSettings) -> DataShape:
    """The master checks its data set and tells every rank its layout and size (or the
    error, so that every rank fails with the same line); collective (the default group)."""
    rank, workers, names = dist.get_rank(), roles.workers, settings.names
    message: list[Any] = [None]
    if rank == roles.master:
        try:
            message[0] = _check(dataset, workers, settings, roles)
        except UsageError as exc:
            message[0] = str(exc)
    elif dataset is not None:
        message[0] = (
            f"rank {rank} passed a dataset: only the master does ({names.master_rank}="
            f"{roles.master}: the rank that holds the data set)"
        )
    every: list[Any] = [None] * roles.world
    dist.all_gather_object(every, message[0])  # every rank fails with the first rank's line
    failed = [m for m in every if isinstance(m, str)]
    if failed:
        raise UsageError(failed[0])
    message[0] = every[roles.master]
    if isinstance(message[0], str):
        raise UsageError(message[0])
    layout, n, dropped = message[0]
    return DataShape(RecordLayout.from_json(layout), int(n), int(dropped), workers)


def _check(
    dataset: Any | None, workers: int, settings: ShuffleSettings, roles: Roles
) -> tuple[str, int, int]:
    if dataset is None:
        raise UsageError(
            f"rank {roles.master} (the master, {settings.names.master_rank}={roles.master}) "
            "must pass the dataset to CodedShuffle"
        )
    size = len(dataset)
    dropped = size % workers
    if dropped and not settings.drop_last:
        raise UsageError(
            f"{size} items do not divide among {workers} workers: pass drop_last=True or "
            f"{size - dropped} items"
        )
    if size - dropped < workers:
        raise UsageError(f"{size} items for {workers} workers: every worker needs at least one")
    layout = RecordLayout.of(dataset)
    if settings.placement == "by_label":
        check_labels(layout)
    return layout.to_json(), size - dropped, dropped


def first_assignment(dataset: Any | None, shape: DataShape, roles: Roles) -> np.ndarray:
    """``by_label``: the master deals its points in label order and sends every rank the
    assignment (``8 N`` control bytes, before the placement); collective."""
    first = torch.zeros(shape.num_points, dtype=torch.int64)
    if dist.get_rank() == roles.master:
        labels = item_labels(dataset, shape.num_points)
        first = torch.from_numpy(by_label_assignment(labels, shape.workers))
    dist.broadcast(first, src=roles.master)
    return first.numpy()
