"""Decentralized coded shuffling at ``T = K - 2`` on random shuffles: how many cost more than
the converse, the largest ratio, and the plan's time (docs/decentralized.md, section 2e).

    python scripts/decentralized_random.py [--workers 5 6 7 8] [--batches 2 3] [--shuffles 200]

Batches of ``q`` points (``N = K q``), every epoch a random reshuffle of the one before
(``random_assignment``, seed ``--seed``); the load is the closed form of the plan
(``decentralized_load``), which the tests check against plans decoded with real bytes.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.optimize  # noqa: F401  (the program's solver: its import is not a plan's time)

from coded_shuffle.math.assignment import random_assignment, shuffle_matrix
from coded_shuffle.math.rate_memory import decentralized_converse
from coded_shuffle.math.schemes.decentralized import decentralized_load


def row(k: int, q: int, shuffles: int, seed: int) -> str:
    """One table row: ``K``, ``N``, shuffles, those above the converse (the largest ratio),
    the plan's mean and largest time."""
    n, m = k * q, k - 2
    converse = float(decentralized_converse(k, n, m))
    old = np.repeat(np.arange(k), q)
    rng = np.random.default_rng(seed)
    above, worst, times = 0, 0.0, []
    for _ in range(shuffles):
        moves = shuffle_matrix(old, random_assignment(n, k, rng), k)
        start = time.perf_counter()
        ratio = decentralized_load(moves, m) / converse
        times.append(time.perf_counter() - start)
        above += ratio > 1 + 1e-9
        worst = max(worst, ratio)
    cost = f"{above} ({worst:.3f}x)" if above else "0"
    mean, most = 1e3 * float(np.mean(times)), 1e3 * max(times)
    return f"| {k} | {n} | {shuffles} | {cost} | {mean:.0f} ms, {most:.0f} ms |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[5, 6, 7, 8])
    parser.add_argument("--batches", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--shuffles", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    bad = [k for k in args.workers if not 5 <= k <= 16] + [q for q in args.batches if q < 1]
    if bad or args.shuffles < 1:
        parser.error(f"--workers must be in 5..16, --batches and --shuffles >= 1 (got {bad})")
    print("| `K` | `N` | shuffles | above the converse | plan time (mean, max) |")
    print("|---:|---:|---:|---|---|")
    for k in args.workers:
        for q in args.batches:
            print(row(k, q, args.shuffles, args.seed), flush=True)


if __name__ == "__main__":
    main()
