"""The ``debug.*`` keys: faults a job puts in on purpose, so that tests and outside checks can
see each one caught (the kinds ``die``, ``flip`` and ``slow`` of the registry,
:data:`coded_shuffle.distributed.fault_kinds.FAULTS`, which names these keys). One module,
three hook points the job calls at fixed places:

* :func:`die_if_asked` at an epoch's start and at every optimiser step (``debug.die_rank``,
  ``die_epoch``, ``die_step``, ``die_mode``): the rank exits or hangs there, in the first
  attempt only (a restart can then succeed);
* :func:`corrupt_if_asked` once on the master (``debug.corrupt_epoch``): the library's hook
  on the rows the master sends (:func:`coded_shuffle.distributed.faults.outgoing`) flips a
  byte of that epoch's first row (a symbol; in epoch 1 a placed point) in a copy;
* :func:`step_delay` at every step (``debug.step_delay``): a slow model.

None of them changes which path the job or the library takes.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import torch

from coded_shuffle.distributed import faults
from coded_shuffle.distributed.launcher_env import attempt
from coded_shuffle.distributed.liveness import rank_label

from .config import DebugConf
from .dist import liveness

log = logging.getLogger("train")

MASTER_WAIT_SECONDS = 30.0  # how long a dying worker waits for the master to begin its epoch


def die_if_asked(
    debug: DebugConf, rank: int, epoch: int, step: int | None = None, master: int = 0
) -> None:
    """``debug.die_rank`` exits (or hangs) at the start of ``debug.die_epoch`` (``step``
    None), or at its step ``debug.die_step`` where that is set, in the first attempt only. A
    worker that dies at an epoch's start first waits for the master to begin that epoch, so
    that the epoch before is recorded however busy the machine (else the launcher could stop
    the master before it wrote it)."""
    if debug.die_rank is None or int(debug.die_rank) != rank or attempt() > 0:
        return
    if int(debug.die_epoch) != epoch or step != debug.die_step:
        return
    live = liveness()
    if rank != master and step is None and live is not None:
        live.await_stage(master, f"epoch {epoch} ", MASTER_WAIT_SECONDS)
    mode = str(debug.die_mode)
    where = f"epoch {epoch}" + (f" step {step}" if step is not None else "")
    print(f"debug: {rank_label(rank, master)} {mode}s at {where}", file=sys.stderr, flush=True)
    if mode == "hang":
        while True:
            time.sleep(3600)
    os._exit(3)


def corrupt_if_asked(debug: DebugConf) -> None:
    """``debug.corrupt_epoch``: the master flips byte 0 of the first row it sends in that
    epoch (a symbol; in epoch 1 a placed point), in the first attempt only (a restart then
    delivers it whole). The message digests still match (they cover what is sent), so only
    the comparison of the workers' batch digests with the master's can catch it: the test
    that a wrong decode fails loudly, and that a restart repairs it."""
    target = debug.corrupt_epoch
    if target is None or attempt() > 0:
        faults.set_outgoing(None)
        return

    def flip(epoch: int, first: int, rows: torch.Tensor) -> torch.Tensor | None:
        if epoch != int(target) or first != 0 or not rows.numel():
            return None
        flipped = rows.clone()
        flipped[0, 0] ^= 0xFF
        log.warning(f"debug: epoch {epoch}: flipped byte 0 of row 0 (debug.corrupt_epoch)")
        return flipped

    faults.set_outgoing(flip)


def step_delay(debug: DebugConf) -> None:
    """``debug.step_delay``: every worker sleeps this long per minibatch step."""
    delay = float(debug.step_delay)
    if delay:
        time.sleep(delay)
