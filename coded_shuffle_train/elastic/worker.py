"""A worker of the elastic jobs: it answers the master's messages from its own persistent
store until told to stop, and leaves an exit record on every way out but SIGKILL."""

from __future__ import annotations

import os
import queue
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coded_shuffle.codec.blockstore import BlockStore
from coded_shuffle.distributed import launcher_env
from coded_shuffle.elastic.protocol import Message, Op, WorkerNode

from ..config import ElasticConf
from .channel import receive_message, send_message


def elastic_dir(conf: ElasticConf, run_dir: Path) -> Path:
    """Where the stores, the checkpoint and the exit records live."""
    return Path(conf.store_dir) if conf.store_dir else run_dir / "elastic"


def _receiver(inbox: queue.Queue[Message | BaseException]) -> None:
    """Blocking gloo receives in a thread, so the main thread stays responsive to SIGTERM."""
    while True:
        try:
            msg = receive_message(0)
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
    ``on_peers`` runs the master-free loop, :mod:`coded_shuffle_train.elastic.peers`).

    Every exit path except SIGKILL (a pre-empted machine) leaves ``pids/rank_<r>.exit``; after
    a restart the master asks every rank (HELLO) whether its previous incarnation left one.
    """
    attempt = launcher_env.attempt()
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
            for work, _ in send_message(reply, 0):
                work.wait()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if reason != "error" or not marker.exists():  # the handler may have written it
            _exit_record(marker, attempt, reason)
