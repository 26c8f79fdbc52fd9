"""``job=elastic_gd``: coded elastic gradient descent over torch.distributed (Yang et al. 2018).

Rank 0 is the master (it holds ``X``, ``y`` and runs
:class:`~coded_shuffle.elastic.runner.ElasticMaster`); ranks ``1..P`` are the workers, each with its
own persistent store under ``RUN_DIR/elastic/stores`` (:mod:`coded_shuffle_train.elastic.worker`).
All traffic is point-to-point between the master and one worker
(:mod:`coded_shuffle_train.elastic.channel`), so a worker that dies is named by the connection that
fails. The master then checkpoints the loss and exits; torch's elastic launcher restarts every
process (``dist.max_restarts``, 1 unless set), the master resumes from the checkpoint without
the lost worker, and the survivors reuse the coded blocks on their disks (docs/elastic.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from coded_shuffle.elastic.generator import systematic_generator
from coded_shuffle.elastic.problem import Problem, make_problem
from coded_shuffle.elastic.protocol import Message, WorkerNode
from coded_shuffle.elastic.runner import ElasticMaster
from coded_shuffle.elastic.sinks import FileCheckpoint
from coded_shuffle.errors import UsageError

from .config import Config
from .dist import RankContext, setup
from .elastic import peers
from .elastic.common import MasterFrame, check_report_every, check_world, settings_from
from .elastic.worker import elastic_dir, worker_loop
from .jobs import Job
from .metrics import human_bytes


def problem_from(cfg: Config) -> Problem:
    p = cfg.job.problem
    return make_problem(
        int(p.points),
        int(p.features),
        int(cfg.workers),
        float(p.noise),
        float(p.heterogeneity),
        float(cfg.job.ridge),
        int(cfg.seed),
        int(p.test_points),
    )


def step_line(record: dict[str, Any]) -> str:
    return (
        f"{record['workers_available']} workers, loss {record['train_loss']:.6g}, gradient "
        f"error {float(record.get('grad_rel_error', 0.0)):.1e}, "
        f"{human_bytes(record['comm_bytes'])} exchanged, {record['step_seconds']:.3f} s"
    )


def closing(records: dict[str, list[dict[str, Any]]], run_dir: Path) -> list[str]:
    lines = []
    for method, rows in records.items():
        worst = max(float(r.get("grad_rel_error", 0.0)) for r in rows)
        moved = [f"{t}: {human_bytes(r['moved_bytes'])}" for r in rows for t in r["events"]]
        lines.append(
            f"{method:11s} final loss {rows[-1]['train_loss']:.6g}, worst gradient error "
            f"{worst:.1e}; moved per event: {'; '.join(moved) or 'no events'}"
        )
    lines.append(
        f"files: {run_dir}/metrics.jsonl (a record per step and method), "
        "elastic_summary.json, elastic_status.json"
    )
    return lines


def master_main(cfg: Config, ctx: RankContext) -> None:
    """The master: the methods in turn, metrics, checkpoints; a lost worker ends the process.
    In the fully distributed mode it only places the blocks and records what the workers do."""
    settings, problem = settings_from(cfg), problem_from(cfg)
    distributed = cfg.job.elastic.fully_distributed
    root = elastic_dir(cfg.job.elastic, ctx.run_dir)
    root.mkdir(parents=True, exist_ok=True)
    frame = MasterFrame(cfg, ctx, settings)
    channel = frame.open(f"N = {problem.num_points} x {problem.features}")
    sink = frame.sink(step_line)
    checkpoint = FileCheckpoint(root / "checkpoint.pkl")
    master = ElasticMaster(problem, settings, channel, sink, checkpoint)
    frame.summary({**master.summary(), "mode": "fully_distributed" if distributed else "master"})
    status: dict[str, Any] = {"status": "finished"}
    try:
        killed = channel.killed_ranks()
        if distributed:
            sink.truncate(lambda r: False)
            peers.master(settings, problem, channel, sink)
        else:
            master.run(killed=killed)
    except UsageError as exc:  # e.g. a real loss below the recovery threshold
        status = {"status": "stopped", "reason": str(exc)}
        print(f"elastic_gd: stopped: {exc}", file=sys.stderr, flush=True)
    status.update(restarts=master.restarts, lost=master.lost)
    status["overhead_bytes"] = channel.overhead_bytes  # HELLO and keep-alive headers
    (ctx.run_dir / "elastic_status.json").write_text(json.dumps(status, indent=1))
    head = f"done ({status['status']}, {master.restarts} restarts):"
    frame.close(channel, head, closing(sink.by_method(), ctx.run_dir))


class ElasticGD(Job):
    name = "elastic_gd"
    default_restarts = 1  # a worker that dies is survived: the master resumes without it

    def validate(self, cfg: Config) -> None:
        """Every check that can fail before a process starts (one :class:`UsageError` line)."""
        s = settings_from(cfg)
        problem_from(cfg).step_size(s.lr)
        if "coded" in s.methods:
            systematic_generator(
                s.workers, s.recovery_threshold, s.generator, s.seed, s.max_condition
            )
        check_report_every(cfg)
        el = cfg.job.elastic
        if el.fully_distributed:
            peers.check(s)
            if s.line_search:
                raise UsageError(
                    "job.line_search needs the master (trial losses); not with "
                    "job.elastic.fully_distributed"
                )

    def run(self, cfg: Config) -> None:
        """One rank of the job; :mod:`coded_shuffle_train.entry` has set the process group up."""
        ctx = setup(cfg)
        check_world(cfg, ctx)
        if ctx.is_master:
            master_main(cfg, ctx)
            return
        settings = settings_from(cfg)

        def on_peers(node: WorkerNode, msg: Message) -> None:
            peers.worker(ctx.rank, node, msg, settings)

        worker_loop(ctx.rank, elastic_dir(cfg.job.elastic, ctx.run_dir), on_peers)


JOB = ElasticGD()
