"""What the launcher's fork server loads once, before it forks any rank (the server is forked
from the launcher once the launcher has imported torch: :mod:`coded_shuffle_train.forkserver`;
a server started the standard way imports all of it itself): torch, ``torch._dynamo`` (DDP's
constructor imports it), every job, and the codec's compiled kernel, warmed (numba's CPU target
set up and the kernel loaded from its cache: most of a second per process otherwise, five
processes at once on start-up). Warming runs the serial kernel only, so no numba thread exists
when the server forks. What is loaded is then frozen out of the garbage collector
(``gc.freeze``): a rank's collections skip it."""

from __future__ import annotations

import gc
import importlib

import scipy.optimize  # noqa: F401  (every rank's plan may solve a program: 0.3 s of CPU a rank)
import torch._inductor.config  # noqa: F401  (imported by torch.distributed on first use)

from coded_shuffle.codec import kernel

from . import entry  # noqa: F401
from .compose import available_jobs

for _name in available_jobs():
    importlib.import_module(f"coded_shuffle_train.{_name}")
kernel.warm()
gc.freeze()
