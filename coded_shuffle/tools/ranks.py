"""Plain rank processes on this host: a script started once per rank with the environment
``torchrun`` would give it, and no launcher that would notice a fault for it (how the tests
and ``scripts/unclosed_loops.py`` run an own loop as a job)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(script: list[str], world: int, cwd: Path) -> list[subprocess.Popen]:
    """``python SCRIPT...`` once per rank of a ``world``, in ``cwd``, output piped."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "LOCAL_RANK": "0",
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, *script],
                cwd=cwd,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    return procs
