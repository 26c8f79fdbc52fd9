#!/usr/bin/env python3
"""Two training jobs at once on one emulated cluster: do they keep to themselves?

Builds one cluster (``--hosts``, ``--rate``; root needed), starts the training job twice on
every host at once (master ports 29500 and 29501, seeds 0 and 1), with the overrides after
``--`` given to both, and prints per job: every epoch verified, the datagrams its hosts
dropped as not its master's (``foreign_datagrams``) and the connections they refused
(``refused_connections``), summed over the epochs. With ``dist.multicast.group`` and ``port``
set to the same values for both, each job's workers hear the other's datagrams and drop them;
with the defaults (derived from each job's identifier) they hear nothing of each other.

    python scripts/two_jobs.py --hosts 3 --rate 400mbit -- dist.transport=multicast \
        dist.multicast.group=239.255.9.9 dist.multicast.port=12345
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

from coded_shuffle.costs.rates import parse_rate
from coded_shuffle.tools.cluster import netns, run
from coded_shuffle.tools.records import metrics_path, read_metrics


def one_job(cluster: netns.Cluster, j: int, overrides: list[str], out: Path, results: list) -> None:
    """Job ``j`` on every host, its master at port ``MASTER_PORT + j``, run in ``out / j``."""
    job = [*overrides, f"seed={j}", f"hydra.run.dir={out / str(j)}"]
    target, run_dir = run.training_overrides(job, cluster)
    hosts = run.run_hosts(
        cluster,
        ["-m", "coded_shuffle_train", *target],
        run_dir / "hosts",
        grace=10,
        port=run.MASTER_PORT + j,
    )
    results[j] = (hosts, run_dir)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--rate", default="400mbit")
    p.add_argument("overrides", nargs="*", help="the training job's overrides, for both jobs")
    args = p.parse_args()
    netns.check_privileges()
    results: list = [None, None]
    with (
        tempfile.TemporaryDirectory() as tmp,
        netns.Cluster(args.hosts, parse_rate(args.rate)) as c,
    ):
        threads = [
            threading.Thread(target=one_job, args=(c, j, args.overrides, Path(tmp), results))
            for j in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(f"two jobs at once on {args.hosts} hosts at {args.rate}: {' '.join(args.overrides)}")
        print("job  exit codes  epochs  verified  foreign datagrams  refused connections")
        failed = False
        for j, (hosts, run_dir) in enumerate(results):
            codes = [h.code for h in hosts]
            rows = read_metrics(run_dir) if metrics_path(run_dir).is_file() else []
            verified = bool(rows) and all(r["verified"] for r in rows)
            foreign = sum(r.get("foreign_datagrams", 0) for r in rows)
            refused = sum(r.get("refused_connections", 0) for r in rows)
            cells = f"{codes!s:>10}  {len(rows):>6}  {verified!s:>8}  {foreign:>17}"
            print(f"{j:>3}  {cells}  {refused:>19}")
            failed |= any(codes) or not verified
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
