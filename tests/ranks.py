"""Helpers for tests that start real gloo process groups: forked ranks, a private namespace.

:func:`run_ranks` forks ``world`` processes, each joins a gloo group over loopback and runs
``target(rank, world, *args)``; the results come back through a queue. Inside
:func:`private_netns` (root only) the ranks first enter a network namespace of their own whose
loopback carries IP multicast, so nothing a test sends leaves it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing as mp
import os
import subprocess
import traceback
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from coded_shuffle.tools.ranks import free_port
from coded_shuffle_train.rank_imports import load

CLONE_NEWNET = 0x40000000


def is_root() -> bool:
    return os.geteuid() == 0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def private_netns() -> Iterator[str]:
    """A namespace with loopback up and multicast routed on it; removed afterwards."""
    name = f"cst{uuid.uuid4().hex[:8]}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "link", "set", "lo", "multicast", "on")
        _ip("-n", name, "route", "add", "224.0.0.0/4", "dev", "lo")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def enter_netns(name: str) -> None:
    """Moves this (single-threaded, freshly forked) process into namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({name})")
    finally:
        os.close(fd)


def _rank(rank, world, port, netns, target, args, out) -> None:
    import torch
    import torch.distributed as dist

    try:
        if netns:
            enter_netns(netns)
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=30),
        )
        try:
            out.put((rank, "ok", target(rank, world, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))


# what a rank would load for itself, loaded once in this process before it forks any, as the
# launcher's fork server does: four ranks of an own loop took 16 s of CPU without, 1.5 s with
warm = functools.cache(load)


def run_ranks(
    world: int, target: Callable[..., Any], *args: Any, netns: str | None = None
) -> list[Any]:
    """``target(rank, world, *args)`` on every rank; the results in rank order."""
    warm()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    port = free_port() if netns is None else 29400 + os.getpid() % 500
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, netns, target, args, out))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        results = {}
        for _ in procs:
            rank, status, value = out.get(timeout=90)
            if status != "ok":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]
