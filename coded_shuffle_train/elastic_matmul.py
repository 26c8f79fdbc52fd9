"""``job=elastic_matmul``: coded elastic ``A x`` and ``A B`` over torch.distributed (Yang et
al. 2018).

Rank 0 is the master: it holds ``A``, draws a fresh right factor every step and runs every method of
:mod:`coded_shuffle.elastic.product_runner` in turn (``coded``, ``uncoded``, ``nonadaptive``). Ranks
``1..P`` are the workers of ``job=elastic_gd`` (the same messages, stores and exit records:
:mod:`coded_shuffle_train.elastic`). A worker process that dies fails the job with one line (no
restart: ``elastic_gd`` shows the restart path)."""

from __future__ import annotations

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

from .config import Config
from .dist import RankContext, setup
from .elastic.common import MasterFrame, check_report_every, check_world, settings_from
from .elastic.worker import elastic_dir, worker_loop
from .jobs import Job
from .metrics import human_bytes


def problem_from(cfg: Config) -> ProductProblem:
    p = cfg.job.problem
    return make_product_problem(
        int(p.rows),
        int(p.cols),
        int(p.rhs_cols),
        int(cfg.workers),
        int(cfg.job.elastic.recovery_threshold),
        int(cfg.seed),
    )


def step_line(record: dict[str, Any]) -> str:
    return (
        f"{record['workers_available']} workers, error {record['result_rel_error']:.1e}, "
        f"{record['step_seconds'] * 1e3:.1f} ms (compute {record['compute_seconds'] * 1e3:.1f}, "
        f"decode {record['decode_seconds'] * 1e3:.1f}, comm {record['comm_seconds'] * 1e3:.1f})"
    )


def closing(records: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = []
    for method, rows in records.items():
        ms = statistics.median(r["step_seconds"] for r in rows) * 1e3
        worst = max(r["result_rel_error"] for r in rows)
        moved = sum(r["moved_bytes"] for r in rows)
        lines.append(
            f"{method:11s} median step {ms:.1f} ms, worst relative error {worst:.1e}, "
            f"{human_bytes(moved)} moved at events"
        )
    return lines


def master_main(cfg: Config, ctx: RankContext) -> None:
    settings, problem = settings_from(cfg, PRODUCT_METHODS), problem_from(cfg)
    elastic_dir(cfg.job.elastic, ctx.run_dir).mkdir(parents=True, exist_ok=True)
    kind = "A x (Algorithm 1)" if problem.rhs_cols == 1 else "A B (sec. 3.1)"
    rows, cols = problem.a.shape
    frame = MasterFrame(cfg, ctx, settings)
    channel = frame.open(f"{kind}, A {rows} x {cols}, {problem.rhs_cols} right-hand column(s)")
    sink = frame.sink(step_line)
    sink.truncate(lambda r: False)
    frame.summary(
        {
            "rows": rows,
            "cols": cols,
            "rhs_cols": problem.rhs_cols,
            "workers": settings.workers,
            "recovery_threshold": settings.recovery_threshold,
            "methods": list(settings.methods),
            "events": [{"step": e.step, "text": e.describe()} for e in settings.events],
        }
    )
    channel.killed_ranks()  # every worker answers once before the first product
    run_products(problem, settings, channel, sink)
    frame.close(channel, "done:", closing(sink.by_method()))


class ElasticMatmul(Job):
    name = "elastic_matmul"

    def validate(self, cfg: Config) -> None:
        """Every check that can fail before a process starts (one :class:`UsageError` line)."""
        s = settings_from(cfg, PRODUCT_METHODS)
        p = cfg.job.problem
        check_product_sizes(p.rows, p.cols, p.rhs_cols, s.workers, s.recovery_threshold)
        systematic_generator(s.workers, s.recovery_threshold, s.generator, s.seed, s.max_condition)
        check_report_every(cfg)

    def run(self, cfg: Config) -> None:
        """One rank of the job; :mod:`coded_shuffle_train.entry` has set the process group up."""
        ctx = setup(cfg)
        check_world(cfg, ctx)
        if ctx.is_master:
            master_main(cfg, ctx)
        else:
            worker_loop(ctx.rank, elastic_dir(cfg.job.elastic, ctx.run_dir))


JOB = ElasticMatmul()
