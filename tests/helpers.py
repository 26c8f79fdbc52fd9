"""Helpers that several test modules share (no test module imports another): the typed config
the jobs receive, the training command run as a user runs it, its outputs, and the memory
maps of this process."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from coded_shuffle.codec import buffers
from coded_shuffle.distributed.delivery import Delivery, WorkerStore
from coded_shuffle.math.schemes import get_scheme
from coded_shuffle.tools.warm import WarmStarter
from coded_shuffle_train.compose import CONF_DIR

REPO = Path(__file__).resolve().parent.parent
# a small job of 4 workers that the multi-process tests vary
JOB = ["workers=4", "epochs=3", "seed=3", "model=mlp", "model.hidden=16", "dist.timeout_seconds=60"]
SCHEMES = ("uncoded", "attia-tandon", "cycles")  # bit-identity across these (when registered)
# excess storage: memory sharing over two byte parts, and an integer corner
# (T = 2 is two byte parts between A-T's corners 1.75 and 2.5 at K = 4; E-M's corner t = 2)
EXCESS = (("attia-tandon-excess", 2), ("elmahdy-mohajer", 2), ("decentralized", 2))
TRANSPORTS = ("tree", "unicast", "p2p")  # besides the default chain; multicast: test_cluster
RUNS = [
    *SCHEMES,
    *(f"uncoded/{t}" for t in TRANSPORTS),
    *(f"{n} T={t}" for n, t in EXCESS),
    "uncoded/chain/gloo",  # the gloo data plane
    "decentralized/peer-unicast T=2",  # the workers send their own symbols
    "cycles/blocking",  # dist.prefetch=false: every other run prefetches
]
# what a job command imports (the launcher, Hydra; its fork server's preload: torch._dynamo, the
# jobs, scipy's solvers, the codec's kernel), for the warm server that forks the tests' jobs
WARM_IMPORTS = ("coded_shuffle_train.launch", "coded_shuffle_train.preload")
_WARM: list[WarmStarter] = []


def compose(*overrides: str):
    """The typed config (:class:`coded_shuffle_train.config.Config`) the jobs receive."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from coded_shuffle_train.compose import register_configs
    from coded_shuffle_train.entry import typed

    register_configs()  # the typed schemas the YAMLs name
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return typed(hydra_compose("config", overrides=list(overrides)))


def train_command() -> list[str]:
    """``coded-shuffle-train`` as installed (else the module)."""
    exe = shutil.which("coded-shuffle-train")
    return [exe] if exe else [sys.executable, "-m", "coded_shuffle_train.launch"]


def warm_jobs() -> WarmStarter:
    """This test process's server of job commands (:mod:`coded_shuffle.tools.warm`: torch and
    the jobs imported once, each command forked), started at its first job."""
    if not _WARM:
        _WARM.append(WarmStarter(WARM_IMPORTS))
        atexit.register(_WARM[0].close)
    return _WARM[0]


def run_job(
    args: list[str], cwd: Path, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``coded-shuffle-train ARGS`` in ``cwd``, its output captured (``env``: added to this
    process's environment), forked from :func:`warm_jobs`."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    return warm_jobs().run(train_command() + args, cwd, env, timeout)


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def mapped_file(address: int) -> str | None:
    """The file whose mapping holds ``address`` in this process (None: anonymous memory)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        lo, hi = (int(v, 16) for v in fields[0].split("-"))
        if lo <= address < hi:
            return fields[5] if len(fields) > 5 and fields[5].startswith("/") else None
    return None


def huge_page_advised(address: int) -> bool:
    """Whether the mapping that holds ``address`` is advised ``MADV_HUGEPAGE`` (its
    ``VmFlags`` carry ``hg``)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return "hg" in line.split()[1:]
    return False


def in_huge_buffer(address: int) -> bool:
    """Whether ``address`` lies in one of the codec's huge-page buffers (whatever else this
    process allocated before: the kernel may merge or advise other mappings)."""
    for buf in buffers._huge.items:
        view = np.frombuffer(buf, dtype=np.uint8)
        lo, hi = view.ctypes.data, view.ctypes.data + view.size
        if lo <= address < hi:
            return True
    return False


def deliver(name: str, old: np.ndarray, new: np.ndarray, k: int, point_bytes: int = 24, seed=0):
    """Plans, proves, encodes real random bytes, decodes at every worker from its own store."""
    scheme = get_scheme(name)
    state = scheme.initial_state(old, k, 1)
    plan = scheme.plan(state, new)
    delivery = Delivery.prepare(plan, point_bytes)
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (old.size, point_bytes), dtype=torch.uint8, generator=gen)
    symbols = delivery.encode(data)
    nxt = scheme.next_state(state, plan, new)
    for worker in range(k):
        store = WorkerStore.from_master(data, delivery, worker)
        batch, work = delivery.decode(worker, symbols, store)
        expected = data[torch.from_numpy(plan.new_batches[worker])]
        assert torch.equal(batch, expected), f"{name}: worker {worker} decoded wrong bytes"
        kept = store.updated(work, [nxt.caches[worker]])
        assert torch.equal(kept.caches[0], expected)
    return plan, delivery


def stream_bytes(total: int, d: int, seed: int = 0) -> np.ndarray:
    """A stream of ``total`` random bytes, zero padded to whole datagrams of ``d`` (as a
    multicast master keeps it)."""
    data = np.zeros(-(-total // d) * d, dtype=np.uint8)
    data[:total] = np.random.default_rng(seed).integers(0, 256, total, dtype=np.uint8)
    return data
