"""``best`` on the worst shuffle found (docs/model.md, "Which shuffles"): its largest load over
the candidate shuffles against the lowest of its placement families' (each family at its best
member, shuffle by shuffle).

    python scripts/best_worst_case.py --workers 6 7 8 --seeds 0 1 2 [--batch 2]

For every ``K`` and seed and every integer ``T`` in 2..K-1: a random assignment of ``K q``
points, the candidate shuffles of :func:`coded_shuffle.math.shuffles.candidate_shuffles`, and
a row ``K, T, seed, best, lowest family, equal``. Exits 1 when a row differs. The suite runs the
same check up to ``K = 5`` (``tests/test_shuffles.py``); ``K = 8`` takes about 4 minutes a seed
here.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from coded_shuffle.math.assignment import random_assignment
from coded_shuffle.math.plan import plan_load
from coded_shuffle.math.schemes import Scheme, get_scheme
from coded_shuffle.math.shuffles import Shuffle, candidate_shuffles
from coded_shuffle.math.state import CacheState


def family_worst(members: dict[str, Scheme], state: CacheState, found: list[Shuffle]) -> float:
    """A family's worst case over ``found``: its best member's largest load."""
    return max(min(plan_load(s.plan(state, c.new)) for s in members.values()) for c in found)


def check(k: int, q: int, seed: int) -> list[tuple[int, float, float]]:
    """``(T, best's worst case, the lowest family's)`` for every integer ``T`` in 2..K-1."""
    best = get_scheme("best")
    rows = []
    for t in range(2, k):
        old = random_assignment(q * k, k, np.random.default_rng(seed))
        found = candidate_shuffles(old, k, np.random.default_rng(seed + 100))
        lowest = min(
            family_worst(f, next(iter(f.values())).initial_state(old, k, float(t)), found)
            for f in best.families(q * k, k, float(t))
        )
        state = best.initial_state(old, k, float(t))
        rows.append((t, max(plan_load(best.plan(state, c.new)) for c in found), lowest))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[6, 7, 8])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--batch", type=int, default=2, help="points per batch (q)")
    args = ap.parse_args(argv)
    if min(args.workers) < 3 or args.batch < 1:
        print(f"--workers {args.workers} must be >= 3 and --batch >= 1", file=sys.stderr)
        return 2
    print("| K | T | seed | best's worst case | lowest family's | equal |")
    print("|---:|---:|---:|---:|---:|---|")
    same = True
    for k in args.workers:
        for seed in args.seeds:
            for t, mine, lowest in check(k, args.batch, seed):
                equal = abs(mine - lowest) <= 1e-9
                same &= equal
                print(f"| {k} | {t} | {seed} | {mine:.4f} | {lowest:.4f} | {equal} |", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
