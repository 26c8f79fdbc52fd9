"""The elastic jobs' settings: methods, workers, events, steps (one frozen dataclass),
and the checks that build it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coded_shuffle.elastic.generator import KINDS
from coded_shuffle.elastic.membership import (
    Event,
    check_schedule,
    parse_events,
)
from coded_shuffle.errors import UsageError

METHODS = ("coded", "nofailure", "ignore", "repartition", "distr_bgd")
CODED, UNCODED = 0, 1  # store slots


@dataclass(frozen=True)
class Settings:
    """Validated job settings (``workers`` is ``P``, ``recovery_threshold`` is ``L``)."""

    workers: int
    recovery_threshold: int
    steps: int
    events: tuple[Event, ...] = ()
    methods: tuple[str, ...] = METHODS
    generator: str = "gaussian"
    seed: int = 0
    max_condition: float = 1e6
    lr: float | None = None
    max_workers: int | None = None
    step_delay: float = 0.0
    line_search: bool = False


def make_settings(
    workers: int,
    recovery_threshold: int,
    steps: int,
    events: Any = None,
    methods: Sequence[str] = METHODS,
    generator: str = "gaussian",
    seed: int = 0,
    max_condition: float = 1e6,
    lr: float | None = None,
    max_workers: int | None = None,
    step_delay: float = 0.0,
    valid_methods: Sequence[str] = METHODS,
    line_search: bool = False,
) -> Settings:
    """Checks every value and replays the events (:class:`UsageError` on the first bad one);
    ``methods`` must come from ``valid_methods`` (the job's)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 2:
        raise UsageError(f"workers P={workers!r} must be an integer >= 2")
    size = recovery_threshold
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size < workers:
        raise UsageError(
            f"job.elastic.recovery_threshold L={size!r} out of range 1..{workers - 1} (P-1)"
        )
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise UsageError(f"job.steps={steps!r} must be an integer >= 1")
    methods = tuple(methods)
    bad = [m for m in methods if m not in valid_methods]
    if not methods or bad or len(set(methods)) != len(methods):
        raise UsageError(
            f"job.elastic.methods={list(methods)} must list distinct names from "
            f"{list(valid_methods)}"
        )
    if generator not in KINDS:
        raise UsageError(f"job.elastic.generator={generator!r}; valid: {', '.join(KINDS)}")
    if step_delay < 0:
        raise UsageError(f"job.elastic.step_delay={step_delay} must be >= 0")
    parsed = parse_events(events, steps)
    check_schedule(parsed, workers, size, max_workers)
    return Settings(
        workers,
        size,
        steps,
        parsed,
        methods,
        generator,
        int(seed),
        float(max_condition),
        lr,
        max_workers,
        float(step_delay),
        bool(line_search),
    )
