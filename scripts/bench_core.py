"""Core benchmark: planning, proving, encoding and decoding speed, and loads, per scheme.

Prints one table. For every (K, N) it draws one random reshuffle and, per scheme:

* ``plan s``: the scheme's planning time; ``prove s``: the generic GF(2) decoder over all
  workers (``Delivery.prepare``);
* ``enc GB/s``: broadcast bytes the encoder produced per second;
* ``dec GB/s``: demanded bytes (the points every worker lacked) decoded per second, summed
  over all workers, each from its own store;
* ``xor GB/s``: the reference, ``out = a XOR b`` on two buffers of the data's size
  (``N x B`` bytes, preallocated output), measured in the same run just before;
* ``load/unc`` and ``load/LB``: load over the uncoded load and over the lower bound of
  Attia & Tandon 2016 Theorem 2 (``*``: exact bound, else local search).

Before each ``N``'s rows, one line measures the cause of the gap to raw XOR: the codec's
kernel (:mod:`coded_shuffle.codec.kernel`) computing ``N / 2`` rows ``a[i] ^ a[j]`` from the
``N x B`` data, with both rows read as runs (``run``), both gathered at ascending random rows
(``sorted``), one ascending and one random (``half``), both random (``random``), each over
raw XOR.

The data lie where the training job's master holds an in-memory data set: on huge pages
(:func:`coded_shuffle.codec.buffers.empty_rows`), as the workers' stores do.

Times are medians over ``--repeats`` runs. Every decoded batch is compared with the master's
bytes; a mismatch aborts the run.

``--threads T`` runs the codec's kernel on ``T`` cores (numba's threads; torch's for the raw
XOR); with ``T > 1`` the columns ``enc xT`` and ``dec xT`` give the speed-up over one thread,
measured in the same run, and the symbols of both runs are checked to be the same bytes.

    python scripts/bench_core.py                      # K = 4 8 16 32, N = 1e4 1e5 1e6
    python scripts/bench_core.py --workers 32 --points 1000000 --schemes cycles
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from coded_shuffle.codec import kernel
from coded_shuffle.codec.buffers import empty_rows
from coded_shuffle.distributed.delivery import Delivery, WorkerStore
from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import random_assignment, shuffle_matrix
from coded_shuffle.math.bounds import ordering_bound
from coded_shuffle.math.schemes import get_scheme
from coded_shuffle.math.warm import warm_planner

GB = 1e9


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def raw_xor_rate(num_bytes: int, repeats: int) -> float:
    """GB/s of ``out = a ^ b`` on two ``num_bytes`` buffers (64-bit lanes, warm output)."""
    lanes = -(-num_bytes // 8)
    a = torch.randint(-(2**62), 2**62, (lanes,), dtype=torch.int64)
    b = torch.randint(-(2**62), 2**62, (lanes,), dtype=torch.int64)
    out = torch.empty_like(a)
    torch.bitwise_xor(a, b, out=out)
    return num_bytes / median_seconds(lambda: torch.bitwise_xor(a, b, out=out), repeats) / GB


def pattern_rates(data: torch.Tensor, xor: float, repeats: int, seed: int) -> dict[str, float]:
    """The kernel's XOR of ``N / 2`` row pairs of ``data`` by access pattern, over ``xor``."""
    src = data.numpy()
    n = src.shape[0] // 2
    out = np.zeros((n, src.shape[1]), dtype=np.uint8)  # pages touched before timing
    rng = np.random.default_rng(seed)
    first, second = rng.permutation(src.shape[0])[:n], rng.permutation(src.shape[0])[:n]
    none = np.zeros(0, dtype=np.int64)
    cases = {
        "run": ((0, none), (n, none)),
        "sorted": ((-1, np.sort(first)), (-1, np.sort(second))),
        "half": ((-1, np.sort(first)), (-1, second)),
        "random": ((-1, first), (-1, second)),
    }
    rates = {}
    for name, ((a0, ia), (b0, ib)) in cases.items():

        def run(a0=a0, ia=ia, b0=b0, ib=ib) -> None:
            kernel.gather_xor(out, none, 0, src, ia, a0, src, ib, b0, kernel.XOR, n)

        rates[name] = out.nbytes / median_seconds(run, repeats) / GB / xor
    return rates


def bench_scheme(name, old, new, k, data, repeats) -> dict[str, float]:
    scheme = get_scheme(name)
    warm_planner(scheme, 1.0, k)  # compiled (or loaded from numba's cache) before the timing
    state = scheme.initial_state(old, k, 1)
    start = time.perf_counter()
    plan = scheme.plan(state, new)
    plan_s = time.perf_counter() - start
    start = time.perf_counter()
    delivery = Delivery.prepare(plan, data.shape[1])
    prove_s = time.perf_counter() - start
    symbols = delivery.encode(data)
    enc_s = median_seconds(lambda: delivery.encode(data), repeats)
    threads = kernel.threads()
    stores = [WorkerStore.from_master(data, delivery, w) for w in range(k)]
    for w in range(k):  # each worker compiles its own ops ahead (Delivery.prepare_worker)
        _ = [programs[w].ops for programs in delivery.programs]

    def decode_all() -> list[torch.Tensor]:
        return [delivery.decode(w, symbols, stores[w])[0] for w in range(k)]

    dec_s = median_seconds(decode_all, repeats)
    for w, batch in enumerate(decode_all()):
        if not torch.equal(batch, data[torch.from_numpy(plan.new_batches[w])]):
            raise SystemExit(f"{name}: worker {w} decoded wrong bytes")
    enc_1, dec_1 = enc_s, dec_s
    if threads > 1:  # the same work on one thread, for the speed-up
        kernel.set_threads(1)
        try:
            one = delivery.encode(data)
            if any(not torch.equal(x, y) for x, y in zip(one, symbols, strict=True)):
                raise SystemExit(f"{name}: {threads} threads encoded other bytes than one")
            enc_1 = median_seconds(lambda: delivery.encode(data), repeats)
            dec_1 = median_seconds(decode_all, repeats)
        finally:
            kernel.set_threads(threads)
    demanded = sum(plan.demands(w).size for w in range(k)) / plan.splits * data.shape[1]
    return {
        "plan_s": plan_s,
        "prove_s": prove_s,
        "enc": delivery.payload_bytes() / enc_s / GB,
        "dec": demanded / dec_s / GB,
        "enc_x": enc_1 / enc_s,
        "dec_x": dec_1 / dec_s,
        "load": plan.load_points,
        "uncoded": plan.uncoded_points,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--points", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--point-bytes", type=int, default=256)
    parser.add_argument("--schemes", nargs="+", default=["uncoded", "attia-tandon", "cycles"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="codec and torch threads (1: stable when shared)"
    )
    args = parser.parse_args(argv)
    try:
        for name in args.schemes:
            get_scheme(name)
        if args.point_bytes < 1 or args.repeats < 1:
            raise UsageError(
                f"--point-bytes ({args.point_bytes}) and --repeats ({args.repeats}) must be >= 1"
            )
        if min(args.workers) < 2:
            raise UsageError(f"--workers must be >= 2, got {min(args.workers)}")
        if args.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {args.threads}")
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    kernel.set_threads(args.threads)
    kernel.warm()  # loaded (or compiled) before any timing
    print(
        f"point bytes {args.point_bytes}, codec and torch threads {args.threads}, "
        f"median of {args.repeats}; N rounded down to a multiple of K"
    )
    header = (
        f"{'K':>3} {'N':>8} {'scheme':<13} {'plan s':>7} {'prove s':>7} {'enc GB/s':>8} "
        f"{'dec GB/s':>8} {'xor GB/s':>8} {'enc/xor':>7} {'dec/xor':>7} {'load/unc':>8} "
        f"{'load/LB':>8}"
        + (f" {f'enc x{args.threads}':>7} {f'dec x{args.threads}':>7}" if args.threads > 1 else "")
    )
    print(header)
    print("-" * len(header))
    for k in args.workers:
        for n in args.points:
            n -= n % k
            if n < k:
                continue
            rng = np.random.default_rng(args.seed)
            old, new = random_assignment(n, k, rng), random_assignment(n, k, rng)
            gen = torch.Generator().manual_seed(args.seed)
            data = empty_rows(n, args.point_bytes)
            data.copy_(torch.randint(0, 256, data.shape, dtype=torch.uint8, generator=gen))
            bound, exact, _ = ordering_bound(shuffle_matrix(old, new, k))
            xor = raw_xor_rate(n * args.point_bytes, args.repeats)
            pattern = pattern_rates(data, xor, args.repeats, args.seed)
            print(
                f"    kernel at N = {n}: "
                + ", ".join(f"{name} {rate:.2f}" for name, rate in pattern.items())
                + " of raw XOR"
            )
            for name in args.schemes:
                r = bench_scheme(name, old, new, k, data, args.repeats)
                mark = "*" if exact else " "
                print(
                    f"{k:>3} {n:>8} {name:<13} {r['plan_s']:>7.2f} {r['prove_s']:>7.2f} "
                    f"{r['enc']:>8.2f} {r['dec']:>8.2f} {xor:>8.2f} {r['enc'] / xor:>7.2f} "
                    f"{r['dec'] / xor:>7.2f} {r['load'] / r['uncoded']:>8.4f} "
                    f"{r['load'] / max(bound, 1):>7.4f}{mark}"
                    + (f" {r['enc_x']:>7.2f} {r['dec_x']:>7.2f}" if args.threads > 1 else ""),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
