"""``coded_shuffle.tools.ranks.start_ranks``: a script once per rank, forked from one interpreter
that imported torch, and run as ``python SCRIPT`` runs it (``__main__``, its argv, its folder
first on the path, the rank's environment, its own output, ``atexit`` at the interpreter's
exit, its exit code, a timeout)."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from coded_shuffle.tools.ranks import start_ranks

SCRIPT = """
import atexit, json, os, sys, time

atexit.register(lambda: print("atexit ran", flush=True))
rank = int(os.environ["RANK"])
print(json.dumps({
    "name": __name__, "argv": sys.argv, "path0": sys.path[0], "file": __file__,
    "env": [os.environ[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK")],
    "threads": os.environ["OMP_NUM_THREADS"],
}))
print(f"error output of rank {rank}", file=sys.stderr)
if rank == 1:
    raise SystemExit(3)
if rank == 2:
    raise ValueError("rank 2 fails")
if rank == 3:
    time.sleep(60)
"""


def test_every_rank_runs_the_script_as_python_runs_it_and_ends_with_its_own_code(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(SCRIPT))
    ranks = start_ranks([str(script), "--flag", "x"], 4, tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):  # rank 3 sleeps: as a process's would
        ranks[3].communicate(timeout=0.5)
    ranks[3].kill()
    ended = [r.communicate(timeout=60) for r in ranks]
    assert [r.returncode for r in ranks] == [0, 3, 1, -9]
    assert [r.poll() for r in ranks] == [0, 3, 1, -9]
    for rank, (out, err) in enumerate(ended[:3]):
        seen = json.loads(out.splitlines()[0])
        assert seen["name"] == "__main__" and seen["argv"] == [str(script), "--flag", "x"]
        assert seen["path0"] == str(tmp_path) and seen["file"] == str(script)
        assert seen["env"] == [str(rank), "4", "127.0.0.1", "0"] and seen["threads"] == "1"
        assert out.splitlines()[-1] == "atexit ran"
        assert err.splitlines()[0] == f"error output of rank {rank}"
    assert ended[2][1].splitlines()[-1] == "ValueError: rank 2 fails"
