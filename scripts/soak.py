"""A chaos soak: the training job on the emulated cluster for many epochs, with a fault drawn at
random every few epochs, under the launcher's restarts (docs/testing.md, "A long run with
faults at random").

    python scripts/soak.py --hosts 5 --rate 400mbit --epochs 30 --every 4 --seed 1 --out runs/soak

Faults (``--kinds``, default all): ``kill`` (a worker's host SIGKILLed, started again),
``stop`` (a worker's host SIGSTOPped: hung until healed), ``cut`` (a worker's link down until
healed), ``master`` (host 0 SIGKILLed, started again), ``lose`` (a worker's host gone for good:
the elastic launcher goes on without it), ``corrupt`` (a byte of a worker's store file
flipped), ``inside`` (a worker's host killed inside an epoch: the run resumes at its last step
checkpoint). The launcher restarts the job (``dist.max_restarts``); a cut or stopped host comes
back after ``HEAL_SECONDS`` (link up, processes killed and started again: a rebooted machine).
Where a host may be lost for good, the cluster is elastic (``--min-hosts``): there a cut or
stopped host is dropped at once and joins again when it comes back (two resizes). A fault the
launcher cannot recover from is recovered as an operator would: the same command again, on
the same run directory.

Writes ``OUT/soak.json``: each fault (``kind``, ``epoch``, ``host``, ``recovered``,
``seconds_lost``), the epochs run and verified, ``final_params_sha256`` beside
``unbroken_params_sha256`` (an unbroken run with the number of workers at the end; equal when
no host was lost for good) and ``leftover`` (namespaces and interfaces left: 0). Exits 0
when every fault was recovered, every epoch verified, the shas equal where they should be
and nothing is left. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coded_shuffle.distributed.fault_kinds import fault_kinds
from coded_shuffle.tools.records import metrics_path, read_metrics

# the cluster's fault kinds (the registry), and two of them at another place or time: ``kill``
# of host 0, and of a worker inside an epoch
VARIANTS = {"master": "kill", "inside": "kill"}
KINDS = (*fault_kinds("cluster"), *VARIANTS)
JOB = [
    "model.hidden=16",
    "dist.timeout_seconds=6",
    "dist.heartbeat_seconds=0.5",
    "dist.max_restarts=50",
    "job.checkpoint_steps=5",
    "debug.step_delay=0.01",  # an epoch long enough to be killed inside
]
INSIDE_DELAY = 0.3  # seconds after an epoch is recorded: inside the next one
HEAL_SECONDS = 10.0  # a cut or stopped host comes back (the watchdog's 6 s and some)
INVOCATIONS_MAX = 20


@dataclass
class Planned:
    """A fault of the soak: what, after which epoch, to which host (of the first cluster)."""

    kind: str
    epoch: int
    host: int
    fired: bool = False
    invocation: int | None = None
    recovered: bool = False
    seconds_lost: float | None = None


def draw(rng: random.Random, hosts: int, epochs: int, every: int, kinds: list[str]) -> list:
    """One fault every ``every`` epochs; a host lost for good is never drawn again, and at
    least two workers stay."""
    faults, alive = [], list(range(1, hosts))
    for epoch in range(every, epochs, every):
        allowed = [k for k in kinds if k != "lose" or len(alive) > 2]
        kind = rng.choice(allowed)
        host = 0 if kind == "master" else rng.choice(alive)
        if kind == "lose":
            alive.remove(host)
        faults.append(Planned(kind, epoch, host))
    return faults


def our_interfaces() -> set[str]:
    """The project's namespaces and ifb devices on this machine (``cs...``)."""
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = {line.split()[0] for line in spaces.splitlines() if line.startswith("cs")}
    names |= {ln.split(": ")[1].split("@")[0] for ln in links.splitlines() if ": cs" in ln}
    return names


def cluster_faults(
    pending: list[Planned], lost: list[int], done: int
) -> list[tuple[Planned, str, int, int]]:
    """The cluster's faults for those not fired yet: ``(fault, its cluster kind, host,
    epoch)``, hosts renumbered past the lost ones (a new cluster has only the others), none
    due before epoch ``done + 1``."""
    return [
        (
            f,
            VARIANTS.get(f.kind, f.kind),
            f.host - sum(h < f.host for h in lost),
            max(f.epoch, done + 1),
        )
        for f in pending
    ]


def cluster_args(faults: list[tuple[Planned, str, int, int]]) -> list[str]:
    """``--KIND HOST@eEPOCH`` (``+D`` for a kill inside the next epoch) for each fault."""
    args = []
    for f, kind, host, epoch in faults:
        delay = f"+{INSIDE_DELAY}" if f.kind == "inside" else ""
        args += [f"--{kind}", f"{host}@e{epoch}{delay}"]
    return args


def read_rows(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir) if metrics_path(run_dir).is_file() else []


def coded_shuffle() -> list[str]:
    exe = shutil.which("coded-shuffle")
    return [exe] if exe else [sys.executable, "-m", "coded_shuffle"]


def invoke(
    args: argparse.Namespace, pending: list[Planned], lost: list[int], n: int, elastic: bool
) -> int:
    """One run of the cluster command on the soak's run directory; marks what fired."""
    out, hosts = Path(args.out), args.hosts - len(lost)
    done = len(read_rows(out / "run"))
    argv = [*coded_shuffle(), "cluster", "--hosts", str(hosts), "--rate", args.rate]
    argv += ["--min-hosts", str(min(args.min_hosts, hosts))] if elastic else []
    argv += ["--grace", "15"]
    argv += ["--heal", str(HEAL_SECONDS), "--logs", str(out / f"hosts-{n}")]
    planned = cluster_faults(pending, lost, done)
    argv += cluster_args(planned)
    argv += ["--", f"epochs={args.epochs}", f"seed={args.seed}", *JOB]
    argv += [f"hydra.run.dir={out / 'run'}"]
    with open(out / f"cluster-{n}.log", "w") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT).returncode
    record = out / "run" / "cluster.json"
    if record.is_file():
        shutil.copy(record, out / f"cluster-{n}.json")
        fired = {
            (f["kind"], f["host"], f["after_epoch"])
            for f in json.loads(record.read_text())["faults"]
            if f["done_at"] is not None
        }
        for fault, kind, host, epoch in planned:
            if (kind, host, epoch) in fired:
                fault.fired, fault.invocation = True, n
                pending.remove(fault)
                if fault.kind == "lose":
                    lost.append(fault.host)
    return code


def assess(faults: list[Planned], rows: list[dict]) -> None:
    """A fault is recovered when every epoch after it was recorded and verified; the seconds
    it cost: the epoch after it took beyond the run's median epoch."""
    usual = statistics.median(r["epoch_seconds"] for r in rows) if rows else 0.0
    by_epoch = {r["epoch"]: r for r in rows}
    last = max(by_epoch, default=0)
    for f in faults:
        after = [by_epoch.get(e) for e in range(f.epoch + 1, last + 1)]
        f.recovered = (
            f.fired and bool(after) and all(r is not None and r["verified"] for r in after)
        )
        before, nxt = by_epoch.get(f.epoch), by_epoch.get(f.epoch + 1)
        if f.fired and before is not None and nxt is not None:
            gap = nxt["elapsed_seconds"] - before["elapsed_seconds"]
            f.seconds_lost = round(max(0.0, gap - usual), 2)


def unbroken_sha(args: argparse.Namespace, workers: int) -> str | None:
    """The final parameters of the same job on one machine, no fault, ``workers`` workers."""
    run_dir = Path(args.out) / "unbroken"
    exe = shutil.which("coded-shuffle-train")
    cmd = [exe] if exe else [sys.executable, "-m", "coded_shuffle_train.launch"]
    cmd += [f"workers={workers}", f"epochs={args.epochs}", f"seed={args.seed}", *JOB[:1]]
    cmd += [f"hydra.run.dir={run_dir}"]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        return None
    return json.loads((run_dir / "summary.json").read_text())["final_params_sha256"]


def table(report: dict) -> str:
    """The soak's faults by kind, as docs/testing.md shows them (markdown)."""
    lines = [
        "| fault | times | recovered | seconds lost (median) | seconds lost (max) |",
        "|---|---|---|---|---|",
    ]
    for kind in KINDS:
        mine = [f for f in report["faults"] if f["kind"] == kind]
        if not mine:
            continue
        lost = [f["seconds_lost"] for f in mine if f["seconds_lost"] is not None]
        median = f"{statistics.median(lost):.1f}" if lost else "-"
        most = f"{max(lost):.1f}" if lost else "-"
        recovered = sum(bool(f["recovered"]) for f in mine)
        lines.append(f"| `{kind}` | {len(mine)} | {recovered} | {median} | {most} |")
    return "\n".join(lines)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=5)
    p.add_argument("--rate", default="400mbit")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--every", type=int, default=4, help="a fault every N epochs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-hosts", type=int, default=3, help="the elastic cluster's minimum")
    p.add_argument("--kinds", default=",".join(KINDS), help="the faults to draw from")
    p.add_argument("--out", type=Path, help="the soak's folder (soak.json, the run, the logs)")
    p.add_argument("--table", type=Path, metavar="SOAK_JSON", help="print a soak's table, exit")
    args = p.parse_args()
    if args.table is None and args.out is None:
        p.error("--out DIR is required (or --table SOAK_JSON)")
    kinds = args.kinds.split(",")
    if bad := [k for k in kinds if k not in KINDS]:
        p.error(f"--kinds {','.join(bad)}: valid are {', '.join(KINDS)}")
    if args.hosts < 3 or args.every < 1 or args.epochs <= args.every:
        p.error(
            f"--hosts {args.hosts} (>= 3), --every {args.every} (>= 1) and --epochs "
            f"{args.epochs} (> --every)"
        )
    args.kind_list = kinds
    return args


def main() -> int:
    args = parse()
    if args.table is not None:
        print(table(json.loads(args.table.read_text())))
        return 0
    out = Path(args.out)
    if (out / "run").exists():
        print(f"soak: {out / 'run'} exists: use another --out", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    before = our_interfaces()
    faults = draw(random.Random(args.seed), args.hosts, args.epochs, args.every, args.kind_list)
    print("soak: faults " + ", ".join(f"{f.kind}@e{f.epoch}/h{f.host}" for f in faults))
    elastic = any(f.kind == "lose" for f in faults)
    pending, lost, t0, n = list(faults), [], time.monotonic(), 0
    while n < INVOCATIONS_MAX:
        n += 1
        code = invoke(args, pending, lost, n, elastic)
        rows = read_rows(out / "run")
        print(f"soak: run {n} exit {code}, {len(rows)} of {args.epochs} epochs recorded")
        if len(rows) == args.epochs and (out / "run" / "summary.json").is_file():
            break  # (a host that came back after the end may still have failed to rejoin)
    rows = read_rows(out / "run")
    assess(faults, rows)
    summary = json.loads((out / "run" / "summary.json").read_text())
    workers = summary["workers"]
    unbroken = unbroken_sha(args, workers)
    left = sorted(our_interfaces() - before)
    report = {
        "seed": args.seed,
        "hosts": args.hosts,
        "rate": args.rate,
        "epochs": args.epochs,
        "every": args.every,
        "faults": [asdict(f) for f in faults],
        "epochs_run": len(rows),
        "epochs_verified": sum(bool(r["verified"]) for r in rows),
        "invocations": n,
        "elastic": elastic,
        "hosts_lost": len(lost),
        "workers_at_end": workers,
        "final_params_sha256": summary["final_params_sha256"],
        "unbroken_params_sha256": unbroken,
        "leftover": len(left),
        "leftover_names": left,
        "shas_compared": not lost,
        "wall_seconds": round(time.monotonic() - t0, 1),
    }
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    print(table(report))
    shas_ok = bool(lost) or report["final_params_sha256"] == unbroken
    ok = (
        all(f.recovered for f in faults)
        and report["epochs_verified"] == args.epochs == report["epochs_run"]
        and shas_ok
        and not left
    )
    for f in faults:
        print(
            f"  {f.kind:8s} after epoch {f.epoch:3d} host {f.host}: recovered {f.recovered}, "
            f"{f.seconds_lost} s lost (run {f.invocation})"
        )
    shas = "not compared (a host was lost)" if lost else "equal" if shas_ok else "differ"
    print(
        f"soak: {'ok' if ok else 'FAILED'}: {len(rows)} epochs, {report['epochs_verified']} "
        f"verified, shas {shas}, leftover {len(left)}, {report['wall_seconds']} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
