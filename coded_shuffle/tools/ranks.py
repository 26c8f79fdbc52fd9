"""Plain rank processes on this host: a script started once per rank with the environment
``torchrun`` would give it, and no launcher that would notice a fault for it (how the tests
and ``scripts/unclosed_loops.py`` run an own loop as a job).

The ranks are forked from one interpreter that imported torch and the library first (a rank
process imports them in about 4 s of CPU here; forked, it does not), then run the script as
``python SCRIPT`` runs it: as ``__main__``, its folder first on the path, its output its own,
and the interpreter's exit (``atexit``, threads joined) at its end. Run as ``python -m
coded_shuffle.tools.ranks SPEC``, this module is that interpreter: it forks every rank, then
writes each one's exit code as it ends.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from coded_shuffle.tools.forked import Forked


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """What ``torchrun`` tells rank ``rank`` of a ``world`` on one host."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "LOCAL_RANK": "0",
    }


def start_ranks(script: list[str], world: int, cwd: Path) -> list[Forked]:
    """``python SCRIPT...`` once per rank of a ``world``, in ``cwd``, output piped (forked from
    one interpreter: module docstring)."""
    pipes = [os.pipe() for _ in range(2 * world)]
    status_r, status_w = os.pipe()
    spec = {
        "script": script,
        "world": world,
        "port": free_port(),
        "fds": [[pipes[2 * r][1], pipes[2 * r + 1][1]] for r in range(world)],
        "status": status_w,
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    parent = subprocess.Popen(
        [sys.executable, "-m", "coded_shuffle.tools.ranks", json.dumps(spec)],
        cwd=cwd,
        env=env,
        pass_fds=[w for _, w in pipes] + [status_w],
        stdin=subprocess.DEVNULL,
    )
    for _, w in [*pipes, (status_r, status_w)]:
        os.close(w)
    status = os.fdopen(status_r, encoding="utf-8")
    started = [status.readline().split() for _ in range(world)]
    if not all(started):
        parent.wait()
        raise RuntimeError(
            f"the ranks' parent ended (exit {parent.returncode}) before forking them"
        )
    ranks = [
        Forked(int(pid), pipes[2 * r][0], pipes[2 * r + 1][0]) for r, (_, pid) in enumerate(started)
    ]
    threading.Thread(target=_report_ends, args=(status, ranks, parent), daemon=True).start()
    return ranks


def _report_ends(status, ranks: list[Forked], parent: subprocess.Popen) -> None:
    """Each rank's exit code as its parent writes it (``RANK CODE`` lines)."""
    with status:
        for line in status:
            rank, code = map(int, line.split())
            ranks[rank].end(code)
    parent.wait()
    for r in ranks:  # the parent itself died: what never ended is lost with it
        if r.returncode is None:
            r.end(parent.returncode or -signal.SIGKILL)


def load_own_loop_imports() -> None:
    """What every rank of an own loop would load for itself, for a process that forks ranks to
    load once: torch's distributed package, the library, scipy's solvers (a rank's plan may
    solve a program: 0.3 s of CPU a rank), the codec's compiled kernel, warmed (numba's CPU
    target set up and the kernel loaded from its cache: most of a second a process), and
    ``multicast``'s compiled receive loop and parity (where the cache is empty, 14 s of CPU
    that every rank of the first multicast job would spend). Warming runs serial code only,
    so that no numba thread exists at the fork."""
    import scipy.optimize  # noqa: F401
    import torch.distributed  # noqa: F401

    from coded_shuffle.codec import kernel
    from coded_shuffle.distributed.shuffle import CodedShuffle  # noqa: F401
    from coded_shuffle.distributed.transports import multicast

    kernel.warm()
    multicast.warm()


def _serve(spec: dict) -> None:
    """Forks every rank (:func:`_run_rank`), then writes ``RANK CODE`` as each one ends."""
    load_own_loop_imports()
    status = os.fdopen(spec["status"], "w", buffering=1)
    ranks = {}
    for rank in range(spec["world"]):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            status.close()
            _run_rank(rank, spec)
        ranks[pid] = rank
        status.write(f"{rank} {pid}\n")
    for fd in (fd for pair in spec["fds"] for fd in pair):
        os.close(fd)
    while ranks:
        pid, code = os.wait()
        if pid in ranks:
            status.write(f"{ranks.pop(pid)} {os.waitstatus_to_exitcode(code)}\n")


def _run_rank(rank: int, spec: dict) -> None:
    """In the forked child: its output on its own pipes, its environment, then the script as
    ``__main__``; ends the process (the interpreter's own exit)."""
    out, err = spec["fds"][rank]
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in (fd for pair in spec["fds"] for fd in pair):
        os.close(fd)
    os.environ.update(rank_env(rank, spec["world"], spec["port"]))
    script = spec["script"]
    sys.argv = list(script)
    path = Path(script[0]).resolve()
    sys.path[0] = str(path.parent)
    runpy.run_path(str(path), run_name="__main__")
    sys.exit(0)


if __name__ == "__main__":
    _serve(json.loads(sys.argv[1]))
