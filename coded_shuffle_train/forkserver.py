"""The local launcher's fork server, from which every rank is forked (``dist.start_method``:
``forkserver``).

The ranks are never forked from the launcher itself: its store and rendezvous threads make
``fork`` unsafe there (a child can inherit a lock held at fork time and hang; docs/testing.md).
The standard library's fork server is a fresh interpreter that imports what it is told to
preload, so torch was imported twice per command, once by the launcher for its elastic agent
and once by the server. Here the launcher, once it has imported torch and while it is still
single-threaded, forks the server from itself: the server imports the rest of
:mod:`coded_shuffle_train.preload` (``torch._dynamo``, the jobs, scipy's solvers, the warmed
kernel) while the launcher composes and checks the config, and every command saves a whole
import of torch (about 3 s of CPU here). The standard library has no public way to hand it a
server: this module fills in the same fields of :data:`multiprocessing.forkserver._forkserver`
that its ``ensure_running`` fills, and falls back to that function wherever the fields or
``main``'s parameters are not the ones it knows (:func:`forkable`).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable
from typing import NoReturn

from coded_shuffle.tools.tempdirs import SERVER_SOCKET_TAIL, socket_base

from .fast_exit import exit_now

# multiprocessing.forkserver.main's parameters (Python 3.10 to 3.14) and the server's fields
KNOWN_PARAMETERS = frozenset(
    {"listener_fd", "alive_r", "preload", "main_path", "sys_path", "sys_argv", "authkey_r"}
)
FIELDS = ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid")
AUTHKEY_BYTES = 32  # multiprocessing.forkserver._AUTHKEY_LEN (Python 3.14)
PRELOAD = ["__main__", "coded_shuffle_train.preload"]  # for a server started the standard way
AGENT_LOG = "torch.distributed.elastic.multiprocessing.api"  # where torch's agent logs a failure


def forkable() -> bool:
    """Whether this process may fork the server from itself: no thread of Python's started
    yet, no logging handler set up (a rank that inherits one keeps the launcher's logging and
    skips its own), and the standard library's server made of the fields and ``main`` this
    module knows."""
    import multiprocessing.forkserver as fs

    server = getattr(fs, "_forkserver", None)
    params = set(inspect.signature(fs.main).parameters)
    return (
        threading.active_count() == 1
        and not logging.getLogger().handlers
        and server is not None
        and all(hasattr(server, f) for f in FIELDS)
        and {"listener_fd", "alive_r", "preload"} <= params <= KNOWN_PARAMETERS
        and (not keyed() or hasattr(server, "_forkserver_authkey"))
    )


def keyed() -> bool:
    """Whether the standard library's server proves its clients by a key (Python 3.14)."""
    import multiprocessing.forkserver as fs

    return "authkey_r" in inspect.signature(fs.main).parameters


def server_pid() -> int | None:
    """The running server's process id (None: none started)."""
    import multiprocessing.forkserver as fs

    return getattr(getattr(fs, "_forkserver", None), "_forkserver_pid", None)


def running() -> bool:
    return server_pid() is not None


def start() -> None:
    """The fork server for this command, unless one runs: forked from this process once it
    has imported torch (:func:`forkable`; the server imports the rest of the preload), else
    started the standard way (a fresh interpreter that imports all of it). Called before
    anything that a fork would pass on to every rank: threads, Hydra's logging handlers."""
    if running():
        return
    if not forkable():
        start_standard()
        return
    import torch  # noqa: F401  (the launcher's elastic agent needs it: imported once, here)

    _fork_server()


def socket_folder() -> str:
    """The folder of the server's socket, ``multiprocessing``'s temporary folder, made here
    when none is yet: under the system's temporary folder where the socket's path fits, else
    under a short one (:func:`~coded_shuffle.tools.tempdirs.socket_base`; Python 3.11 and 3.12
    would fail to bind it)."""
    from multiprocessing import util

    before, tempfile.tempdir = tempfile.tempdir, socket_base(SERVER_SOCKET_TAIL)
    try:
        return util.get_temp_dir()
    finally:
        tempfile.tempdir = before


def start_standard() -> None:
    """``multiprocessing``'s own start: a fresh interpreter that imports the preload (a sweep
    that switches to ``forkserver`` after its first job: threads of that job's agent may
    still run here, and Hydra's handlers are set up)."""
    import multiprocessing
    import multiprocessing.forkserver

    multiprocessing.set_forkserver_preload(PRELOAD)
    socket_folder()
    multiprocessing.forkserver.ensure_running()


def _fork_server() -> None:
    """What ``ForkServer.ensure_running`` does, with ``os.fork`` for its new interpreter: the
    listening socket, the pipe whose end tells the server that no client is left, and (Python
    3.14) the key that every client proves it holds."""
    import multiprocessing.forkserver as fs
    from multiprocessing import connection, resource_tracker

    server = fs._forkserver
    with_key = keyed()
    resource_tracker.ensure_running()  # before the fork: the server and the ranks share it
    socket_folder()
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        key_r, key_w = os.pipe() if with_key else (None, None)
        pid = os.fork()
        if pid == 0:
            _serve(listener.fileno(), alive_r, alive_w, key_r, key_w)
        os.close(alive_r)
        if with_key:
            key = os.urandom(AUTHKEY_BYTES)
            os.close(key_r)
            os.write(key_w, key)
            os.close(key_w)
            server._forkserver_authkey = key
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid


def _serve(listener: int, alive_r: int, alive_w: int, key_r: int | None, key_w: int | None):
    """The forked server's whole life: the preload, then ``multiprocessing``'s own loop; it
    never returns into the launcher's code, and never runs the launcher's exit handlers."""
    import multiprocessing.forkserver as fs

    try:
        os.close(alive_w)
        if key_w is not None:
            os.close(key_w)
        with contextlib.suppress(ImportError):  # as the standard server does: a rank then fails
            importlib.import_module(PRELOAD[1])  # while the launcher goes on with its config
        fs.main(listener, alive_r, [], **({} if key_r is None else {"authkey_r": key_r}))
    finally:
        os._exit(0)


def stop() -> None:
    """Ends the fork server at once when every job is over (it has no rank left to serve). It
    holds the console's streams, and its interpreter's own exit, with torch and numba loaded,
    would keep a pipe that reads the launcher's output open for most of a second more."""
    pid = server_pid()
    if pid:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def run_command(command: Callable[[], None]) -> NoReturn:
    """Runs a command whose ranks this server forks (the local launcher's, a node's): the
    server stopped whatever happens; after a success its folder removed and the process ended
    at once (every job is over and its files written: torch is not torn down)."""
    logging.getLogger(AGENT_LOG).addFilter(drop_join_traceback)
    try:
        command()
    finally:
        stop()
    remove_folder()
    exit_now()


def drop_join_traceback(record: logging.LogRecord) -> bool:
    """A log filter: torch's agent logs a rank that exited (``ProcessExitedException``: "process
    0 terminated with exit code 1") with the traceback of its own join, nothing of the rank's,
    and torch's log formatter imports ``torch._dynamo`` to format a traceback: 2 s of CPU on
    the failure's path, in a process that never needed it. The line stays, that traceback
    goes (a rank's own, ``ProcessRaisedException``, stays)."""
    from torch.multiprocessing.spawn import ProcessExitedException

    if record.exc_info and isinstance(record.exc_info[1], ProcessExitedException):
        record.exc_info, record.exc_text = None, None
    return True


def remove_folder() -> None:
    """Removes the folder of the server's socket, which ``multiprocessing`` removes at the
    interpreter's exit: the command's fast exit after a successful run skips that (none made,
    under ``spawn``: none made here either)."""
    import multiprocessing

    folder = multiprocessing.current_process()._config.get("tempdir")  # get_temp_dir's own
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
