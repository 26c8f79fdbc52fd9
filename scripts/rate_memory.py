"""Rate-memory curves with excess storage: formulas beside loads measured byte-exactly.

    python scripts/rate_memory.py --workers 6 --points 60 --epochs 3 --out rate_memory.png

Prints a table and writes a PNG: uncoded (E-M placement), the no-excess optimum, Attia-Tandon
structural invariant (Attia & Tandon 2019) as published (its Theorem 1 corner ``(1, N)`` at ``p =
0``, whose gap to the optimum is Theorem 3's ``K/(K-1)``) and with the project's ``p = 0``
delivery (``cycles``), Elmahdy-Mohajer (Elmahdy & Mohajer 2018; also the worst-case optimum under
uncoded placement, Theorem 5), and the loads of both schemes really planned, encoded, decoded
at every worker from its own store and compared with the master's bytes, on worst-case and
random shuffles at several T. The random-shuffle ordering cut-set bound of the E-M placement is
shown beside them.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import batch_size
from coded_shuffle.math.bounds import worst_case_optimum
from coded_shuffle.math.rate_memory import (
    at_corners,
    at_worst_case,
    em_worst_case,
    gap_to_optimum,
    uncoded_excess,
)
from coded_shuffle.tools.evaluate import Evaluation, run


@dataclass
class Measured:
    load: float  # mean load in points over the epochs
    bound: float  # mean ordering cut-set bound of the placement
    storage_bytes: int  # the most any worker stored, padding included
    verified: bool


def measure(
    name: str, k: int, n: int, storage: float, epochs: int, worst: bool, seed: int, b: int
) -> Measured:
    """Runs ``epochs`` transitions with ``coded-shuffle evaluate``'s engine (every worker
    decodes from its own store only) and averages them."""
    shuffle = "worst" if worst else "random"
    reports = list(run(Evaluation(name, k, n, storage, epochs, seed, b, shuffle)))
    return Measured(
        load=float(np.mean([r.load_points for r in reports])),
        bound=float(np.mean([r.lower_bound_points for r in reports])),
        storage_bytes=max(r.stored_bytes_max for r in reports),
        verified=all(r.verified for r in reports),
    )


def default_point_bytes(k: int) -> int:
    """A multiple of every corner's split count, 32 bytes per sub-point or more at every corner.

    Whole-byte memory-sharing parts are then exact (no padding) and close to the ideal split.
    """
    splits = [math.comb(k, p) for p in range(k + 1)] + [math.comb(k - 1, t) for t in range(k)]
    lcm = math.lcm(*splits)
    return lcm * max(1, -(-32 * max(splits) // lcm))


def storage_grid(k: int, steps: int) -> list[float]:
    corners = sorted({float(t) for t in range(1, k + 1)} | {s for s, _ in at_corners(k, k)})
    extra = [x for x in np.linspace(1, k, steps) if min(abs(x - c) for c in corners) > 1e-3]
    return sorted(corners + extra)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", "-K", type=int, default=6)
    ap.add_argument("--points", "-N", type=int, default=60)
    ap.add_argument("--epochs", "-E", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--point-bytes", "-B", type=int, default=0, help="0: a multiple of all splits")
    ap.add_argument("--steps", type=int, default=11, help="evenly spaced T values besides corners")
    ap.add_argument("--out", type=Path, default=Path("rate_memory.png"))
    args = ap.parse_args(argv)
    try:
        k, n = args.workers, args.points
        batch_size(n, k)
        b = args.point_bytes or default_point_bytes(k)
        rows = run_table(k, n, args.epochs, args.seed, b, args.steps)
    except UsageError as exc:
        print(f"rate_memory: error: {exc}", file=sys.stderr)
        return 2
    plot(rows, k, n, b, args.out)
    print(f"wrote {args.out}")
    return 0 if all(r["verified"] for r in rows) else 1


def run_table(k: int, n: int, epochs: int, seed: int, b: int, steps: int = 7) -> list[dict]:
    head = (
        f"{'T':>6} {'uncoded':>8} {'AT paper':>8} {'AT':>7} {'AT worst':>8} {'AT rand':>8} "
        f"{'EM=opt':>7} "
        f"{'EM worst':>8} {'EM rand':>8} {'bound rand':>10} {'stored B max/budget':>20}"
    )
    print(f"K={k} N={n} point bytes={b} (loads in points; measured = planned, encoded, decoded)")
    print(head)
    rows = []
    for s in storage_grid(k, steps):
        at_w = measure("attia-tandon-excess", k, n, s, epochs, True, seed, b)
        at_r = measure("attia-tandon-excess", k, n, s, epochs, False, seed, b)
        em_w = measure("elmahdy-mohajer", k, n, s, epochs, True, seed, b)
        em_r = measure("elmahdy-mohajer", k, n, s, epochs, False, seed, b)
        row = {
            "T": s,
            "uncoded": uncoded_excess(k, n, s),
            "at_paper": float(at_worst_case(k, n, s, paper=True)),
            "at": float(at_worst_case(k, n, s)),
            "at_worst": at_w.load,
            "at_random": at_r.load,
            "em": float(em_worst_case(k, n, s)),
            "em_worst": em_w.load,
            "em_random": em_r.load,
            "bound_random": em_r.bound,
            "verified": all(m.verified for m in (at_w, at_r, em_w, em_r)),
        }
        most = max(m.storage_bytes for m in (at_w, at_r, em_w, em_r))
        budget = s * (n // k) * b
        rows.append(row)
        print(
            f"{s:6.3f} {row['uncoded']:8.2f} {row['at_paper']:8.3f} {row['at']:7.3f} "
            f"{at_w.load:8.3f} {at_r.load:8.3f} "
            f"{row['em']:7.3f} {em_w.load:8.3f} {em_r.load:8.3f} {em_r.bound:10.3f} "
            f"{most:>9}/{budget:<10.0f}{'' if row['verified'] else ' MISMATCH'}"
        )
    print(f"no-excess optimum (K-1)N/K = {worst_case_optimum(n, k):g} at T=1")
    paper, at_t = gap_to_optimum(k, n, paper=True)
    ours, ours_t = gap_to_optimum(k, n, paper=False)
    print(
        f"Attia & Tandon 2019 Theorem 3: A-T (paper) / worst-case optimum peaks at "
        f"{paper:.4f} at T = "
        f"{at_t:g} (K/(K-1) = {k / (k - 1):.4f}); with the project's p = 0 delivery "
        f"(cycles, q(K-1)) it peaks at {ours:.4f} at T = {ours_t:.3g}"
    )
    return rows


def plot(rows: list[dict], k: int, n: int, b: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = np.linspace(1, k, 200)
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    ax.plot(ts, uncoded_excess(k, n, ts), color="0.55", lw=1.5, label="uncoded (E-M placement)")
    ax.plot(
        ts,
        at_worst_case(k, n, ts, paper=True),
        color="tab:orange",
        lw=1.5,
        ls="--",
        label="Attia-Tandon as published (p = 0 corner (1, N)), worst case",
    )
    ax.plot(
        ts,
        at_worst_case(k, n, ts),
        color="tab:orange",
        lw=2,
        label="Attia-Tandon with the project's p = 0 delivery (cycles), worst case",
    )
    ax.plot(
        ts,
        em_worst_case(k, n, ts),
        color="tab:blue",
        lw=2,
        label="Elmahdy-Mohajer = worst-case optimum (uncoded placement)",
    )
    ax.scatter(
        [1],
        [worst_case_optimum(n, k)],
        marker="*",
        s=160,
        color="k",
        zorder=5,
        label="no-excess optimum (K-1)N/K",
    )
    t = [r["T"] for r in rows]
    measured = [  # (key, marker, hollow, colour, size, label)
        ("at_worst", "s", True, "tab:orange", 8, "A-T measured, worst shuffle"),
        ("at_random", "s", False, "tab:orange", 5, "A-T measured, random shuffles"),
        ("em_worst", "o", True, "tab:blue", 9, "E-M measured, worst shuffle"),
        ("em_random", "o", False, "tab:blue", 5, "E-M measured, random shuffles"),
        (
            "bound_random",
            "v",
            False,
            "tab:green",
            6,
            "ordering bound, random shuffles (E-M placement)",
        ),
    ]
    for key, marker, hollow, colour, size, label in measured:
        style = {"mfc": "none"} if hollow else {}
        ax.plot(t, [r[key] for r in rows], marker, color=colour, ms=size, label=label, **style)
    ax.set_xlabel("storage T per worker (batches of N/K points)")
    ax.set_ylabel("load on the shared link (points)")
    ax.set_title(f"Rate-memory trade-off, K={k}, N={n} ({b}-byte points, byte-exact decode)")
    ax.set_xlim(0.9, k + 0.1)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
