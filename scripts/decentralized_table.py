"""Decentralized coded shuffling's worst-case loads beside the converse (docs/decentralized.md).

    python scripts/decentralized_table.py --max-workers 16 [--measure 8]
    python scripts/decentralized_table.py --shuffle worst --max-workers 12 [--jobs 2]

For every ``K`` up to ``--max-workers`` and integer storage ``T = 2 .. K-1``, on the worst
shuffle (every batch moves to the next worker) of ``N = K C(K-1, T-1) T`` points: the
scheme's load (the closed form of its plan: eq. (1) summed over the groups, at ``T = 2`` the
triples across senders, from ``T = 3`` the cliques across groups where they cost less), the
decentralized converse ``N (K-T) / (T (K-1))``, the uncoded exchange with the same storage
``N (K-T) / (K-1)``, and the centralized optimum under uncoded placement (a master that holds
everything: Elmahdy & Mohajer 2018). Loads in units of ``N``. ``--measure K``: the closed form
is checked against plans really encoded, decoded at every worker and compared with the
master's bytes (``coded-shuffle evaluate``) for every ``K`` up to that one.

``--shuffle worst``: the same ``N``, the largest closed-form load over every cycle type of a
whole-batch permutation and the split shuffle (:mod:`coded_shuffle.math.shuffles`), the
shuffle that attained it, its ratio to the converse and the cyclic shift's (``tests/
test_shuffles.py`` checks the closed form against plans on every cycle type up to ``K = 8``).
A shuffle whose load before paths (an upper bound) is no larger than the worst so far is not
searched for paths; ``--jobs J`` searches ``J`` rows at a time (``K = 11`` and ``12``, every
``T``: 37 s with 2; ``K = 16``, ``T`` 4..12: see docs/decentralized.md).
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from collections.abc import Iterator
from math import comb

import numpy as np

from coded_shuffle.math.assignment import shuffle_matrix
from coded_shuffle.math.rate_memory import decentralized_converse, em_worst_case
from coded_shuffle.math.schemes.decentralized import (
    MAX_WORKERS,
    corner_splits,
    decentralized_load,
    load_before_paths,
)
from coded_shuffle.math.shuffles import cyclic_shuffle, structured_shuffles, worst_of
from coded_shuffle.tools.evaluate import Evaluation, run


def batch_points(num_workers: int, storage: int) -> int:
    """Points per batch: ``C(K-1, T-1) T``, so that ``N`` is the issue's multiple of
    ``K C(K-1, T-1) T`` (the groups' load is linear in the shuffle matrix; the triples of
    section 2b deal every bucket's pieces to three roles, so the batch size matters there)."""
    return comb(num_workers - 1, storage - 1) * storage


def worst_load(num_workers: int, storage: int) -> float:
    """The scheme's worst-shuffle load in units of ``N``."""
    old = np.repeat(np.arange(num_workers), batch_points(num_workers, storage))
    moves = shuffle_matrix(old, cyclic_shuffle(old, num_workers), num_workers)
    return decentralized_load(moves, storage) / old.size


def worst_found(num_workers: int, storage: int) -> tuple[str, float, float]:
    """The structured shuffle with the largest closed-form load, that load and the uncoded
    exchange's on the same shuffle (every missing piece sent once), in units of ``N``."""
    old = np.repeat(np.arange(num_workers), batch_points(num_workers, storage))

    def load(new: np.ndarray) -> float:
        return decentralized_load(shuffle_matrix(old, new, num_workers), storage) / old.size

    def bound(new: np.ndarray) -> float:
        return load_before_paths(shuffle_matrix(old, new, num_workers), storage) / old.size

    found, worst = worst_of(load, structured_shuffles(old, num_workers), bound)
    moved = np.count_nonzero(found.new != old) / old.size
    return found.name, worst, moved * (num_workers - storage) / (num_workers - 1)


def worst_row(pair: tuple[int, int]) -> str:
    """One row of the worst-shuffle table for ``(K, T)``."""
    k, t = pair
    name, load, uncoded = worst_found(k, t)
    conv = float(decentralized_converse(k, 1, t))
    return (
        f"| {k} | {t} | {name} | {load:.4f} | {conv:.4f} | {load / conv:.3f} | "
        f"{uncoded:.4f} | {worst_load(k, t) / conv:.3f} |"
    )


def worst_table(workers: range, storages: list[int] | None, jobs: int) -> Iterator[str]:
    """The worst-shuffle table's lines, rows in order, ``jobs`` rows searched at a time."""
    yield (
        "| K | T | worst shuffle found | load | converse | load / converse | uncoded "
        "| cyclic shift |"
    )
    yield "|---:|---:|---|---:|---:|---:|---:|---:|"
    pairs = [
        (k, t)
        for k in workers
        for t in range(2, k)
        if not storages or t in storages or t - k in storages
    ]
    if jobs == 1:
        yield from map(worst_row, pairs)
        return
    with multiprocessing.Pool(jobs) as pool:
        yield from pool.imap(worst_row, pairs)


def measured_load(num_workers: int, storage: int) -> float:
    """The load of 2 worst-shuffle epochs really delivered, in units of ``N``."""
    n = num_workers * batch_points(num_workers, storage)
    size = 8 * corner_splits(num_workers, storage)  # sub-points of 8 bytes, none padded
    ev = Evaluation("decentralized", num_workers, n, storage, 2, shuffle="cyclic", point_bytes=size)
    reports = list(run(ev))
    if not all(r.verified for r in reports):
        raise SystemExit(f"K={num_workers} T={storage}: a worker's bytes differ")
    return max(r.load_points for r in reports) / n


def table(max_workers: int, measure: int) -> list[str]:
    lines = [
        "| K | T | load | converse | load / converse | uncoded | centralized |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k in range(3, max_workers + 1):
        for t in range(2, k):
            load = worst_load(k, t)
            if k <= measure and abs(measured_load(k, t) - load) > 1e-9:
                raise SystemExit(f"K={k} T={t}: the plans' load differs from the closed form")
            conv = float(decentralized_converse(k, 1, t))
            central = float(em_worst_case(k, k, t)) / k
            lines.append(
                f"| {k} | {t} | {load:.4f} | {conv:.4f} | {load / conv:.3f} | "
                f"{(k - t) / (k - 1):.4f} | {central:.4f} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-workers", type=int, default=MAX_WORKERS)
    ap.add_argument("--min-workers", type=int, default=3)
    ap.add_argument("--measure", type=int, default=0, help="check plans up to this K")
    ap.add_argument("--shuffle", choices=("cyclic", "worst"), default="cyclic")
    ap.add_argument("--storages", type=int, nargs="*", help="worst: only these T (negative: K + T)")
    ap.add_argument("--jobs", type=int, default=1, help="worst: rows searched at a time")
    args = ap.parse_args(argv)
    if not 3 <= args.min_workers <= args.max_workers <= MAX_WORKERS:
        print(
            f"--min-workers {args.min_workers} / --max-workers {args.max_workers} out of range "
            f"3..{MAX_WORKERS} (min <= max)",
            file=sys.stderr,
        )
        return 2
    if args.jobs < 1:
        print(f"--jobs {args.jobs} out of range: at least 1", file=sys.stderr)
        return 2
    if args.shuffle == "worst":
        workers = range(args.min_workers, args.max_workers + 1)
        for line in worst_table(workers, args.storages, args.jobs):
            print(line, flush=True)
    else:
        print("\n".join(table(args.max_workers, args.measure)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
