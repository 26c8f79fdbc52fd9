"""``job=elastic_matmul``: coded elastic ``A x`` and ``A B`` over
torch.distributed (Yang et al. 2018).

Rank 0 is the master: it holds ``A``, draws a fresh right factor every step and runs every
method of :mod:`coded_shuffle.elastic.product_runner` in turn (``coded``, ``uncoded``,
``nonadaptive``). Ranks ``1..P`` are the workers of ``job=elastic_gd`` (the same messages,
stores and exit records). A worker process that dies fails the job with one line (no restart:
``elastic_gd`` shows the restart path).
"""

from __future__ import annotations

import json
import logging
import statistics
from typing import Any

from coded_shuffle.elastic.generator import systematic_generator
from coded_shuffle.elastic.product_runner import (
    PRODUCT_METHODS,
    ProductProblem,
    check_product_sizes,
    make_product_problem,
    run_products,
)
from coded_shuffle.elastic.settings import Settings
from coded_shuffle.elastic.sinks import JsonlSink
from coded_shuffle.errors import UsageError

from .dist import setup
from .elastic_gd import DistChannel, elastic_dir, worker_loop
from .elastic_gd import settings_from as gd_settings
from .metrics import human_bytes

log = logging.getLogger("train")


def settings_from(cfg: Any) -> Settings:
    """Validated :class:`Settings` (``workers`` = ``P``; methods of this job)."""
    return gd_settings(cfg, PRODUCT_METHODS)


def problem_from(cfg: Any) -> ProductProblem:
    p = cfg.job.problem
    return make_product_problem(
        p.rows,
        p.cols,
        p.get("rhs_cols", 1),
        int(cfg.workers),
        int(cfg.job.elastic.recovery_threshold),
        int(cfg.get("seed", 0)),
    )


def validate(cfg: Any) -> None:
    """Every check that can fail before a process starts (one :class:`UsageError` line)."""
    s = settings_from(cfg)
    p = cfg.job.problem
    check_product_sizes(p.rows, p.cols, p.get("rhs_cols", 1), s.workers, s.recovery_threshold)
    systematic_generator(s.workers, s.recovery_threshold, s.generator, s.seed, s.max_condition)
    if int(cfg.job.get("report_every", 5)) < 0:
        raise UsageError(f"job.report_every={cfg.job.report_every} must be >= 0 (0: quiet)")


class ProgressSink(JsonlSink):
    """``metrics.jsonl``, a console line every ``every`` steps and per event, and a summary."""

    def __init__(self, path: Any, steps: int, every: int) -> None:
        super().__init__(path)
        self.steps, self.every = steps, every
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        super().write(record)
        self.records.append(record)
        method, step = record["method"], int(record["step"])
        for text in record["events"]:
            log.info(
                f"{method:11s} step {step:>4}/{self.steps}: {text} -> "
                f"{record['workers_available']} workers, {human_bytes(record['moved_bytes'])} moved"
            )
        if self.every and (step % self.every == 0 or step == self.steps - 1):
            log.info(
                f"{method:11s} step {step:>4}/{self.steps}: {record['workers_available']} workers, "
                f"error {record['result_rel_error']:.1e}, {record['step_seconds'] * 1e3:.1f} ms "
                f"(compute {record['compute_seconds'] * 1e3:.1f}, decode "
                f"{record['decode_seconds'] * 1e3:.1f}, comm {record['comm_seconds'] * 1e3:.1f})"
            )

    def closing(self) -> list[str]:
        lines = []
        for method in dict.fromkeys(r["method"] for r in self.records):
            rows = [r for r in self.records if r["method"] == method]
            ms = statistics.median(r["step_seconds"] for r in rows) * 1e3
            worst = max(r["result_rel_error"] for r in rows)
            moved = sum(r["moved_bytes"] for r in rows)
            lines.append(
                f"{method:11s} median step {ms:.1f} ms, worst relative error {worst:.1e}, "
                f"{human_bytes(moved)} moved at events"
            )
        return lines


def master_main(cfg: Any, ctx: Any) -> None:
    settings, problem = settings_from(cfg), problem_from(cfg)
    elastic_dir(cfg, ctx.run_dir).mkdir(parents=True, exist_ok=True)
    transport = DistChannel(ctx.world_size, ctx.timeout)
    every = int(cfg.job.get("report_every", 5))
    sink = ProgressSink(ctx.run_dir / "metrics.jsonl", settings.steps, every)
    sink.truncate(lambda r: False)
    kind = "A x (Algorithm 1)" if problem.rhs_cols == 1 else "A B (sec. 3.1)"
    rows, cols = problem.a.shape
    log.info(
        f"elastic_matmul: {kind}, A {rows} x {cols}, {problem.rhs_cols} right-hand column(s), "
        f"P = {settings.workers}, L = {settings.recovery_threshold}, {settings.steps} steps "
        f"per method, methods {', '.join(settings.methods)}, events: "
        + ("; ".join(f"step {e.step} {e.describe()}" for e in settings.events) or "none")
    )
    summary = {
        "rows": rows,
        "cols": cols,
        "rhs_cols": problem.rhs_cols,
        "workers": settings.workers,
        "recovery_threshold": settings.recovery_threshold,
        "methods": list(settings.methods),
        "events": [{"step": e.step, "text": e.describe()} for e in settings.events],
    }
    (ctx.run_dir / "elastic_summary.json").write_text(json.dumps(summary, indent=1))
    transport.killed_ranks()  # every worker answers once before the first product
    run_products(problem, settings, transport, sink)
    transport.stop()
    log.info("done:")
    for line in sink.closing():
        log.info(f"  {line}")


def run(cfg: Any) -> None:
    """One rank of the job; :mod:`train.entry` has set the process group up."""
    ctx = setup(cfg)
    if ctx.world_size != int(cfg.workers) + 1:
        need = int(cfg.workers) + 1
        raise UsageError(f"elastic_matmul needs workers+1={need} processes, not {ctx.world_size}")
    if ctx.is_master:
        master_main(cfg, ctx)
    else:
        worker_loop(ctx.rank, elastic_dir(cfg, ctx.run_dir))
