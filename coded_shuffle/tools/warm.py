"""Commands forked from one warm interpreter: a server process imports what the commands
import (torch, the jobs: about 7.5 s of CPU for the training command here) once, then forks
a child per command and runs it there as its console script or ``python -m`` would, in the
command's own folder, environment and output, ending with the interpreter's own exit. A
command's start then costs a fork, not its imports. How the tests run most jobs (the README's
commands run as written, each in a fresh interpreter).

Run as ``python -m coded_shuffle.tools.warm FD MODULE...``, this module is that server: it
imports every ``MODULE``, then serves requests on the ``SOCK_SEQPACKET`` socket ``FD`` (one
JSON message per command, its two output descriptors beside it) and answers each with the
child's pid, then its exit code. It ends when its client closes the socket.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import itertools
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from coded_shuffle.tools.forked import Forked

MESSAGE_BYTES = 1 << 20  # one request: its argv and environment as JSON


class WarmStarter:
    """The client: starts the server with ``preload`` imported, then :meth:`popen` and
    :meth:`run` as :mod:`subprocess`'s, for commands it can run (:func:`target_of`)."""

    def __init__(self, preload: Sequence[str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.server = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno()), *preload],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.sock, self.lock, self.ids = ours, threading.Lock(), itertools.count()
        self.closing = False
        self.started: dict[int, Forked] = {}
        self.waiting: dict[int, tuple[threading.Event, list[int]]] = {}
        reply = json.loads(self.sock.recv(MESSAGE_BYTES) or b'{"error": "ended"}')
        if "error" in reply:
            self.server.wait()
            raise RuntimeError(f"the warm server did not start: {reply['error']}")
        threading.Thread(target=self._read_replies, daemon=True).start()

    def popen(
        self,
        argv: Sequence[str],
        cwd: Path | str,
        env: dict[str, str],
        stdout: Any = subprocess.PIPE,
        stderr: Any = subprocess.PIPE,
    ) -> Forked:
        """``argv`` forked from the server (``stdout``/``stderr``: ``PIPE``, ``DEVNULL``, a file
        or a descriptor, None for this process's own; ``stderr`` also ``STDOUT``)."""
        target_of(argv)  # refused here, in one line, rather than in the child
        out, out_read = _output(stdout, 1)
        err, err_read = (out, None) if stderr == subprocess.STDOUT else _output(stderr, 2)
        request = {"argv": list(argv), "cwd": str(cwd), "env": dict(env)}
        with self.lock:
            rid = next(self.ids)
            event, box = self.waiting[rid] = (threading.Event(), [])
            socket.send_fds(self.sock, [json.dumps({"id": rid, **request}).encode()], [out, err])
        for fd, read in {(out, out_read), (err, err_read)}:
            if read is not None:
                os.close(fd)
        if not event.wait(60) or not box:
            raise RuntimeError(f"the warm server forked nothing for {argv[:3]}")
        process = Forked(box[0], *(None if r == -1 else r for r in (out_read, err_read)))
        with self.lock:
            self.started[rid] = process
            early = self.waiting.pop(rid)[1][1:]
        if early:
            process.end(early[0])
        return process

    def run(
        self, argv: Sequence[str], cwd: Path | str, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        """As ``subprocess.run(argv, capture_output=True, text=True, timeout=...)``."""
        process = self.popen(argv, cwd, env)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        return subprocess.CompletedProcess(list(argv), process.returncode, out, err)

    def close(self) -> None:
        """Ends the server (what it forked goes on). ``shutdown`` first: the reply reader's
        ``recv`` holds the socket open past a plain ``close``, and the server would wait on."""
        self.closing = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        try:
            self.server.wait(10)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()

    def _read_replies(self) -> None:
        """The server's ``{"id", "pid"}`` and ``{"id", "code"}`` messages, to their processes."""
        while message := self.sock.recv(MESSAGE_BYTES):
            reply = json.loads(message)
            with self.lock:
                process = self.started.get(reply["id"])
                if process is None:
                    event, box = self.waiting[reply["id"]]
                    box.append(reply.get("pid", reply.get("code")))
                    event.set()
            if process is not None:
                process.end(reply["code"])
        with self.lock:
            for event, _ in self.waiting.values():
                event.set()
        if not self.closing:  # the server died: what it had not reported is lost with it
            self.server.wait()
            for process in self.started.values():
                if process.returncode is None:
                    process.end(-signal.SIGKILL)


def _output(spec: Any, own: int) -> tuple[int, int | None]:
    """The descriptor a child writes to, and the read end kept here when it is a pipe."""
    if spec == subprocess.PIPE:
        read, write = os.pipe()
        return write, read
    if spec is None:
        return own, None
    if spec == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_WRONLY), -1  # -1: closed once sent, nothing to read
    return (spec if isinstance(spec, int) else spec.fileno()), None


def target_of(argv: Sequence[str]) -> tuple[str, str]:
    """What a command runs: ``("module", NAME)`` for ``python -m NAME``, ``("entry", NAME)``
    for an installed console script; anything else is refused in one line."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m":
        return "module", argv[2]
    name = Path(argv[0]).name if argv else ""
    if importlib.metadata.entry_points(group="console_scripts", name=name):
        return "entry", name
    raise ValueError(
        f"{list(argv[:3])}: not a warm command (valid: [{sys.executable}, -m, MODULE, ...] "
        "or an installed console script)"
    )


def serve(fd: int, preload: Sequence[str]) -> None:
    """The server's loop: the imports, then a fork per request (:func:`_become` in the child,
    which never comes back here) and a reply per fork and per exit. No ``finally`` here: a
    child leaves through this frame with its command's exit."""
    sock = socket.socket(fileno=fd)
    try:
        for name in preload:
            importlib.import_module(name)
    except Exception as exc:
        sock.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        return
    if threading.active_count() != 1:
        sock.send(json.dumps({"error": "the imports started a thread: fork is unsafe"}).encode())
        return
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    sock.send(b'{"ready": true}')
    children: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            for pid, code in _reaped():
                sock.send(json.dumps({"id": children.pop(pid), "code": code}).encode())
        if sock in ready:
            message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 2)
            if not message:
                return
            request = json.loads(message)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for own in (sock.fileno(), wake_r, wake_w):
                    os.close(own)
                _become(request, fds)
            for received in fds:
                os.close(received)
            children[pid] = request["id"]
            sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())


def _reaped() -> list[tuple[int, int]]:
    """Every child that has ended, with its exit code (``-N``: signal ``N``)."""
    out = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, os.waitstatus_to_exitcode(status)))


def _become(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """In the child: the signals as a fresh interpreter has them, the request's output,
    folder, environment (``tempfile``'s folder found again from it) and argv, then its command;
    its exit (``SystemExit``, an exception) goes up through the server's frames to the
    interpreter's own end."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in {null, *fds}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None
    argv = request["argv"]
    kind, name = target_of(argv)
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    if kind == "module":
        sys.argv = [name, *argv[3:]]
        sys.path[0:1] = [os.getcwd(), *extra]
        sys.modules.pop(name, None)  # as under ``python -m``: run as ``__main__``, not imported
        runpy.run_module(name, run_name="__main__", alter_sys=True)
        sys.exit(0)
    sys.argv = list(argv)
    sys.path[0:1] = [str(Path(argv[0]).parent), *extra]
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name=name)
    sys.exit(entry.load()())


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
