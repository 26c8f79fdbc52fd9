"""Process-group setup shared by every job (the master on ``dist.master_rank``, rank 0 by
default; the workers on the other ranks).

Every job module calls :func:`context` (or :func:`setup`, which is idempotent) to get its
:class:`RankContext`; the per-rank entry point (:mod:`coded_shuffle_train.entry`) has already set
the process group up before it calls ``train.<job>.run(cfg)``."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from coded_shuffle.codec.kernel import set_threads as set_codec_threads
from coded_shuffle.distributed.launcher_env import agent_store, attempt
from coded_shuffle.distributed.liveness import Heartbeat, Liveness, wait_long
from coded_shuffle.distributed.roles import Roles
from coded_shuffle.errors import UsageError

from .config import Config, DistConf

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
    timeout: timedelta  # dist.timeout_seconds: how soon a lost peer must fail the job
    master_rank: int = 0  # dist.master_rank: the rank that holds the data set

    @property
    def roles(self) -> Roles:
        return Roles(self.master_rank, self.world_size)

    @property
    def is_master(self) -> bool:
        return self.rank == self.master_rank

    @property
    def workers(self) -> int:
        return self.world_size - 1

    @property
    def worker(self) -> int:
        """0-based worker index; -1 on the master."""
        return self.roles.role(self.rank) - 1

    def rank_of_worker(self, worker: int) -> int:
        """The rank of worker ``worker`` (0-based)."""
        return self.roles.rank(worker + 1)


_CONTEXT: RankContext | None = None


MMAP_THRESHOLD_BYTES = 256 << 10
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def return_freed_arrays() -> None:
    """glibc's malloc with a fixed mmap threshold: a block of 256 KiB or more (an index
    array, a gathered minibatch) is mapped on its own and goes back to the system when freed.
    By default glibc raises the threshold after the first such free and serves later blocks
    from its heap, which then keeps the peak of every transient array: measured, +100 MB of
    the job's anonymous memory at N = 250,000 (docs/benchmarks.md, "Memory"). No-op off
    glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def deterministic(threads: int) -> None:
    """Fixed thread count and deterministic kernels (bit-identical runs across schemes); the
    codec codes on as many cores (its bytes are the same whatever the count)."""
    torch.set_num_threads(int(threads))
    set_codec_threads(int(threads))
    torch.use_deterministic_algorithms(True)


def setup(cfg: Config, run_dir: str | Path | None = None) -> RankContext:
    """Initialises gloo from the launcher's environment (idempotent); returns the context.

    The rendezvous, and every collective until a job starts a watchdog
    (:func:`start_liveness`), are bounded by ``dist.timeout_seconds``: a rank that never
    arrives fails the job. The job's groups are the library's (``CodedShuffle`` owns the
    workers' group).
    """
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
            f"(workers + 1: rank {cfg.dist.master_rank}, dist.master_rank, is the master)"
        )
    path = Path(run_dir) if run_dir is not None else Path(os.getcwd())
    _CONTEXT = RankContext(rank, world, path, timeout, int(cfg.dist.master_rank))
    return _CONTEXT


def store_prefix() -> str:
    """The job's keys in the launcher's store, one prefix per restart attempt; in a store of
    this attempt's own (rank 0 hosts it: no agent store), one prefix for all."""
    return f"coded-shuffle/attempt_{attempt()}" if agent_store() else "coded-shuffle/job"


def init_gloo(timeout: timedelta) -> None:
    """gloo from the launcher's environment, with a store prefix per restart attempt.

    The elastic agent keeps one store for all attempts; without the prefix a restarted group
    would read the addresses of the group that died.
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=rank == 0 and not agent_store(),
        timeout=timeout,
    )
    prefixed = dist.PrefixStore(store_prefix(), store)
    dist.init_process_group("gloo", store=prefixed, rank=rank, world_size=world, timeout=timeout)


def context() -> RankContext:
    """The context :func:`setup` created in this process."""
    if _CONTEXT is None:
        raise RuntimeError("coded_shuffle_train.dist.setup(cfg) has not run in this process")
    return _CONTEXT


def teardown() -> None:
    global _CONTEXT
    stop_liveness()
    if dist.is_initialized():
        dist.destroy_process_group()
    _CONTEXT = None


_LIVENESS: Liveness | None = None


def start_liveness(
    dist_conf: DistConf, on_progress: Callable[[dict[int, Heartbeat], float], None] | None = None
) -> Liveness:
    """The library's heartbeats and watchdog (:mod:`coded_shuffle.distributed.liveness`) for
    this rank, watching progress too (after :func:`setup`); the job hands it to
    ``CodedShuffle(liveness=...)``. From here on the default group's collectives wait for
    long work (:func:`~coded_shuffle.distributed.liveness.wait_long`): the watchdog bounds
    how long a lost peer goes unnoticed."""
    global _LIVENESS
    ctx = context()
    _LIVENESS = Liveness(
        ctx.rank,
        ctx.world_size,
        ctx.timeout.total_seconds(),
        float(dist_conf.heartbeat_seconds),
        (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])),
        f"{store_prefix()}/live",
        on_progress,
        float(dist_conf.progress_seconds),
        watch_progress=True,
        master=ctx.master_rank,
    )
    wait_long()
    return _LIVENESS.start()


def liveness() -> Liveness | None:
    """The watchdog :func:`start_liveness` started in this process."""
    return _LIVENESS


def stop_liveness() -> None:
    global _LIVENESS
    if _LIVENESS is not None:
        _LIVENESS.stop()
        _LIVENESS = None


def mark(stage: str) -> None:
    """This rank reached ``stage`` (``"epoch 2 delivered"``): progress the watchdog sees."""
    if _LIVENESS is not None:
        _LIVENESS.mark(stage)


def tick(detail: str | None = None) -> None:
    """Progress inside a stage (a minibatch step, a message)."""
    if _LIVENESS is not None:
        _LIVENESS.tick(detail)


def stalled_ranks() -> str:
    """``"stalled: rank 2 (worker 1) at 'epoch 1 trained' (others reached ...)"``."""
    return _LIVENESS.stalled() if _LIVENESS is not None else ""
