"""The ``coded-shuffle cluster`` command: arguments, the cluster's life, the exit status."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from coded_shuffle.costs.rates import format_rate, parse_rate
from coded_shuffle.distributed.fault_kinds import fault_kinds
from coded_shuffle.errors import UsageError
from coded_shuffle.tools.cluster.faults import Fault
from coded_shuffle.tools.cluster.netns import Cluster, check_privileges, sweep_stale
from coded_shuffle.tools.cluster.record import (
    Counters,
    machine_cpu_ticks,
    machine_cpu_use,
    write_record,
)
from coded_shuffle.tools.cluster.run import (
    JOB_MODULE,
    check_training_config,
    host_env,
    last_error,
    run_hosts,
    torchrun_argv,
    training_overrides,
)
from coded_shuffle.tools.records import metrics_path


def _interrupt(signum: int, frame: object) -> None:
    del frame
    raise KeyboardInterrupt(f"signal {signum}")


T = TypeVar("T")


def rate_of(key: str) -> Callable[[str], int]:
    """Bits/s of a rate given to ``key`` (one line naming it where it cannot be read)."""
    return lambda text: parse_rate(text, key)


def per_host(
    given: Sequence[str] | None, key: str, value: Callable[[str], T], what: str
) -> dict[int, T]:
    """``HOST=VALUE`` arguments (repeatable; ``what``: the value's name in the error) as a
    mapping; one line for a malformed one. The cluster's flags and ``predict --host-rate``."""
    out: dict[int, T] = {}
    for text in given or []:
        host, sep, raw = text.partition("=")
        if not sep or not host.isdigit():
            raise UsageError(f"{key} {text!r}: expected HOST={what}, e.g. {key} 2={what}")
        try:
            out[int(host)] = value(raw)
        except UsageError:
            raise
        except ValueError:
            kind = "whole number" if value is int else "number"
            raise UsageError(f"{key} {text!r}: {raw!r} is not a {kind}") from None
    return out


def check_elastic(min_hosts: int | None, hosts: int, faults: list[Fault]) -> int | None:
    """``--min-hosts`` checked against ``--hosts``; a ``--lose`` needs it and spares host 0
    (the rendezvous and the master)."""
    if min_hosts is not None and not 2 <= min_hosts <= hosts:
        raise UsageError(f"--min-hosts {min_hosts} out of range 2..{hosts} (--hosts)")
    for fault in faults:
        if fault.kind != "lose":
            continue
        if min_hosts is None:
            raise UsageError(
                f"--lose {fault.host}@...: a host gone for good needs an elastic cluster "
                "(--min-hosts M: the job goes on with the hosts that are left)"
            )
        if fault.host == 0:
            raise UsageError(
                "--lose 0@...: host 0 holds the rendezvous and the master; lose another host"
            )
    return min_hosts


def run_cluster_command(args: argparse.Namespace) -> int:
    """Builds the cluster, runs every host, removes the cluster; 0 when every host succeeded."""
    if args.cleanup:
        check_privileges()
        removed = sweep_stale()
        print(
            f"removed {len(removed)} stale cluster(s){': ' if removed else ''}{', '.join(removed)}"
        )
        return 0
    if args.hosts is None or args.rate is None:
        raise UsageError("cluster needs --hosts P and --rate RATE (e.g. --hosts 5 --rate 400mbit)")
    rate = parse_rate(args.rate, "--rate")
    master_rate = parse_rate(args.master_rate, "--master-rate") if args.master_rate else None
    cluster = Cluster(
        args.hosts,
        rate,
        master_rate,
        mtu=args.mtu,
        medium=args.medium,
        host_rates=per_host(args.host_rate, "--host-rate", rate_of("--host-rate"), "RATE"),
        host_procs=per_host(args.host_procs, "--host-procs", int, "N"),
        host_losses=per_host(args.host_loss, "--host-loss", float, "SHARE"),
    )
    faults = [
        Fault.parse(kind, text, args.hosts)
        for kind in fault_kinds("cluster")
        for text in getattr(args, kind, None) or []
    ]
    min_hosts = check_elastic(args.min_hosts, args.hosts, faults)
    if not args.dry_run:
        check_privileges()
    target, logs, record = what_runs(args, cluster, faults, min_hosts)
    if args.dry_run:
        print_dry_run(cluster, target, logs, record, min_hosts)
        return 0
    results = run_and_record(args, cluster, target, (logs, record), faults, min_hosts)
    failed = [r for r in results if r.code != 0 and not r.lost]
    if failed:
        first = failed[0]
        why = last_error(first.log)
        print(
            f"coded-shuffle cluster: error: host {first.host} failed (exit code {first.code})"
            f"{': ' + why if why else ''} (logs in {logs})",
            file=sys.stderr,
        )
        return 1
    return 0


def what_runs(
    args: argparse.Namespace, cluster: Cluster, faults: list[Fault], min_hosts: int | None
) -> tuple[list[str], Path, Path]:
    """The torchrun target (the training job with its overrides, or a script), where the
    hosts' logs and ``cluster.json`` go; each epoch fault told where the epochs show."""
    rest = list(args.args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if args.script is not None:
        if not args.script.is_file():
            raise UsageError(f"--script {str(args.script)!r} is not a file")
        logs = args.logs or Path(time.strftime(f"outputs/cluster-{cluster.run_id}-%Y%m%d-%H%M%S"))
        for fault in faults:
            fault.console = logs / "h0.log"  # eN: the script's N-th "epoch" line
        return [str(args.script), *rest], logs, logs / "cluster.json"
    overrides, run_dir = training_overrides(rest, cluster, elastic=min_hosts is not None)
    check_training_config(overrides)
    for fault in faults:
        fault.metrics = metrics_path(run_dir)
    return (
        ["-m", JOB_MODULE, *overrides],
        args.logs or run_dir / "hosts",
        run_dir / "cluster.json",
    )


def print_dry_run(
    cluster: Cluster, target: list[str], logs: Path, record: Path, min_hosts: int | None
) -> None:
    """What ``--dry-run`` prints: every host's command, the environment, the medium."""
    for i in range(cluster.hosts):
        argv = cluster.exec_argv(i, torchrun_argv(cluster, i, target, min_hosts=min_hosts))
        rate = format_rate(cluster.host_rate(i))
        loss = cluster.host_losses.get(i)
        rate += f", losing {loss:g} of what it receives" if loss else ""
        print(f"h{i} {cluster.address(i)} {rate}: {shlex.join(argv)}")
    print("environment: " + " ".join(f"{k}={v}" for k, v in host_env(min_hosts).items()))
    if cluster.medium == "shared":
        print(f"medium: shared, {format_rate(cluster.rate)} for every frame of every host")
    print(f"logs: {logs}; record: {record}")


def run_and_record(
    args: argparse.Namespace,
    cluster: Cluster,
    target: list[str],
    where: tuple[Path, Path],
    faults: list[Fault],
    min_hosts: int | None,
) -> list:
    """Builds the cluster, runs every host on it, writes ``cluster.json`` (``where``: the
    logs' folder and the record's path), removes the cluster on every exit path."""
    logs, record = where
    # Ctrl-C, SIGTERM and SIGHUP end the run and remove the cluster, whatever the process
    # inherited (a parent that ignores SIGINT passes that on to its children)
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, _interrupt) for s in stops}
    try:
        with cluster:
            before, ticks = Counters.read(cluster), machine_cpu_ticks()
            t0 = time.perf_counter()
            results = run_hosts(
                cluster,
                target,
                logs,
                grace=args.grace,
                faults=faults,
                min_hosts=min_hosts,
                heal=args.heal,
            )
            wall = time.perf_counter() - t0
            cpu = machine_cpu_use(ticks, machine_cpu_ticks())
            record.parent.mkdir(parents=True, exist_ok=True)
            after = Counters.read(cluster)
            write_record(record, cluster, before, after, results, wall, faults, cpu, min_hosts)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return results
