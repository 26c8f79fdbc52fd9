"""``job=elastic_gd``: coded elastic gradient descent over torch.distributed (Yang et al. 2018).

Rank 0 is the master (it holds ``X``, ``y`` and runs :class:`ElasticMaster`); ranks ``1..P``
are the workers, each with its own persistent store under ``RUN_DIR/elastic/stores``. All
traffic is point-to-point between the master and one worker, so a worker that dies is named by
the connection that fails. The master then checkpoints the loss and exits; torch's elastic
launcher restarts every process (``max_restarts``), the master resumes from the checkpoint
without the lost worker, and the survivors reuse the coded blocks on their disks.

The harness contract of :mod:`train.entry`: ``run(cfg)`` per rank, ``validate(cfg)`` before
any process starts, ``max_restarts(cfg)`` for the launcher (see docs/elastic.md).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from coded_shuffle.codec.blockstore import BlockStore
from coded_shuffle.elastic.generator import systematic_generator
from coded_shuffle.elastic.problem import Problem, make_problem
from coded_shuffle.elastic.protocol import HEADER_INTS, Message, Op, WorkerLost, WorkerNode
from coded_shuffle.elastic.runner import ElasticMaster
from coded_shuffle.elastic.settings import METHODS, Settings, make_settings
from coded_shuffle.elastic.sinks import FileCheckpoint, JsonlSink
from coded_shuffle.errors import UsageError

from . import elastic_peers
from .dist import setup
from .metrics import human_bytes

log = logging.getLogger("train")

# --- configuration ---------------------------------------------------------------------


def settings_from(cfg: Any, valid_methods: Sequence[str] = METHODS) -> Settings:
    """Validated :class:`Settings` from the Hydra config (``workers`` = ``P``; the methods
    of the job, ``valid_methods``: ``elastic_matmul`` passes its own)."""
    job, el = cfg.job, cfg.job.elastic
    events = OmegaConf.to_container(el.events, resolve=True) if el.get("events") else None
    return make_settings(
        workers=cfg.workers,
        recovery_threshold=el.recovery_threshold,
        steps=job.steps,
        events=events,
        methods=list(el.methods),
        generator=str(el.generator),
        seed=int(cfg.get("seed", 0)),
        max_condition=float(el.max_condition),
        lr=None if job.get("lr") is None else float(job.lr),
        max_workers=int(cfg.workers),
        step_delay=float(el.get("step_delay", 0.0)),
        line_search=bool(job.get("line_search", False)),
        valid_methods=valid_methods,
    )


def fully_distributed(cfg: Any) -> bool:
    return bool(cfg.job.elastic.get("fully_distributed", False))


def problem_from(cfg: Any) -> Problem:
    p = cfg.job.problem
    return make_problem(
        int(p.points),
        int(p.features),
        int(cfg.workers),
        float(p.noise),
        float(p.heterogeneity),
        float(cfg.job.get("ridge", 0.0)),
        int(cfg.get("seed", 0)),
        int(p.get("test_points", 0)),
    )


def validate(cfg: Any) -> None:
    """Every check that can fail before a process starts (one :class:`UsageError` line)."""
    s = settings_from(cfg)
    problem_from(cfg).step_size(s.lr)
    if "coded" in s.methods:
        systematic_generator(s.workers, s.recovery_threshold, s.generator, s.seed, s.max_condition)
    if int(cfg.job.get("report_every", 10)) < 0:
        raise UsageError(f"job.report_every={cfg.job.report_every} must be >= 0 (0: quiet)")
    if int(cfg.job.elastic.get("max_restarts", 0)) < 0:
        raise UsageError(f"job.elastic.max_restarts={cfg.job.elastic.max_restarts} must be >= 0")
    if fully_distributed(cfg):
        elastic_peers.check(s)
        if s.line_search:
            raise UsageError(
                "job.line_search needs the master (trial losses); not with "
                "job.elastic.fully_distributed"
            )


def max_restarts(cfg: Any) -> int:
    """How often the launcher restarts the job after a process dies (``job.elastic``)."""
    return int(cfg.job.elastic.get("max_restarts", 0))


# --- transport ---------------------------------------------------------------------------


def _isend(msg: Message, dst: int) -> list[tuple[dist.Work, torch.Tensor]]:
    header = torch.tensor([msg.op, msg.ints.size, msg.floats.size], dtype=torch.int64)
    tensors = [header]
    if msg.ints.size:
        tensors.append(torch.from_numpy(msg.ints))
    if msg.floats.size:
        tensors.append(torch.from_numpy(msg.floats))
    return [(dist.isend(t, dst), t) for t in tensors]


def _recv(src: int) -> Message:
    header = torch.empty(HEADER_INTS, dtype=torch.int64)
    dist.recv(header, src)
    op, n_ints, n_floats = (int(v) for v in header)
    ints = torch.empty(n_ints, dtype=torch.int64)
    floats = torch.empty(n_floats, dtype=torch.float64)
    if n_ints:
        dist.recv(ints, src)
    if n_floats:
        dist.recv(floats, src)
    return Message(op, ints.numpy(), floats.numpy())


def _recv_after(msg: Message, rank: int) -> Message:
    works = _isend(msg, rank)
    reply = _recv(rank)
    for work, _ in works:
        work.wait()
    return reply


class DistChannel:
    """Point-to-point gloo messages between the master and the workers (ranks = worker ids).

    Idle ranks (departed workers, a killed rank after the restart) get a 24-byte keep-alive
    header whenever they have not heard from the master for a quarter of the timeout, so their
    blocking receive never times out; those bytes are counted in ``overhead_bytes``.
    """

    def __init__(self, world: int, timeout: timedelta) -> None:
        self.ranks = list(range(1, world))
        self.keepalive = timeout.total_seconds() / 4
        self.last = {r: time.monotonic() for r in self.ranks}
        self.overhead_bytes = 0

    def exchange(self, requests: dict[int, Message]) -> dict[int, Message]:
        pending = []
        for rank, msg in requests.items():
            try:
                pending += [(rank, w, t) for w, t in _isend(msg, rank)]
            except RuntimeError:
                raise WorkerLost([rank]) from None
        replies = {}
        for rank in requests:
            try:
                replies[rank] = _recv(rank)
            except RuntimeError:
                raise WorkerLost([rank]) from None
            self.last[rank] = time.monotonic()
        for rank, work, _ in pending:
            try:
                work.wait()
            except RuntimeError:
                raise WorkerLost([rank]) from None
        self._keep_alive(set(requests))
        return replies

    def send_all(self, msg: Message) -> None:
        """One message to every worker rank, no reply expected."""
        pending = [w for rank in self.ranks for w in _isend(msg, rank)]
        for work, _ in pending:
            work.wait()
        now = time.monotonic()
        self.last = {r: now for r in self.ranks}

    def keep_alive(self) -> None:
        """Keep-alive headers to every rank not heard from for a quarter of the timeout."""
        self._keep_alive(set())

    def _keep_alive(self, contacted: set[int]) -> None:
        now = time.monotonic()
        for rank in self.ranks:
            if rank not in contacted and now - self.last[rank] > self.keepalive:
                noop = Message.make(Op.NOOP)
                try:
                    for work, _ in _isend(noop, rank):
                        work.wait()
                except RuntimeError:
                    continue  # an idle rank that is gone: nothing depends on it
                self.overhead_bytes += noop.nbytes
                self.last[rank] = now

    def killed_ranks(self) -> list[int]:
        """Ranks whose previous incarnation died without an exit record (SIGKILL), by HELLO."""
        replies = {r: _recv_after(Message.make(Op.HELLO), r) for r in self.ranks}
        hello = Message.make(Op.HELLO).nbytes
        self.overhead_bytes += sum(hello + m.nbytes for m in replies.values())
        return [r for r, m in replies.items() if int(m.ints[0]) == 0]

    def stop(self) -> None:
        """Tells every worker rank to finish (ranks that are gone are skipped)."""
        for rank in self.ranks:
            try:
                for work, _ in _isend(Message.make(Op.STOP), rank):
                    work.wait()
            except RuntimeError:
                continue


# --- console progress --------------------------------------------------------------------


class ProgressSink:
    """``metrics.jsonl`` as before, and the console: a line every ``every`` steps per method
    (0: none), every event as it happens, and :meth:`closing` lines at the end."""

    def __init__(self, inner: JsonlSink, steps: int, every: int) -> None:
        self.inner, self.steps, self.every = inner, steps, every
        self.last: dict[str, dict[str, Any]] = {}
        self.worst_error: dict[str, float] = {}
        self.moved: dict[str, list[str]] = {}

    def write(self, record: dict[str, Any]) -> None:
        self.inner.write(record)
        method, step = str(record["method"]), int(record["step"])
        self.last[method] = record
        error = float(record.get("grad_rel_error", 0.0))
        self.worst_error[method] = max(self.worst_error.get(method, 0.0), error)
        for text in record.get("events") or []:
            moved = human_bytes(record["moved_bytes"])
            self.moved.setdefault(method, []).append(f"{text}: {moved}")
            log.info(
                f"{method:11s} step {step:>4}/{self.steps}: {text} -> "
                f"{record['workers_available']} workers, {moved} moved"
            )
        if self.every and (step % self.every == 0 or step == self.steps - 1):
            log.info(
                f"{method:11s} step {step:>4}/{self.steps}: {record['workers_available']} "
                f"workers, loss {record['train_loss']:.6g}, gradient error {error:.1e}, "
                f"{human_bytes(record['comm_bytes'])} exchanged, {record['step_seconds']:.3f} s"
            )

    def truncate(self, keep: Any) -> None:
        self.inner.truncate(keep)

    def closing(self, run_dir: Path) -> list[str]:
        lines = []
        for method, record in self.last.items():
            events = "; ".join(self.moved.get(method, [])) or "no events"
            lines.append(
                f"{method:11s} final loss {record['train_loss']:.6g}, worst gradient error "
                f"{self.worst_error[method]:.1e}; moved per event: {events}"
            )
        lines.append(
            f"files: {run_dir}/metrics.jsonl (a record per step and method), "
            "elastic_summary.json, elastic_status.json"
        )
        return lines


# --- per-rank code -----------------------------------------------------------------------


def elastic_dir(cfg: Any, run_dir: Path) -> Path:
    custom = cfg.job.elastic.get("store_dir")
    return Path(custom) if custom else run_dir / "elastic"


def _receiver(inbox: queue.Queue[Message | BaseException]) -> None:
    """Blocking gloo receives in a thread, so the main thread stays responsive to SIGTERM."""
    while True:
        try:
            msg = _recv(0)
        except BaseException as exc:  # the master is gone: hand the error to the main thread
            inbox.put(exc)
            return
        inbox.put(msg)
        if msg.op == Op.STOP:
            return


def _exit_record(marker: Path, attempt: int, reason: str) -> None:
    """Writes the exit record atomically (a torn file would read as a kill)."""
    tmp = marker.with_name(f"{marker.name}.{reason}.tmp")
    tmp.write_text(f"{attempt} {reason}")
    os.replace(tmp, marker)


def _on_sigterm(marker: Path, attempt: int) -> Any:
    """SIGTERM from the launcher: record the exit here (a second SIGTERM is ignored), leave."""

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _exit_record(marker, attempt, "terminated")
        raise SystemExit(128 + signum)

    return handler


def worker_loop(
    rank: int, root: Path, on_peers: Callable[[WorkerNode, Message], None] | None = None
) -> None:
    """A worker: answer the master's messages from its own store until STOP (``PEERS``:
    ``on_peers`` runs the master-free loop, :mod:`train.elastic_peers`).

    Every exit path except SIGKILL (a pre-empted machine) leaves ``pids/rank_<r>.exit``; after
    a restart the master asks every rank (HELLO) whether its previous incarnation left one.
    """
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    pids = root / "pids"
    pids.mkdir(parents=True, exist_ok=True)
    marker = pids / f"rank_{rank}.exit"
    previous = marker.read_text().split()[0] if marker.exists() else ""
    clean = -1 if attempt == 0 else int(previous == str(attempt - 1))
    marker.unlink(missing_ok=True)
    (pids / f"rank_{rank}").write_text(str(os.getpid()))
    node = WorkerNode(BlockStore(root / "stores" / f"worker_{rank}"))
    inbox: queue.Queue[Message | BaseException] = queue.Queue()
    threading.Thread(target=_receiver, args=(inbox,), daemon=True).start()
    signal.signal(signal.SIGTERM, _on_sigterm(marker, attempt))
    reason = "error"
    try:
        while True:
            try:
                msg = inbox.get(timeout=1.0)
            except queue.Empty:
                continue
            if isinstance(msg, BaseException):
                raise msg
            if msg.op == Op.STOP:
                reason = "stop"
                return
            if msg.op == Op.NOOP:
                continue
            if msg.op == Op.PEERS and on_peers is not None:
                on_peers(node, msg)
                continue
            reply = Message.make(Op.HELLO, [clean]) if msg.op == Op.HELLO else node.handle(msg)
            for work, _ in _isend(reply, 0):
                work.wait()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if reason != "error" or not marker.exists():  # the handler may have written it
            _exit_record(marker, attempt, reason)


def master_main(cfg: Any, run_dir: Path, world: int, timeout: timedelta) -> None:
    """The master: the methods in turn, metrics, checkpoints; a lost worker ends the process.
    In the fully distributed mode it only places the blocks and records what the workers do."""
    settings, problem = settings_from(cfg), problem_from(cfg)
    peers = fully_distributed(cfg)
    root = elastic_dir(cfg, run_dir)
    root.mkdir(parents=True, exist_ok=True)
    transport = DistChannel(world, timeout)
    every = int(cfg.job.get("report_every", 10))
    sink = ProgressSink(JsonlSink(run_dir / "metrics.jsonl"), settings.steps, every)
    log.info(
        f"elastic_gd: P = {settings.workers} workers, L = {settings.recovery_threshold}, "
        f"N = {problem.num_points} x {problem.features}, {settings.steps} steps per method, "
        f"methods {', '.join(settings.methods)}, events: "
        + ("; ".join(f"step {e.step} {e.describe()}" for e in settings.events) or "none")
    )
    master = ElasticMaster(
        problem, settings, transport, sink, FileCheckpoint(root / "checkpoint.pkl")
    )
    summary = {**master.summary(), "mode": "fully_distributed" if peers else "master"}
    (run_dir / "elastic_summary.json").write_text(json.dumps(summary, indent=1))
    status: dict[str, Any] = {"status": "finished"}
    try:
        killed = transport.killed_ranks()
        if peers:
            sink.truncate(lambda r: False)
            elastic_peers.master(settings, problem, transport, sink)
        else:
            master.run(killed=killed)
    except UsageError as exc:  # e.g. a real loss below the recovery threshold
        status = {"status": "stopped", "reason": str(exc)}
        print(f"elastic_gd: stopped: {exc}", file=sys.stderr, flush=True)
    status.update(restarts=master.restarts, lost=master.lost)
    status["overhead_bytes"] = transport.overhead_bytes  # HELLO and keep-alive headers
    (run_dir / "elastic_status.json").write_text(json.dumps(status, indent=1))
    transport.stop()
    log.info(f"done ({status['status']}, {master.restarts} restarts):")
    for line in sink.closing(run_dir):
        log.info(f"  {line}")


def run(cfg: Any) -> None:
    """One rank of the job; :mod:`train.entry` has set the process group up (restart-safe)."""
    ctx = setup(cfg)
    if ctx.world_size != int(cfg.workers) + 1:
        need = int(cfg.workers) + 1
        raise UsageError(f"elastic_gd needs workers+1={need} processes, not {ctx.world_size}")
    if ctx.is_master:
        master_main(cfg, ctx.run_dir, ctx.world_size, ctx.timeout)
    else:
        settings = settings_from(cfg)

        def on_peers(node: WorkerNode, msg: Message) -> None:
            elastic_peers.worker(ctx.rank, node, msg, settings)

        worker_loop(ctx.rank, elastic_dir(cfg, ctx.run_dir), on_peers)
