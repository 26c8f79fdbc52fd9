"""What both sides of an epoch share: the settings every rank agreed on, and the pieces
:class:`~coded_shuffle.CodedShuffle` wired (scheme, link, the epochs from the seed)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from coded_shuffle.codec.records import RecordLayout
from coded_shuffle.distributed.epochs import EpochChain, Transition
from coded_shuffle.distributed.transports import Link
from coded_shuffle.math.schemes import Scheme


@dataclass(frozen=True)
class ShuffleSettings:
    """What every rank knows once the master has described its data set."""

    layout: RecordLayout
    num_points: int
    dropped: int
    workers: int
    storage: float
    seed: int


@dataclass
class EpochContext:
    """The pieces both sides of an epoch use (one per rank; built by ``CodedShuffle``)."""

    rank: int
    settings: ShuffleSettings
    scheme: Scheme
    link: Link
    chain: EpochChain
    transitions: Iterator[Transition]  # epochs 2, 3, ... (the same on every rank)
    epochs: int | None  # the number of epochs, if known
    storage_used: float

    @property
    def workers(self) -> int:
        return self.settings.workers

    @property
    def record_bytes(self) -> int:
        return self.settings.layout.record_bytes

    def pending(self, epoch: int) -> bool:
        """Whether an epoch follows ``epoch`` (a store is needed after it)."""
        return self.epochs is None or epoch < self.epochs
