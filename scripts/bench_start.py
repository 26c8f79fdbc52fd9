"""What starting the training command costs: wall and CPU seconds of a short job and of a
refused one, and what each left in the temporary folder.

    python scripts/bench_start.py --runs 5

Each case runs ``--runs`` times, one after the other, as ``python -m coded_shuffle_train.launch``
(the tree on ``PYTHONPATH`` or the installed one), with ``TMPDIR`` set to a fresh folder. CPU
seconds are user plus system time of the command and every process it waited for (the ranks
are the fork server's children, the server the launcher's). The table gives the median of
each column; "left" counts the entries the runs left in ``TMPDIR`` (torch's persistent cache
``torchinductor_<user>`` not counted).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = ["workers=4", "epochs=3", "seed=3", "model=mlp", "model.hidden=16"]  # the suite's job
CASES = {"job (3 epochs, K = 4)": JOB, "refused (workers=0)": ["workers=0"]}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(overrides: list[str], work: Path) -> tuple[float, float, int, int]:
    """Wall and CPU seconds of one command, its exit code, and what it left in TMPDIR."""
    scratch = Path(tempfile.mkdtemp(dir=work))
    env = {**os.environ, "TMPDIR": str(scratch)}
    argv = [sys.executable, "-m", "coded_shuffle_train.launch", *overrides]
    argv.append(f"hydra.run.dir={scratch}-run")  # a new run every time
    cpu, t0 = children_cpu(), time.perf_counter()
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu
    left = [p for p in scratch.iterdir() if not p.name.startswith("torchinductor_")]
    return wall, cpu, done.returncode, len(left)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each case (default 5)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs {args.runs} out of range (must be >= 1)")
    print("| case | runs | exit | wall (median) | CPU (median) | left in TMPDIR |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as work:
        for name, overrides in CASES.items():
            runs = [one_run(overrides, Path(work)) for _ in range(args.runs)]
            walls, cpus, codes, left = zip(*runs, strict=True)
            code = "/".join(sorted({str(c) for c in codes}))
            print(
                f"| {name} | {args.runs} | {code} | {statistics.median(walls):.2f} s "
                f"| {statistics.median(cpus):.2f} s | {sum(left)} |"
            )


if __name__ == "__main__":
    main()
