"""Runs ``tests/unclosed_loop.py`` (an own loop that never closes its ``CodedShuffle`` and
destroys the process group at the end) ``--runs`` times with ``--ranks`` processes, and prints
every run's exit codes and how many runs had a rank exit other than 0 (docs/testing.md).

    python scripts/unclosed_loops.py --runs 20 --ranks 4 [--close-after-destroy]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from coded_shuffle.tools.ranks import start_ranks

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--scheme", default="uncoded")
    parser.add_argument("--close-after-destroy", action="store_true")
    args = parser.parse_args()
    if args.runs < 1 or args.ranks < 2:
        parser.error(f"--runs {args.runs} (>= 1) and --ranks {args.ranks} (>= 2)")
    script = ["tests/unclosed_loop.py", "--scheme", args.scheme]
    script += ["--close-after-destroy"] if args.close_after_destroy else []
    bad = 0
    for run in range(1, args.runs + 1):
        t0 = time.perf_counter()
        procs = start_ranks(script, args.ranks, REPO)
        codes = []
        for p in procs:
            p.communicate(timeout=300)
            codes.append(p.returncode)
        bad += any(codes)
        print(f"run {run:2d}: exit codes {codes} ({time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"{bad} of {args.runs} runs had a rank exit other than 0")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
