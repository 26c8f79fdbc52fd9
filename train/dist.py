"""Process-group setup shared by every job (rank 0 = master, ranks 1..K = workers).

Every job module calls :func:`context` (or :func:`setup`, which is idempotent) to get its
:class:`RankContext`; the per-rank entry point (:mod:`train.entry`) has already set the
process group up before it calls ``train.<job>.run(cfg)``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from coded_shuffle.errors import UsageError

log = logging.getLogger("train")

# A rank that sees a peer vanish waits this long before it fails, so that the launcher
# reports the rank that failed first (the cause), not the ones that lost their peer.
PEER_LOSS_GRACE_SECONDS = 1.5


@dataclass(frozen=True)
class RankContext:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    run_dir: Path
    timeout: timedelta
    workers_group: Any  # gloo subgroup of ranks 1..K (None on a one-process job)

    @property
    def is_master(self) -> bool:
        return self.rank == 0

    @property
    def workers(self) -> int:
        return self.world_size - 1

    @property
    def worker(self) -> int:
        """0-based worker index (``rank - 1``); -1 on the master."""
        return self.rank - 1


_CONTEXT: RankContext | None = None


def rank_label(rank: int) -> str:
    return "rank 0 (master)" if rank == 0 else f"rank {rank} (worker {rank - 1})"


def deterministic(threads: int) -> None:
    """Fixed thread count and deterministic kernels (bit-identical runs across schemes)."""
    torch.set_num_threads(int(threads))
    torch.use_deterministic_algorithms(True)


def setup(cfg: Any, run_dir: str | Path | None = None) -> RankContext:
    """Initialises gloo from the launcher's environment (idempotent); returns the context."""
    global _CONTEXT
    if _CONTEXT is not None:
        return _CONTEXT
    timeout = timedelta(seconds=float(cfg.dist.timeout_seconds))
    if not dist.is_initialized():
        init_gloo(timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    expected = int(cfg.workers) + 1
    if world != expected:
        raise UsageError(
            f"the job has {world} processes but workers={cfg.workers} needs {expected} "
            "(workers + 1: rank 0 is the master)"
        )
    workers_group = dist.new_group(list(range(1, world)), timeout=timeout)
    path = Path(run_dir) if run_dir is not None else Path(os.getcwd())
    _CONTEXT = RankContext(rank, world, path, timeout, workers_group)
    return _CONTEXT


def init_gloo(timeout: timedelta) -> None:
    """gloo from the launcher's environment, with a store prefix per restart attempt.

    The elastic agent keeps one store for all attempts; without the prefix a restarted group
    would read the addresses of the group that died.
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=rank == 0 and not agent_store,
        timeout=timeout,
    )
    prefixed = dist.PrefixStore(f"coded-shuffle/attempt_{attempt}", store)
    dist.init_process_group("gloo", store=prefixed, rank=rank, world_size=world, timeout=timeout)


def context() -> RankContext:
    """The context :func:`setup` created in this process."""
    if _CONTEXT is None:
        raise RuntimeError("train.dist.setup(cfg) has not run in this process")
    return _CONTEXT


def teardown() -> None:
    global _CONTEXT
    if dist.is_initialized():
        dist.destroy_process_group()
    _CONTEXT = None


def is_peer_loss(exc: BaseException) -> bool:
    """True for errors that a collective raises when another rank died or stalled."""
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return any(s in text for s in ("Connection closed by peer", "Timed out", "Connection reset"))


PROGRESS_KEY = "coded-shuffle/progress"
_PROGRESS: dict[str, int] = {"count": 0}


def _store() -> Any:
    return dist.distributed_c10d._get_default_store()


def mark(stage: str) -> None:
    """Records this rank's progress (``stage`` like ``"epoch 2 delivered"``) in the job's store.

    When a collective fails because a peer died or stalled, :func:`stalled_ranks` names the
    ranks that are behind, so the error points at the culprit rather than at its victims.
    """
    _PROGRESS["count"] += 1
    with contextlib.suppress(Exception):  # a diagnosis aid: never fail the job for it
        _store().set(f"{PROGRESS_KEY}/{dist.get_rank()}", f"{_PROGRESS['count']}|{stage}")


def stalled_ranks() -> str:
    """``"rank 2 (worker 1) stopped at 'epoch 1 trained' (others reached 'epoch 2 start')"``."""
    try:
        store, world = _store(), dist.get_world_size()
        keys = {r: f"{PROGRESS_KEY}/{r}" for r in range(world)}
        seen = {r: store.get(k).decode().split("|", 1) for r, k in keys.items() if store.check([k])}
    except Exception:
        return ""
    if not seen:
        return ""
    counts = {r: int(c) for r, (c, _) in seen.items()}
    top = max(counts.values())
    low = min(counts.get(r, 0) for r in range(world))
    if low == top:
        return ""
    # the ranks furthest behind: the others may only be waiting for them
    behind = [r for r in range(world) if counts.get(r, 0) == low]
    ahead = next(seen[r][1] for r in seen if counts[r] == top)
    names = ", ".join(
        f"{rank_label(r)} at {seen[r][1]!r}" if r in seen else f"{rank_label(r)} never started"
        for r in behind
    )
    return f"stalled: {names} (others reached up to {ahead!r})"


def die_if_asked(cfg: Any, rank: int, epoch: int) -> None:
    """Debug knob: ``debug.die_rank`` exits (or hangs) at the start of ``debug.die_epoch``."""
    debug = cfg.get("debug") or {}
    if debug.get("die_rank") is None or int(debug.die_rank) != rank:
        return
    if int(debug.get("die_epoch", 1)) != epoch:
        return
    mode = str(debug.get("die_mode", "exit"))
    print(f"debug: {rank_label(rank)} {mode}s at epoch {epoch}", file=sys.stderr, flush=True)
    if mode == "hang":
        while True:
            time.sleep(3600)
    os._exit(3)
