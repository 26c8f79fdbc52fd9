"""``coded-shuffle cluster``'s record (``cluster.json``): the machine's CPU, every NIC's and the
shared medium's counters before and after the run, and the transports' own counts."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coded_shuffle.tools.cluster.faults import Fault
from coded_shuffle.tools.cluster.netns import Cluster

# the columns of /proc/stat's "cpu" line (proc(5)), in USER_HZ ticks
PROC_STAT_FIELDS = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
    "guest",
    "guest_nice",
)


def machine_cpu_ticks(stat: Path = Path("/proc/stat")) -> dict[str, int]:
    """The machine's CPU time so far by kind (every core summed; empty where unreadable)."""
    try:
        line = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return {}
    return dict(zip(PROC_STAT_FIELDS, (int(v) for v in line[1:]), strict=False))


def machine_cpu_use(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Shares of the machine's CPU time between two samples: ``busy`` (all but idle and
    iowait; softirq, where the kernel's network stack runs, included), and its parts."""
    if not before or not after:
        return {}
    delta = {k: after[k] - before[k] for k in before if k in after}
    # guest time is already inside user and nice
    total = sum(v for k, v in delta.items() if not k.startswith("guest"))
    if total <= 0:
        return {}
    idle = delta.get("idle", 0) + delta.get("iowait", 0)
    return {
        "cores": os.cpu_count() or 1,
        "busy_share": (total - idle) / total,
        "user_share": (delta.get("user", 0) + delta.get("nice", 0)) / total,
        "system_share": delta.get("system", 0) / total,
        "softirq_share": (delta.get("softirq", 0) + delta.get("irq", 0)) / total,
    }


TRANSPORT_RECORD = {  # Cluster.transport_counters' keys -> cluster.json's per host
    "retransmits": "tcp_retransmitted_segments",
    "timeouts": "tcp_timeouts",
    "tx_drops": "queue_drops_sending",
    "rx_drops": "queue_drops_receiving",
    "loss_drops": "random_loss_drops",
}


@dataclass
class Counters:
    """The cluster's NIC and medium counters at one moment."""

    nics: list[dict[str, int]]
    medium: dict[str, int]
    transport: list[dict[str, int]]  # per host: TCP retransmits and timeouts, queue drops

    @classmethod
    def read(cls, cluster: Cluster) -> Counters:
        return cls(cluster.nic_counters(), cluster.medium_counters(), cluster.transport_counters())


def medium_record(cluster: Cluster, before: Counters, after: Counters) -> dict:
    """What ``cluster.json`` says of the medium: a switch, or the shared medium's rate and
    what crossed it (Ethernet frames: headers included)."""
    if cluster.medium != "shared":
        return {"kind": cluster.medium}
    return {
        "kind": "shared",
        "rate_bits": cluster.rate,
        "bytes": after.medium["tx_bytes"] - before.medium["tx_bytes"],
        "frames": after.medium["tx_packets"] - before.medium["tx_packets"],
        "queue_drops": after.medium["drops"] - before.medium["drops"],
    }


def write_record(
    path: Path,
    cluster: Cluster,
    before: Counters,
    after: Counters,
    results,
    wall: float,
    faults: Sequence[Fault] = (),
    cpu: dict[str, float] | None = None,
    min_hosts: int | None = None,
) -> None:
    hosts = []
    for i in range(cluster.hosts):
        hosts.append(
            {
                "host": i,
                "address": cluster.address(i),
                "rate_bits": cluster.host_rate(i),
                "loss": cluster.host_losses.get(i, 0.0),
                "processes": cluster.procs(i),
                "exit_code": results[i].code,
                "lost": results[i].lost,
                "nic_tx_bytes": after.nics[i]["tx_bytes"] - before.nics[i]["tx_bytes"],
                "nic_rx_bytes": after.nics[i]["rx_bytes"] - before.nics[i]["rx_bytes"],
                **{
                    name: after.transport[i][key] - before.transport[i][key]
                    for key, name in TRANSPORT_RECORD.items()
                },
            }
        )
    record = {
        "run_id": cluster.run_id,
        "mtu": cluster.mtu,
        "min_hosts": min_hosts,  # elastic nodes from this many up (None: fixed)
        "wall_seconds": wall,
        "medium": medium_record(cluster, before, after),
        "hosts": hosts,
        "faults": [f.record() for f in faults],
        "machine_cpu": cpu or {},
    }
    path.write_text(json.dumps(record, indent=2) + "\n")
