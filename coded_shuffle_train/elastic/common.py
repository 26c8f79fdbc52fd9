"""What both elastic jobs hold: their settings from the typed config, their console (a
record per step and method in ``metrics.jsonl``, a line per event and every ``report_every``
steps), and the master's frame around its methods (the run's line, the channel, the end)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coded_shuffle.elastic.settings import METHODS, Settings, make_settings
from coded_shuffle.elastic.sinks import JsonlSink
from coded_shuffle.errors import UsageError
from coded_shuffle.tools.records import metrics_path

from ..config import Config, ElasticJobConf, ElasticMatmulConf
from ..dist import RankContext
from ..metrics import human_bytes
from .channel import DistChannel

log = logging.getLogger("train")


def settings_from(cfg: Config, valid_methods: Sequence[str] = METHODS) -> Settings:
    """Validated :class:`Settings` from the typed config (``workers`` = ``P``; the methods
    of the job, ``valid_methods``)."""
    job: ElasticJobConf | ElasticMatmulConf = cfg.job
    el = job.elastic
    lr = getattr(job, "lr", None)
    return make_settings(
        workers=cfg.workers,
        recovery_threshold=el.recovery_threshold,
        steps=job.steps,
        events=list(el.events or []) or None,
        methods=list(el.methods),
        generator=str(el.generator),
        seed=int(cfg.seed),
        max_condition=float(el.max_condition),
        lr=None if lr is None else float(lr),
        max_workers=int(cfg.workers),
        step_delay=float(el.step_delay),
        line_search=bool(getattr(job, "line_search", False)),
        valid_methods=valid_methods,
    )


def check_report_every(cfg: Config) -> None:
    """``job.report_every`` in range; and the elastic jobs' master is rank 0."""
    if int(cfg.job.report_every) < 0:
        raise UsageError(f"job.report_every={cfg.job.report_every} must be >= 0 (0: quiet)")
    if int(cfg.dist.master_rank) != 0:
        raise UsageError(
            f"dist.master_rank={cfg.dist.master_rank}: job={cfg.job.name} runs its master on "
            "rank 0 (only job=shuffle_sgd takes another)"
        )


def check_world(cfg: Config, ctx: RankContext) -> None:
    need = int(cfg.workers) + 1
    if ctx.world_size != need:
        raise UsageError(f"{cfg.job.name} needs workers+1={need} processes, not {ctx.world_size}")


class ElasticSink(JsonlSink):
    """``metrics.jsonl``, and the console: every event as it happens and a line every
    ``every`` steps per method (0: events only), written by :attr:`step_line`."""

    def __init__(
        self, path: Path, steps: int, every: int, step_line: Callable[[dict[str, Any]], str]
    ) -> None:
        super().__init__(path)
        self.steps, self.every, self.step_line = steps, every, step_line
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        super().write(record)
        self.records.append(record)
        method, step = str(record["method"]), int(record["step"])
        for text in record.get("events") or []:
            log.info(
                f"{method:11s} step {step:>4}/{self.steps}: {text} -> "
                f"{record['workers_available']} workers, {human_bytes(record['moved_bytes'])} "
                "moved"
            )
        if self.every and (step % self.every == 0 or step == self.steps - 1):
            log.info(f"{method:11s} step {step:>4}/{self.steps}: {self.step_line(record)}")

    def by_method(self) -> dict[str, list[dict[str, Any]]]:
        """The records so far, per method in the order they ran."""
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.records:
            out.setdefault(str(r["method"]), []).append(r)
        return out


@dataclass
class MasterFrame:
    """What an elastic master does around its methods: announces the run, opens the
    channel to the workers, writes ``elastic_summary.json``, and at the end stops every
    worker and prints the closing lines."""

    cfg: Config
    ctx: RankContext
    settings: Settings

    def open(self, what: str) -> DistChannel:
        """The run's line, and the channel to the workers."""
        s = self.settings
        events = "; ".join(f"step {e.step} {e.describe()}" for e in s.events) or "none"
        log.info(
            f"{self.cfg.job.name}: {what}, P = {s.workers}, L = {s.recovery_threshold}, "
            f"{s.steps} steps per method, methods {', '.join(s.methods)}, events: {events}"
        )
        return DistChannel(self.ctx.world_size, self.ctx.timeout)

    def summary(self, summary: dict[str, Any]) -> None:
        (self.ctx.run_dir / "elastic_summary.json").write_text(json.dumps(summary, indent=1))

    def sink(self, step_line: Callable[[dict[str, Any]], str]) -> ElasticSink:
        every = int(self.cfg.job.report_every)
        return ElasticSink(metrics_path(self.ctx.run_dir), self.settings.steps, every, step_line)

    @staticmethod
    def close(channel: DistChannel, head: str, lines: list[str]) -> None:
        channel.stop()
        log.info(head)
        for line in lines:
            log.info(f"  {line}")
