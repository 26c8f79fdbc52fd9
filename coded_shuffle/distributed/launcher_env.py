"""What torch's elastic launcher tells a rank through its environment, read in one place for
the library and the jobs (no torch import: the coded-elastic job's workers read it too)."""

from __future__ import annotations

import os


def attempt() -> int:
    """The launcher's restart count (0: the first attempt, or the same command run again)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def agent_store() -> bool:
    """Whether the launcher's agent hosts the store every attempt shares (else rank 0 hosts
    one of this attempt's own)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
