"""An own loop that never closes its ``CodedShuffle``, or closes it after destroying the process
group, still ends every rank with exit 0: the watchdog's threads and the transport are released
when the interpreter exits, before torch's teardown (a thread left in a store call there
aborted rank 0 in one run of eight)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coded_shuffle.tools.ranks import start_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("close", [[], ["--close-after-destroy"]], ids=["never", "after"])
def test_an_unclosed_coded_shuffle_exits_zero_on_every_rank(close):
    """One run each (``scripts/unclosed_loops.py`` runs it 20 times: docs/testing.md)."""
    procs = start_ranks(["tests/unclosed_loop.py", *close], 4, REPO)
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        results.append((p.returncode, out, err))
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, f"rank {rank}: exit {code}\n{err[-2000:]}"
        assert "3 epochs verified" in out
