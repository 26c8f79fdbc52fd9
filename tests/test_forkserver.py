"""The launcher's fork server (coded_shuffle_train/forkserver.py): forked from the launcher
where the standard library is as the module knows it, started the standard way elsewhere."""

from __future__ import annotations

import logging
import multiprocessing.forkserver
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from coded_shuffle_train import forkserver

FORK_AND_SERVE = textwrap.dedent(
    """
    import multiprocessing, os
    import multiprocessing.forkserver as fs
    from coded_shuffle_train import forkserver

    assert forkserver.forkable()
    forkserver._fork_server()  # the preload left out: the fork is what is tested
    server = fs._forkserver._forkserver_pid
    with open(f"/proc/{server}/cmdline", "rb") as f, open("/proc/self/cmdline", "rb") as g:
        print("forked" if f.read() == g.read() else "spawned")
    child = multiprocessing.get_context("forkserver").Process(target=os.getpid)
    child.start()
    child.join()
    print("child exit", child.exitcode)
    forkserver.stop()
    forkserver.remove_folder()
    print("server left" if os.path.exists(f"/proc/{server}") else "server gone")
    """
)


def test_the_launcher_forks_its_fork_server_and_ranks_start_from_it():
    """On this Python the server is this process forked (its command line is the launcher's,
    not a fresh interpreter's), a process started through ``multiprocessing``'s forkserver
    context runs from it and exits 0, and stopping it leaves no server."""
    out = subprocess.run(
        [sys.executable, "-c", FORK_AND_SERVE], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:3] == ["forked", "child exit 0", "server gone"], out.stdout


@pytest.fixture
def single_threaded(monkeypatch):
    """This test process as the launcher is when it starts its server: one Python thread, no
    logging handler (pytest's own set aside)."""
    monkeypatch.setattr(forkserver.threading, "active_count", lambda: 1)
    root = SimpleNamespace(handlers=[])
    monkeypatch.setattr(forkserver, "logging", SimpleNamespace(getLogger=lambda: root))
    return root


def test_the_standard_librarys_server_is_forkable(single_threaded):
    assert forkserver.forkable()


def test_a_server_main_with_parameters_it_does_not_know_is_not_forked(monkeypatch, single_threaded):
    def main(listener_fd, alive_r, preload, *, handshake=None):  # another Python's
        raise AssertionError("never called")

    monkeypatch.setattr(multiprocessing.forkserver, "main", main)
    assert not forkserver.forkable()


def test_a_server_without_the_fields_it_fills_is_not_forked(monkeypatch, single_threaded):
    monkeypatch.setattr(multiprocessing.forkserver, "_forkserver", object())
    assert not forkserver.forkable()


def test_threads_running_keep_the_server_from_being_forked(monkeypatch, single_threaded):
    monkeypatch.setattr(forkserver.threading, "active_count", lambda: 2)
    assert not forkserver.forkable()


def test_logging_set_up_keeps_the_server_from_being_forked(single_threaded):
    """Hydra's handlers, once its app runs: every rank would log through them."""
    single_threaded.handlers.append(logging.StreamHandler())
    assert not forkserver.forkable()


def test_a_rank_that_exited_is_logged_without_the_agents_join_traceback():
    """torch's agent logs an exited rank with the traceback of its own join, which torch's log
    formatter would import ``torch._dynamo`` to format: the line stays, that traceback goes; a
    rank's own (raised in it) stays."""
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    def record(exc: BaseException) -> logging.LogRecord:
        info = (type(exc), exc, None)
        return logging.LogRecord(
            forkserver.AGENT_LOG, logging.ERROR, "api.py", 1, "failed", (), info
        )

    exited = record(ProcessExitedException("process 0 terminated", 0, 1, exit_code=1))
    assert forkserver.drop_join_traceback(exited) and exited.exc_info is None
    assert exited.getMessage() == "failed"
    raised = record(ProcessRaisedException("Traceback ... ValueError", 0, 1))
    assert forkserver.drop_join_traceback(raised) and raised.exc_info is not None
