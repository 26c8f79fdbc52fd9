"""What both sides of an epoch share: the data set's shape every rank agreed on, the settings,
and the pieces :class:`~coded_shuffle.CodedShuffle` wired (scheme, link, the epochs from the
seed)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from coded_shuffle.codec.records import RecordLayout
from coded_shuffle.distributed.epochs import EpochChain, Transition
from coded_shuffle.distributed.settings import ShuffleSettings
from coded_shuffle.distributed.transports import Link
from coded_shuffle.math.schemes import Scheme


@dataclass(frozen=True)
class DataShape:
    """What every rank knows once the master has described its data set."""

    layout: RecordLayout
    num_points: int  # N, a multiple of the workers
    dropped: int  # items dropped so that the workers divide N
    workers: int


@dataclass
class EpochContext:
    """The pieces both sides of an epoch use (one per rank; built by ``CodedShuffle``)."""

    rank: int
    shape: DataShape
    settings: ShuffleSettings
    scheme: Scheme
    link: Link
    chain: EpochChain
    transitions: Iterator[Transition]  # epochs 2, 3, ... (the same on every rank)
    storage_used: float

    def identity(self) -> dict[str, Any]:
        """Every key that decides the run's batches: the settings' (scheme, storage, seed,
        shuffle policy, placement, the epoch of the placement) and the shape's (workers,
        points). One home: :meth:`~coded_shuffle.CodedShuffle.state_dict` holds it, and every
        store on disk is stamped with it."""
        s = self.settings
        return {
            "scheme": s.scheme,
            "storage": float(s.storage),
            "seed": int(s.seed),
            "shuffle": s.shuffle,
            "fraction": float(s.fraction),
            "placement": s.placement,
            "first_epoch": int(s.first_epoch),
            "workers": self.shape.workers,
            "points": self.shape.num_points,
        }

    def pending(self, epoch: int) -> bool:
        """Whether an epoch follows ``epoch`` (a store is needed after it)."""
        epochs = self.settings.epochs
        return epochs is None or epoch < epochs
