"""How a run starts, as one typed value: :func:`decide` reads what the run directory holds
and says ``Fresh | AfterEpoch | InsideEpoch | Resized``; the master decides it and every rank
receives the same value (:func:`share`), and everything after reads it.

* :class:`Fresh`: nothing to resume; epoch 1 places the data.
* :class:`AfterEpoch`: the checkpoint after epoch ``done``; every worker's store is restored
  (a damaged one re-placed) and epoch ``done + 1`` is delivered as usual.
* :class:`InsideEpoch`: every worker holds its training state at ``step`` of epoch
  ``done + 1`` and the master that epoch's delivery record: no new delivery, the workers
  go on from that step with the batch they kept.
* :class:`Resized`: the checkpoint after epoch ``done`` of a run with another number of
  workers: epoch ``done + 1`` places the data anew for the new number, reusing what the
  workers that remain hold.
* :class:`Complete`: the checkpoint holds the last epoch: nothing is left to do (the same
  command run again after the run ended, whatever the number of workers now).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ..dist import context


@dataclass(frozen=True)
class Fresh:
    """No checkpoint: the run begins with its placement."""

    @property
    def done(self) -> int:
        return 0

    @property
    def first_epoch(self) -> int:
        return 1

    def record(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class AfterEpoch:
    """Resume after epoch ``done`` (the chain of assignments starts at ``first_epoch``)."""

    done: int
    first_epoch: int

    def record(self) -> dict[str, Any]:
        return {"resumed_after_epoch": self.done}


@dataclass(frozen=True)
class InsideEpoch:
    """Resume at ``step`` of epoch ``done + 1``, after its delivery."""

    done: int
    first_epoch: int
    step: int

    def record(self) -> dict[str, Any]:
        return {"resumed_at_step": self.step}


@dataclass(frozen=True)
class Resized:
    """Resume after epoch ``done`` with another number of workers (``workers_before`` then,
    ``workers_after`` now): epoch ``done + 1`` is the new number's placement."""

    done: int
    workers_before: int
    workers_after: int

    @property
    def first_epoch(self) -> int:
        return self.done + 1

    def record(self) -> dict[str, Any]:
        return {
            "resumed_after_epoch": self.done,
            "workers_before": self.workers_before,
            "workers_after": self.workers_after,
        }


@dataclass(frozen=True)
class Complete:
    """The checkpoint holds the run's last epoch, ``done``."""

    done: int

    @property
    def first_epoch(self) -> int:
        return self.done

    def record(self) -> dict[str, Any]:
        return {}


RunStart = Fresh | AfterEpoch | InsideEpoch | Resized | Complete
FRESH = Fresh()


@dataclass(frozen=True)
class Saved:
    """What the master's checkpoint says of the run so far (:func:`decide`'s input)."""

    done: int  # epochs completed
    workers: int  # the number of workers that completed them
    first_epoch: int  # the epoch of the run's last placement


def decide(
    saved: Saved | None,
    workers: int,
    delivered: bool,
    held: list[set[tuple[int, int]]],
    epochs: int,
) -> RunStart:
    """The run's start from what the run directory holds.

    ``saved``: the master's checkpoint (None: none); ``workers``: the number now; ``epochs``:
    the run's last epoch;
    ``delivered``: the master holds the delivery record of epoch ``done + 1``; ``held``: every
    worker's step checkpoints, as ``(epoch, step)`` pairs (empty sets without step
    checkpoints). A run resumes inside epoch ``done + 1`` at the last step every worker holds,
    if the master holds that epoch's delivery and the number of workers did not change.
    """
    done = saved.done if saved is not None else 0
    if saved is not None and done >= epochs:
        return Complete(done)
    if saved is not None and saved.workers != workers:
        return Resized(done, saved.workers, workers)
    first = saved.first_epoch if saved is not None else 1
    steps = [{s for e, s in mine if e == done + 1} for mine in held]
    common = set.intersection(*steps) if steps and delivered else set()
    if common:
        return InsideEpoch(done, first, max(common))
    if saved is None:
        return Fresh()
    return AfterEpoch(done, first)


@dataclass(frozen=True)
class Opening:
    """What the master tells every rank before the coded shuffle starts."""

    start: RunStart
    classes: int  # the data set's classes (the model's outputs)


def gather_held(held: set[tuple[int, int]]) -> list[set[tuple[int, int]]]:
    """Collective of every rank: every worker's step checkpoints (``held``) to the master,
    which gets them in worker order (``[]`` elsewhere)."""
    roles = context().roles
    rank, world = dist.get_rank(), dist.get_world_size()
    every: list[Any] | None = [None] * world if rank == roles.master else None
    dist.gather_object(held, every, dst=roles.master)
    return [] if every is None else roles.by_role(every)[1:]


def broadcast(opening: Opening | None) -> Opening:
    """Collective of every rank: the master's :class:`Opening` (None elsewhere), on every
    rank."""
    box = [opening]
    dist.broadcast_object_list(box, src=context().master_rank)
    assert isinstance(box[0], Opening)
    return box[0]
