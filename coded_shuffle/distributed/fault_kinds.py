"""Every kind of fault put in on purpose, in one registry (:data:`FAULTS`): what the emulated
cluster does to a host from outside (``coded-shuffle cluster --NAME HOST@WHEN``) and what the
training job's ``debug.*`` keys do inside a rank (the library's hook on the rows a process
sends among them: :mod:`.faults`). The cluster's flags, the job's keys and the chaos soak take their
kinds from here. No torch: ``coded-shuffle --help`` builds its flags from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault: who puts it in (``cluster``: ``coded-shuffle cluster --NAME
    HOST@WHEN`` to a host from outside; ``job``: the training job's ``debug.*`` keys
    :attr:`keys`, inside a rank), what it does and what catches it."""

    name: str
    by: Literal["cluster", "job"]
    does: str
    caught: str
    keys: tuple[str, ...] = ()
    heals: bool = False  # a host that ``--heal`` brings back
    workers_only: bool = False  # never host 0 (the master keeps no store)


FAULTS: dict[str, FaultKind] = {
    f.name: f
    for f in (
        FaultKind(
            "kill",
            "cluster",
            "SIGKILL every process of HOST WHEN; with dist.max_restarts > 0 the host is started "
            "again",
            "the launcher's restart and the checkpoint's resume",
        ),
        FaultKind(
            "lose",
            "cluster",
            "SIGKILL every process of HOST WHEN, for good (needs --min-hosts: the job goes on "
            "with the hosts that are left once dist.max_restarts > 0 restarts it)",
            "the elastic launcher's resize",
        ),
        FaultKind(
            "cut",
            "cluster",
            "take HOST's link down WHEN; its processes stay alive",
            "the heartbeat watchdog (dist.heartbeat_seconds) and dist.timeout_seconds",
            heals=True,
        ),
        FaultKind(
            "stop",
            "cluster",
            "SIGSTOP every process of HOST WHEN (a hung machine); see --heal",
            "the heartbeat watchdog",
            heals=True,
        ),
        FaultKind(
            "corrupt",
            "cluster",
            "flip a byte of worker HOST-1's newest store file WHEN (the training job)",
            "the worker's store digest at the next load",
            workers_only=True,
        ),
        FaultKind(
            "die",
            "job",
            "a rank exits or hangs at an epoch's start or at one of its steps, first attempt only",
            "the launcher's restart (exit), the heartbeat watchdog (hang)",
            keys=("die_rank", "die_epoch", "die_step", "die_mode"),
        ),
        FaultKind(
            "flip",
            "job",
            "the master flips byte 0 of the first row of every stream it sends in an epoch (a "
            "symbol; in epoch 1 a placed point), in the first attempt only",
            "the workers' batch digests against the master's",
            keys=("corrupt_epoch",),
        ),
        FaultKind(
            "slow",
            "job",
            "every worker sleeps this long per step (a slow model, long epochs)",
            "nothing to catch: epochs long enough to be hit inside",
            keys=("step_delay",),
        ),
    )
}


def fault_kinds(by: Literal["cluster", "job"]) -> tuple[str, ...]:
    """The names of the kinds that ``by`` puts in, in the registry's order."""
    return tuple(name for name, kind in FAULTS.items() if kind.by == by)
