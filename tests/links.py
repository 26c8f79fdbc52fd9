"""Helpers that the transport tests share: the wire format derived independently of the
code under test, and one delivery of known rows over a real process group."""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from coded_shuffle.distributed.transports import (
    REGISTRY,
    Link,
    Peer,
    Routes,
    build_transport,
)
from coded_shuffle.distributed.transports.framing import (
    KIND_SYMBOLS,
)

PEER = Peer(0, 2, timedelta(seconds=5))


def framed(rows: int, width: int, chunk: int) -> int:
    """Bytes of ``rows`` rows of ``width`` bytes in messages of at most ``chunk`` payload bytes
    (at least one row each), each with a 24-byte header: the wire format, derived here."""
    per = max(1, chunk // width)
    return rows * width + math.ceil(rows / per) * 24


# --- real process groups: every transport, its routes and its counts --------------------------

N_ROWS, WIDTH, CHUNK = 57, 13, 100


def routes_for(name: str, world: int, seed: int = 0) -> tuple[tuple, tuple | None]:
    """Random needs per worker; for p2p a random sender other than the receiver per row."""
    rng = np.random.default_rng(seed)
    workers = world - 1
    needs = tuple(
        np.sort(rng.choice(N_ROWS, size=10 + 5 * k, replace=False)) for k in range(workers)
    )
    if REGISTRY[name].routing != "peers":
        return needs, None
    senders = []
    for k, need in enumerate(needs):
        choices = [r for r in range(world) if r != k + 1]
        senders.append(np.array(choices)[rng.integers(0, len(choices), need.size)])
    return needs, tuple(senders)


def deliver_rows(rank: int, world: int, name: str, options: dict, knock=None) -> tuple:
    """One delivery of every worker's rows; ``knock(transport)`` (if given) runs on rank 1
    before it, while every other rank waits: strangers at its door."""
    peer = Peer(rank, world, timedelta(seconds=30))
    transport = build_transport(name, peer, options)
    try:
        if knock is not None:
            if rank == 1:
                knock(transport)
            dist.barrier()
        link = Link(transport, CHUNK)
        rows = torch.arange(N_ROWS * WIDTH, dtype=torch.int64).remainder(251)
        rows = rows.to(torch.uint8).reshape(N_ROWS, WIDTH)
        needs, senders = routes_for(name, world)
        if senders is None:
            known = needs if rank == 0 or transport.routing == "broadcast" else None
            routes = Routes(
                known or tuple(n if k == rank - 1 else None for k, n in enumerate(needs))
            )
            mine = rows if rank == 0 else None
            out = link.deliver(
                epoch=5,
                part=0,
                kind=KIND_SYMBOLS,
                num_rows=N_ROWS,
                row_bytes=WIDTH,
                routes=routes,
                rows=mine,
            )
        else:
            ids = np.unique(
                np.concatenate([n[s == rank] for n, s in zip(needs, senders, strict=True)])
            )
            out = link.deliver(
                epoch=5,
                part=0,
                kind=KIND_SYMBOLS,
                num_rows=N_ROWS,
                row_bytes=WIDTH,
                routes=Routes(needs, senders),
                rows=rows[torch.from_numpy(ids)],
                row_ids=ids,
            )
        got = None if out is None else out.numpy().tobytes()
        counts, _ = link.take_counts()
        return got, dataclasses.astuple(counts)
    finally:
        transport.close()


def check_rows(results, world, name):
    rows = (np.arange(N_ROWS * WIDTH) % 251).astype(np.uint8).reshape(N_ROWS, WIDTH)
    needs, _ = routes_for(name, world)
    assert results[0][0] is None
    for k in range(world - 1):
        assert results[k + 1][0] == rows[needs[k]].tobytes(), f"{name}: worker {k}"


WORLD = 4  # a master and three workers
L = framed(N_ROWS, WIDTH, CHUNK)  # one broadcast stream of every row


GLOO = {"plane": "gloo"}  # the default plane is socket


STRANGER = "127.0.0.2"  # loopback, but not the address any rank was gathered at
