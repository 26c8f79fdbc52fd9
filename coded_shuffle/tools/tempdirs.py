"""Temporary folders deep enough to hold a process's AF_UNIX sockets (the fork server's, in
``multiprocessing``'s own folder): a socket's path is at most 107 bytes on Linux, so a base
folder too deep for one (a test's ``TMPDIR``, an emulated host's) gives way to a short one, as
Python 3.13's ``multiprocessing`` chooses for itself."""

from __future__ import annotations

import os
import tempfile

SOCKET_PATH_MAX = 107  # Linux's sun_path, its terminating NUL aside
SHORT_BASES = ("/tmp", "/var/tmp", "/usr/tmp")  # Python 3.13's candidates, in its order
# multiprocessing's folder and its socket inside it: BASE/pymp-XXXXXXXX/listener-XXXXXXXX
SERVER_SOCKET_TAIL = len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def socket_base(tail: int, base: str | None = None) -> str | None:
    """``base`` (the system's temporary folder when None) where ``tail`` more bytes of path
    still fit a socket's, else the first writable of :data:`SHORT_BASES` (None where none is:
    then ``tempfile``'s own choice, and a socket's bind fails naming the path)."""
    base = base if base is not None else tempfile.gettempdir()
    if len(os.fsencode(base)) + tail <= SOCKET_PATH_MAX:
        return base
    return next((d for d in SHORT_BASES if os.path.isdir(d) and os.access(d, os.W_OK)), None)
