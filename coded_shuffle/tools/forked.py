"""A process forked from another interpreter than this one, as much of
:class:`subprocess.Popen` as the tests and scripts take: ``pid``, ``returncode``,
:meth:`~Forked.poll`, :meth:`~Forked.wait`, :meth:`~Forked.communicate` (text) and
:meth:`~Forked.kill`. It is not this process's child: the interpreter that forked it reaps it
and reports its exit code (:meth:`~Forked.end`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading


class Forked:
    """One forked process; ``stdout``/``stderr``: the read ends of its output's pipes (None:
    its output goes elsewhere)."""

    def __init__(self, pid: int, stdout: int | None, stderr: int | None) -> None:
        self.pid, self.returncode = pid, None
        self.stdout = _text(stdout)
        self.stderr = _text(stderr)
        self.ended = threading.Event()
        self.readers: list[threading.Thread] = []
        self.texts: list[str | None] = [None, None]

    def end(self, code: int) -> None:
        """Its exit code, as its parent reports it (``-N``: killed by signal ``N``)."""
        self.returncode = code
        self.ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self.ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"process {self.pid}", timeout or 0.0)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # ended: its parent reports it
                os.kill(self.pid, signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Its whole output and error output (None: not piped), once it ended (TimeoutExpired:
        ``timeout``; a later call goes on reading)."""
        if not self.readers:
            for i, file in enumerate((self.stdout, self.stderr)):
                if file is not None:
                    reader = threading.Thread(target=self._read, args=(i, file), daemon=True)
                    reader.start()
                    self.readers.append(reader)
        for reader in self.readers:
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(f"process {self.pid}", timeout or 0.0)
        self.wait(timeout)
        return self.texts[0], self.texts[1]

    def _read(self, i: int, file) -> None:
        with file:
            self.texts[i] = file.read()


def _text(fd: int | None):
    return None if fd is None else os.fdopen(fd, encoding="utf-8", errors="replace")
