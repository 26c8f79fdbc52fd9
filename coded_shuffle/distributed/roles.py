"""Which rank of the job plays which part: the master on any rank, the workers on the others.

The library thinks in *roles*: role 0 is the master (it holds the data set), roles ``1..K``
are the workers, in the order of their ranks. A job chooses its master's rank
(``CodedShuffle(master_rank=R)``, the training job's ``dist.master_rank``): a storage host's
one process beside training hosts with several workers each gets the rank the launcher gave
it, not rank 0. Every collective and point-to-point call of the library names its peers
through :meth:`Roles.rank`; every list a collective returns in rank order is put in role order
with :meth:`Roles.by_role`. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from coded_shuffle.errors import UsageError

T = TypeVar("T")


@dataclass(frozen=True)
class Roles:
    """The master's rank among ``world`` ranks; the workers are the other ranks in order."""

    master: int = 0
    world: int = 2

    def check(self, name: str = "master_rank") -> None:
        """:class:`UsageError` naming ``name`` unless the master is one of the ranks."""
        if not 0 <= self.master < self.world:
            raise UsageError(
                f"{name}={self.master} out of range 0..{self.world - 1} (the job's ranks)"
            )

    @property
    def workers(self) -> int:
        return self.world - 1

    def rank(self, role: int) -> int:
        """The rank that plays ``role`` (0: the master; ``w + 1``: worker ``w``)."""
        if role == 0:
            return self.master
        return role - 1 if role <= self.master else role

    def role(self, rank: int) -> int:
        """The role of ``rank``."""
        if rank == self.master:
            return 0
        return rank + 1 if rank < self.master else rank

    def worker_ranks(self) -> list[int]:
        """The workers' ranks, worker 0 first (also their order in any group of them)."""
        return [self.rank(role) for role in range(1, self.world)]

    def by_role(self, by_rank: Sequence[T]) -> list[T]:
        """A collective's results (one per rank, in rank order) in role order."""
        return [by_rank[self.rank(role)] for role in range(self.world)]

    def label(self, rank: int) -> str:
        """How messages name ``rank``: ``rank 4 (master)``, ``rank 2 (worker 1)``."""
        role = self.role(rank)
        return f"rank {rank} (master)" if role == 0 else f"rank {rank} (worker {role - 1})"
