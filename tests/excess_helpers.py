"""Helpers that the excess-storage tests share: epochs run through a scheme, decoded at every
worker from its own store, and the corner worst case."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from coded_shuffle.distributed.delivery import Delivery, WorkerStore
from coded_shuffle.math.assignment import (
    batch_size,
    random_assignment,
)
from coded_shuffle.math.plan import plan_load
from coded_shuffle.math.rate_memory import (
    placement_lower_bound,
)
from coded_shuffle.math.schemes import get_scheme
from coded_shuffle.math.schemes.attia_tandon_excess import needed_points
from coded_shuffle.math.schemes.elmahdy_mohajer import (
    EMLabels,
)
from coded_shuffle.math.schemes.memory_sharing import check_subpacketization
from coded_shuffle.math.shuffles import cyclic_shuffle
from coded_shuffle.math.state import part_states, stored_bytes


@dataclass
class Epoch:
    load: float
    uncoded: float
    payload_bytes: int
    stored_points_max: float
    stored_bytes_max: int
    bound: float
    needs: list[int]
    effective_storage: float  # byte-weighted storage in batches (<= T with byte-exact parts)
    ideal_load: float  # load with the placement's fractions (what the bound is computed for)
    mix_cap: float  # byte-weighted worst-case load of the corners used


def corner_worst(state, k: int, q: int) -> float:
    """Worst-case load of one corner state: E-M ``q(K-t)/t``; A-T ``q(K-p)/(p+1)``, p=0: q(K-1)."""
    labels = state.labels
    if isinstance(labels, EMLabels):
        return q * (k - labels.t) / labels.t
    return q * (k - labels.p) / (labels.p + 1)


def run_epochs(
    name: str,
    k: int,
    n: int,
    storage: float,
    epochs: int,
    *,
    point_bytes: int = 48,
    worst: bool = False,
    seed: int = 0,
    byte_exact: bool = False,
) -> list[Epoch]:
    """Plans, proves, encodes, decodes at every worker from its own store, updates the stores.

    The stores are cut from the master's data once (the uncoded initial placement); after that
    every worker keeps only what it cached or decoded.
    """
    rng = np.random.default_rng(seed)
    scheme = get_scheme(name, point_bytes if byte_exact else None)
    if byte_exact:
        check_subpacketization(scheme, k, storage, point_bytes)
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (n, point_bytes), dtype=torch.uint8, generator=gen)
    old = random_assignment(n, k, rng)
    state = scheme.initial_state(old, k, storage)
    stores = None
    out = []
    for _ in range(epochs):
        new = cyclic_shuffle(old, k) if worst else random_assignment(n, k, rng)
        plan = scheme.plan(state, new)
        delivery = Delivery.prepare(plan, point_bytes)
        symbols = delivery.encode(data)
        if stores is None:
            stores = [WorkerStore.from_master(data, delivery, w) for w in range(k)]
        nxt = scheme.next_state(state, plan, new)
        updated = []
        for w in range(k):
            batch, work = delivery.decode(w, symbols, stores[w])
            want = data.index_select(0, torch.from_numpy(delivery.plans[0].new_batches[w]))
            assert torch.equal(batch, want), f"worker {w} decoded wrong bytes"
            updated.append(stores[w].updated(work, scheme.part_caches(nxt, w)))
        stores = updated
        q = batch_size(n, k)
        parts, _ = part_states(nxt)
        byte_fracs = [b / point_bytes for b in delivery.parts]
        eff = (
            sum(
                f * float(np.max(p.stored_points())) for p, f in zip(parts, byte_fracs, strict=True)
            )
            / q
        )
        mix_cap = sum(f * corner_worst(p, k, q) for p, f in zip(parts, byte_fracs, strict=True))
        assert np.array_equal(
            np.array([s.stored_bytes() for s in stores]), stored_bytes(nxt, point_bytes)
        )
        out.append(
            Epoch(
                load=delivery.load_points,
                uncoded=delivery.uncoded_points,
                payload_bytes=delivery.payload_bytes(),
                stored_points_max=scheme.stored_points_max(nxt),
                stored_bytes_max=max(s.stored_bytes() for s in stores),
                bound=placement_lower_bound(state, new)[0],
                needs=[int(x.size) for x in needed_points(old, new, k)],
                effective_storage=eff,
                ideal_load=plan_load(plan),
                mix_cap=mix_cap,
            )
        )
        state, old = nxt, new
    return out
