"""``python -m coded_shuffle_train --profile [overrides]``: the job's shape and its compute,
measured on this
machine, as one JSON object (what ``coded-shuffle predict --job`` prices a run from).

Nothing is loaded or generated: the data set's sizes come from its description
(:func:`coded_shuffle_train.data.describe`), and the model's step is timed on random inputs of the
data's shape, with the job's batch size, optimiser and threads."""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from coded_shuffle.codec.packed import Packed
from coded_shuffle.errors import UsageError

from . import data, models
from .config import Config
from .sources import File, Synthetic

TIMED_SECONDS = 0.3  # how long each measurement runs (after its warm-up)
HASHED_BYTES = 32 << 20  # bytes hashed to time SHA-256


@dataclass(frozen=True)
class JobProfile:
    """What the priced run is: its knobs, the data's sizes and the compute's seconds."""

    workers: int
    epochs: int
    scheme: str
    storage: float
    transport: str
    shuffle: str
    fraction: float
    points: int  # the training points kept (a multiple of the workers)
    point_bytes: int
    test_points: int
    params: int  # the model's parameters
    momentum: bool
    batch_size: int
    average_every: int
    chunk_bytes: int
    multicast_rate: str | None
    step_seconds: float  # one optimiser step on one minibatch, one process alone
    eval_seconds_per_point: float  # the master's test forward, per test point
    sha256_seconds_per_gb: float  # the digests' hash
    cores: int  # this machine's CPUs (the emulated cluster's hosts share them)
    seed: int
    placement: str  # data.placement: random | by_label
    label_shares: list[float]  # every class's share of the training points
    prefetch: bool  # dist.prefetch: each delivery beside the training before it
    background_share: float  # dist.multicast.background_share: a prefetched stream's pace
    step_delay: float  # debug.step_delay: seconds every step holds its worker besides


def _median_seconds(fn: Any) -> float:
    """``fn``'s seconds per call: a warm-up, then calls for :data:`TIMED_SECONDS`."""
    for _ in range(3):
        fn()
    times: list[float] = []
    begin = time.perf_counter()
    while time.perf_counter() - begin < TIMED_SECONDS or len(times) < 5:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def step_seconds(model: torch.nn.Module, cfg: Config, features: int, classes: int) -> float:
    """One SGD step (forward, loss, backward, update) on ``optim.batch_size`` random points."""
    o = cfg.optim
    opt = torch.optim.SGD(model.parameters(), lr=float(o.lr), momentum=float(o.momentum))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(int(o.batch_size), features, generator=gen)
    y = torch.randint(0, classes, (int(o.batch_size),), generator=gen)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return _median_seconds(step)


def eval_seconds_per_point(model: torch.nn.Module, features: int) -> float:
    """The test forward's seconds per point (on a block of the master's evaluation rows)."""
    rows = 4096
    x = torch.randn(rows, features)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    return _median_seconds(forward) / rows


def sha256_seconds_per_gb() -> float:
    block = os.urandom(HASHED_BYTES)
    return _median_seconds(lambda: hashlib.sha256(block).digest()) * 1e9 / HASHED_BYTES


def test_points(cfg: Config, info: data.DataInfo) -> int:
    """The test split's size: the source's own count where it has one (synthetic), else what
    its test fraction holds out (also for a packed directory with a test split of its own: an
    estimate, the test forward being a small part of an epoch)."""
    own = getattr(cfg.data, "test_points", None)
    if own is not None:
        return int(own)
    fraction = float(getattr(cfg.data, "test_fraction", 0.2))
    return max(1, round(info.train_points * fraction / max(1e-9, 1 - fraction)))


def check_priced(cfg: Config) -> None:
    """Only ``shuffle_sgd``'s runs are priced: its epochs are what moves the data set."""
    if str(cfg.job.name) != "shuffle_sgd":
        raise UsageError(
            f"job={cfg.job.name}: only the shuffle_sgd job's runs are priced (its epochs move "
            "the data set); leave job out"
        )


def label_shares(cfg: Config) -> list[float]:
    """Every class's share of the training labels: the synthetic source's classes are drawn
    uniformly; a packed directory's from its ``y.npy`` (memory-mapped); any other source's
    from its labels (loaded: digits, a user's data set)."""
    source = data.source_of(cfg.data)
    if isinstance(source, Synthetic):
        return [1.0 / source.classes] * source.classes
    if isinstance(source, File) and source.directory:
        labels = Packed.open(Path(source.path)).y
    else:
        labels = source.raw(int(cfg.seed))[1]
    counts = np.bincount(np.asarray(labels, dtype=np.int64))
    return (counts / max(1, counts.sum())).tolist()


def profile(cfg: Config) -> JobProfile:
    """The validated job's profile (``cfg`` passed :func:`check_priced` and the job's own
    checks)."""
    torch.set_num_threads(int(cfg.threads))
    info = data.describe(cfg.data)
    k = int(cfg.workers)
    torch.manual_seed(int(cfg.seed))
    model = models.build(cfg.model, info.input_shape, info.classes)
    features = math.prod(info.input_shape)
    shuffle = str(cfg.shuffle.name)
    return JobProfile(
        workers=k,
        epochs=int(cfg.epochs),
        scheme=str(cfg.scheme.name),
        storage=float(cfg.storage),
        transport=str(cfg.dist.transport),
        shuffle=shuffle,
        fraction=float(cfg.shuffle.fraction) if shuffle == "partial" else 1.0,
        points=data.kept(info.train_points, k),
        point_bytes=info.point_bytes,
        test_points=test_points(cfg, info),
        params=models.num_params(model),
        momentum=float(cfg.optim.momentum) > 0,
        batch_size=int(cfg.optim.batch_size),
        average_every=int(cfg.optim.average_every),
        chunk_bytes=int(cfg.dist.chunk_bytes),
        multicast_rate=cfg.dist.multicast.rate if cfg.dist.multicast.rate else None,
        step_seconds=step_seconds(model, cfg, features, info.classes),
        eval_seconds_per_point=eval_seconds_per_point(model, features),
        sha256_seconds_per_gb=sha256_seconds_per_gb(),
        cores=os.cpu_count() or 1,
        seed=int(cfg.seed),
        placement=str(cfg.data.placement),
        label_shares=label_shares(cfg),
        prefetch=bool(cfg.dist.prefetch),
        background_share=float(cfg.dist.multicast.background_share),
        step_delay=float(cfg.debug.step_delay),
    )


def as_dict(p: JobProfile) -> dict[str, Any]:
    return asdict(p)
