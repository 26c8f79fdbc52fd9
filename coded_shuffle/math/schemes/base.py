"""What every scheme implements, and the cache state it carries from epoch to epoch."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import batches
from coded_shuffle.math.plan import DeliveryPlan, subpoints_of
from coded_shuffle.math.state import CacheState, batch_state
from coded_shuffle.math.transition_bounds import lower_bound


class Scheme(ABC):
    """A coded-shuffling scheme: placement, delivery plan, cache update."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    coded: ClassVar[bool] = True  # False: every symbol is one sub-point (point-to-point ok)
    placement: ClassVar[str | None] = None  # family name; None: derived by placement_family
    max_workers: ClassVar[int | None] = None  # the largest K it plans for (None: any)
    sender: ClassVar[str] = "master"  # who sends a delivery: the master, or "workers"
    bound_label: ClassVar[str] = "lower bound"  # what transition_bound reports

    def __init__(self, point_bytes: int | None = None) -> None:
        """``point_bytes``: the size of the points it will carry, if known (schemes that cut
        points into parts fit the parts to it, docs/excess-storage.md, sub-point
        size); fixed for the scheme's life."""
        self.point_bytes = point_bytes

    @classmethod
    def placement_family(cls) -> str:
        """Schemes of one family share placement and cache update (``best`` mixes them).

        ``placement`` if set; else ``"batch"`` for schemes that keep the default placement and
        update (whole batches, no excess storage); else the scheme's own name.
        """
        if cls.placement is not None:
            return cls.placement
        default = cls.initial_state is Scheme.initial_state and cls.next_state is Scheme.next_state
        return "batch" if default else cls.name

    @classmethod
    def applicable(cls, num_points: int, num_workers: int, storage: float) -> bool:
        """Whether :meth:`check` accepts these parameters (``best`` asks every scheme)."""
        try:
            cls(None).check(num_points, num_workers, storage)
        except UsageError:
            return False
        return True

    def check(self, num_points: int, num_workers: int, storage: float) -> None:
        """Raises :class:`UsageError` unless the scheme supports these parameters."""
        if self.max_workers is not None and num_workers > self.max_workers:
            raise UsageError(
                f"{self.name}: K={num_workers} workers is above the {self.max_workers} it plans "
                "for (its placement and plans grow too fast beyond); use cycles, attia-tandon "
                "or best"
            )
        if not 1 <= storage <= num_workers:
            raise UsageError(f"storage T={storage} out of range 1..{num_workers} (workers)")

    def initial_state(self, assignment: np.ndarray, num_workers: int, storage: float) -> CacheState:
        """Placement before the first coded delivery (the first epoch's data is sent uncoded)."""
        return batch_state(assignment, num_workers)

    @abstractmethod
    def plan(self, state: CacheState, new_assignment: np.ndarray) -> DeliveryPlan:
        """The delivery that takes ``state`` to ``new_assignment``."""

    def next_state(
        self, state: CacheState, plan: DeliveryPlan, new_assignment: np.ndarray
    ) -> CacheState:
        """What every worker holds after the delivery (default: its new batch only)."""
        return batch_state(new_assignment, state.num_workers)

    def transition_bound(self, state: CacheState, new_assignment: np.ndarray) -> tuple[float, bool]:
        """``(lower bound in points, exact)`` reported beside the delivery ``state -> new``: the
        best per-transition bound the project computes for a delivery from the master."""
        return lower_bound(state, new_assignment)

    def check_point_bytes(self, num_workers: int, storage: float) -> None:
        """Raises :class:`UsageError` when the scheme's sub-points of ``point_bytes``-byte
        points would become tiny (docs/excess-storage.md, sub-point size).
        Whole-point schemes need nothing."""
        return None

    def part_caches(self, state: CacheState, worker: int) -> list[np.ndarray]:
        """``worker``'s cached sub-points per byte part (one part unless memory sharing)."""
        return [state.caches[worker]]

    def stored_points_max(self, state: CacheState) -> float:
        return float(state.stored_points().max())


def batch_plan_fields(state: CacheState, new_assignment: np.ndarray) -> dict[str, Any]:
    """The plan fields shared by every scheme (caches before, batches after)."""
    return {
        "num_workers": state.num_workers,
        "num_points": state.num_points,
        "splits": state.splits,
        "caches": state.caches,
        "new_batches": tuple(
            b.astype(np.int64) for b in batches(new_assignment, state.num_workers)
        ),
    }


def uncoded_symbols(state: CacheState, new_assignment: np.ndarray) -> np.ndarray:
    """Every demanded sub-point once, as degree-1 symbols (docs/model.md, uncoded delivery)."""
    news = batches(new_assignment, state.num_workers)
    demanded = [
        np.setdiff1d(subpoints_of(b, state.splits), c, assume_unique=True)
        for b, c in zip(news, state.caches, strict=True)
    ]
    return np.concatenate(demanded)[:, None]
