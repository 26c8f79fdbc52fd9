"""A placement after a change in the number of workers (``first_epoch``, ``previous_workers``):
what each worker still holds from before is offered to every rank, and only the rest of each
worker's placement crosses the link, uncoded."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from coded_shuffle.distributed.transports import Peer
from coded_shuffle.math.schemes import Scheme
from coded_shuffle.math.state import CacheState, part_states

EMPTY = np.zeros(0, dtype=np.int64)


def whole_store_points(scheme: Scheme, state: CacheState, worker: int) -> np.ndarray | None:
    """The points of ``worker``'s store after ``state`` when that store is whole points (one
    part, no point split: no excess storage), else None."""
    parts, _ = part_states(state)
    caches = scheme.part_caches(state, worker)
    if len(caches) != 1 or parts[0].splits != 1:
        return None
    return np.asarray(caches[0], dtype=np.int64)


def exchange_held(held: np.ndarray | None, peer: Peer) -> list[np.ndarray]:
    """Every worker's held points (sorted), worker 0 first, on every rank: a collective of the
    peer's group (the master offers none)."""
    mine = torch.from_numpy(np.ascontiguousarray(held if held is not None else EMPTY))
    world, workers = peer.world_size, peer.world_size - 1
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.int64), group=peer.group)
    sizes = peer.roles.by_role(sizes)
    top = max(int(s) for s in sizes)
    if top == 0:
        return [EMPTY] * workers
    padded = torch.zeros(top, dtype=torch.int64)
    padded[: mine.numel()] = mine
    every = [torch.zeros(top, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(every, padded, group=peer.group)
    every = peer.roles.by_role(every)
    return [every[k + 1][: int(sizes[k + 1])].numpy() for k in range(workers)]


def still_needed(keeps: list[np.ndarray], held: list[np.ndarray]) -> list[np.ndarray]:
    """What each worker's placement (``keeps``, sorted) needs beyond what it holds."""
    return [np.setdiff1d(keep, h, assume_unique=True) for keep, h in zip(keeps, held, strict=True)]
