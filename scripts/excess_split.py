"""Elmahdy-Mohajer on random shuffles: how close the permutation split gets to the bound.

Three checks (issue 10's targets), printed as tables:

1. ``K <= 5, q <= 3``: on random shuffles, the E-M delivery's load against the best split an
   exhaustive search finds (every multiset of ``q`` permutations that sums to the shuffle).
2. ``q = 10``, 5 epochs of random shuffles, ``-B 840``: the mean load over the placement's
   ordering cut-set bound, of the per-permutation delivery with the split of cycle packing /
   greedy Birkhoff alone (``heuristic``) and with the project's split (``split``: exhaustive
   where small, else that start improved by local search), the optimum of the fractional
   clique cover LP (``cover LP``: any mix of XOR multicasts across the permutations), and of
   the delivery (``now``: the lowest of the split, the rounded clique cover and the mix of
   whole permutation-code uses with cliques). Every epoch of ``now`` is decoded byte-exactly.
3. ``attia-tandon-excess`` at its corners ``p >= 1``, ``q = 10``, 5 epochs, ``-B 840``: the
   mean load of eq. (57) of Attia & Tandon 2019 alone and of the project's delivery (the lower of
   eq. (57) with the old owners' groups of ``p + 2`` and the clique cover), the placement's
   cut-set bound, and E-M at the same ``T``.

    python scripts/excess_split.py
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys

import numpy as np

from coded_shuffle.math.assignment import random_assignment, shuffle_matrix
from coded_shuffle.math.schemes.attia_tandon_excess import at_load_for, at_storage, needed_points
from coded_shuffle.math.schemes.clique_cover import fractional_cover_points
from coded_shuffle.math.schemes.elmahdy_mohajer import heuristic_split, split_load, split_rows
from coded_shuffle.tools.evaluate import Evaluation, run

TARGET_CASES = ((4, 2), (6, 2), (8, 2), (6, 3), (8, 3))
AT_CASES = ((4, 1), (5, 1), (5, 2), (6, 1), (6, 2), (8, 1), (8, 2))


def best_split_load(s: np.ndarray, t: int) -> float:
    k, q = s.shape[0], int(s[0].sum())
    perms = [p for p in itertools.permutations(range(k)) if all(s[i, p[i]] for i in range(k))]
    best = math.inf
    for combo in itertools.combinations_with_replacement(perms, q):
        total = np.zeros_like(s)
        for p in combo:
            total[np.arange(k), list(p)] += 1
        if np.array_equal(total, s):
            best = min(best, split_load(np.array(combo), t))
    return best


def exhaustive_table(trials: int, seed: int) -> None:
    print(f"1. K <= 5, q <= 3, t >= 2: {trials} random shuffles per (K, q)")
    print(f"{'K':>2} {'q':>2} {'equal now':>10} {'equal heuristic':>16}")
    rng = np.random.default_rng(seed)
    for k in range(2, 6):
        for q in range(1, 4):
            now = old = 0
            for _ in range(trials):
                t = int(rng.integers(2, k + 1))
                a, b = random_assignment(k * q, k, rng), random_assignment(k * q, k, rng)
                s = shuffle_matrix(a, b, k)
                best = best_split_load(s, t)
                now += abs(split_load(split_rows(s, t), t) - best) < 1e-9
                old += abs(split_load(heuristic_split(s, t), t) - best) < 1e-9
            print(f"{k:>2} {q:>2} {now:>5}/{trials:<4} {old:>11}/{trials:<4}")


def target_table(epochs: int, seed: int) -> None:
    print(f"\n2. q = 10, {epochs} epochs of random shuffles, 840-byte points: load / bound")
    print(
        f"{'K':>2} {'t':>2} {'heuristic':>10} {'split':>8} {'cover LP':>9} {'now':>8} "
        f"{'plan s':>7} {'verified':>9}"
    )
    for k, t in TARGET_CASES:
        ev = Evaluation("elmahdy-mohajer", k, 10 * k, float(t), epochs, seed, 840)
        reports = list(run(ev))
        seq = list(ev.assignments(np.random.default_rng(seed)))
        scheme, state = ev.validate(), None
        heuristic, split, cover = [], [], []
        for a, b, r in zip(seq[:-1], seq[1:], reports, strict=True):
            s = shuffle_matrix(a, b, k)
            heuristic.append(split_load(heuristic_split(s, t), t) / r.lower_bound_points)
            split.append(split_load(split_rows(s, t), t) / r.lower_bound_points)
            state = state or scheme.initial_state(a, k, float(t))
            cover.append(fractional_cover_points(state, b) / r.lower_bound_points)
            state = scheme.next_state(state, scheme.plan(state, b), b)
        now = [r.load_points / r.lower_bound_points for r in reports]
        print(
            f"{k:>2} {t:>2} {statistics.mean(heuristic):>10.4f} {statistics.mean(split):>8.4f} "
            f"{statistics.mean(cover):>9.4f} {statistics.mean(now):>8.4f} "
            f"{statistics.mean(r.plan_seconds for r in reports):>7.2f} "
            f"{all(r.verified for r in reports)!s:>9}"
        )


def attia_tandon_table(epochs: int, seed: int) -> None:
    print(f"\n3. attia-tandon-excess, q = 10, {epochs} epochs, 840-byte points: mean loads")
    print(
        f"{'K':>2} {'p':>2} {'T':>6} {'eq. (57)':>9} {'now':>7} {'bound':>7} {'now/bound':>10} "
        f"{'E-M':>7} {'verified':>9}"
    )
    for k, p in AT_CASES:
        storage = at_storage(k, p)
        ev = Evaluation("attia-tandon-excess", k, 10 * k, storage, epochs, seed, 840)
        reports = list(run(ev))
        seq = list(ev.assignments(np.random.default_rng(seed)))
        paper = [
            at_load_for([n.size for n in needed_points(a, b, k)], k, p)
            for a, b in itertools.pairwise(seq)
        ]
        em = list(run(Evaluation("elmahdy-mohajer", k, 10 * k, storage, epochs, seed, 840)))
        now = statistics.mean(r.load_points for r in reports)
        bound = statistics.mean(r.lower_bound_points for r in reports)
        print(
            f"{k:>2} {p:>2} {storage:>6.3f} {statistics.mean(paper):>9.2f} {now:>7.2f} "
            f"{bound:>7.2f} {now / bound:>10.4f} "
            f"{statistics.mean(r.load_points for r in em):>7.2f} "
            f"{all(r.verified for r in reports + em)!s:>9}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100, help="shuffles per (K, q) in table 1")
    ap.add_argument("--epochs", type=int, default=5, help="epochs per case in table 2")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.trials < 1 or args.epochs < 1:
        print(
            f"excess_split: error: --trials ({args.trials}) and --epochs ({args.epochs}) "
            "must be >= 1",
            file=sys.stderr,
        )
        return 2
    exhaustive_table(args.trials, args.seed)
    target_table(args.epochs, args.seed)
    attia_tandon_table(args.epochs, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
