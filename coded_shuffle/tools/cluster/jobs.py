"""One training job on the emulated cluster as the benchmark scripts run it: the
``coded-shuffle cluster`` command line, the run, and its records with every epoch verified.

A script names itself (``caller``): a failure ends it with one line that says which script,
which command and what it printed last.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence


def job_argv(
    hosts: int,
    rate: str,
    medium: str,
    overrides: Sequence[str],
    master_rate: str | None = None,
    mtu: int | None = None,
    host_rates: Sequence[str] = (),
    host_losses: Sequence[str] = (),
) -> list[str]:
    """``python -m coded_shuffle cluster`` for one job of ``overrides`` on ``hosts`` hosts
    with NICs of ``rate`` (the master's of ``master_rate`` where given; ``HOST=RATE`` of
    ``host_rates``: that host's; ``HOST=SHARE`` of ``host_losses``: the share of what that
    host receives that it loses at random) on ``medium``."""
    return [
        sys.executable,
        "-m",
        "coded_shuffle",
        "cluster",
        "--hosts",
        str(hosts),
        "--rate",
        rate,
        *(["--mtu", str(mtu)] if mtu is not None else []),
        "--medium",
        medium,
        *(["--master-rate", master_rate] if master_rate else []),
        *[x for given in host_rates for x in ("--host-rate", given)],
        *[x for given in host_losses for x in ("--host-loss", given)],
        "--",
        *overrides,
    ]


def run_job(argv: Sequence[str], caller: str) -> None:
    """Runs ``argv``; ``SystemExit`` naming ``caller`` where it fails."""
    out = subprocess.run(list(argv), capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{caller}: error: {' '.join(argv)} failed:\n{out.stderr[-2000:]}")
