"""What the launcher's fork server loads once, before it forks any rank (the server is forked
from the launcher once the launcher has imported torch: :mod:`coded_shuffle_train.forkserver`;
a server started the standard way imports all of it itself): torch, every job, and what every
rank would load for itself (:mod:`coded_shuffle_train.rank_imports`: ``torch._dynamo``,
scipy's solvers, the codec's kernel warmed; five processes at once on start-up otherwise).
What is loaded is then frozen out of the garbage collector (``gc.freeze``): a rank's
collections skip it."""

from __future__ import annotations

import gc
import importlib

from . import entry  # noqa: F401
from .compose import available_jobs
from .rank_imports import load

for _name in available_jobs():
    importlib.import_module(f"coded_shuffle_train.{_name}")
load()
gc.freeze()
