"""What every worker tells the master after a delivery, and how the master checks it: the
batch digests (the delivery's verification) and every host's byte counts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from coded_shuffle.codec.programs import digest
from coded_shuffle.distributed.transports import HostBytes
from coded_shuffle.errors import VerificationError

DIGEST_BYTES = 32
# what every worker tells the master after each delivery
REPORT = np.dtype(
    [
        ("digest", "u1", DIGEST_BYTES),  # SHA-256 of the decoded batch
        ("decode_seconds", "<f8"),
        ("stored_bytes", "<i8"),
        ("egress", "<i8"),  # this host's bytes on the transport (HostBytes)
        ("ingress", "<i8"),
        ("repairs", "<i8"),
        ("control", "<i8"),
    ]
)
COUNTS = ("egress", "ingress", "repairs", "control")


def batch_digests(records: torch.Tensor, new_batches: Sequence[np.ndarray]) -> list[bytes]:
    """SHA-256 of every worker's new batch (its records in sorted point order)."""
    return [digest(records.index_select(0, torch.from_numpy(b))) for b in new_batches]


def verify_digests(epoch: int, reported: Sequence[bytes], expected: Sequence[bytes]) -> bool:
    """True when every worker's batch digest equals the master's; else VerificationError.

    A worker that decoded a wrong batch, or skipped its decode, reports a digest that differs
    from the master's.
    """
    if len(reported) != len(expected):
        raise VerificationError(
            f"epoch {epoch}: {len(reported)} reports for {len(expected)} workers"
        )
    for k, (mine, theirs) in enumerate(zip(reported, expected, strict=True)):
        if mine != theirs:
            raise VerificationError(
                f"epoch {epoch}: worker {k} decoded a batch with SHA-256 {mine.hex()[:16]}, "
                f"the master's is {theirs.hex()[:16]}"
            )
    return True


def host_metrics(name: str, master: HostBytes, reports: np.ndarray) -> dict[str, Any]:
    """Per-host byte counts of one epoch (rank 0 first) and their summaries."""
    egress = [master.egress, *(int(v) for v in reports["egress"])]
    ingress = [master.ingress, *(int(v) for v in reports["ingress"])]
    row = {
        "transport": name,
        "master_egress_bytes": egress[0],
        "host_egress_bytes_max": max(egress),
        "host_ingress_bytes_max": max(ingress),
        "network_bytes": sum(egress),
        "repair_bytes": master.repairs + int(reports["repairs"].sum()),
        "control_bytes": master.control + int(reports["control"].sum()),
        "host_egress_bytes": egress,
        "host_ingress_bytes": ingress,
    }
    if name == "tree":  # deprecated name of the same figure (README: "What the numbers mean")
        row["gloo_tree_bytes"] = row["network_bytes"]
    return row


def worker_report(
    batch: torch.Tensor, decode_seconds: float, stored_bytes: int, counts: HostBytes
) -> np.ndarray:
    """A worker's :data:`REPORT` of one delivery."""
    mine = np.zeros(1, dtype=REPORT)
    mine["digest"][0] = np.frombuffer(digest(batch), dtype=np.uint8)
    mine["decode_seconds"] = decode_seconds
    mine["stored_bytes"] = stored_bytes
    for key, value in zip(COUNTS, counts.as_list(), strict=True):
        mine[key] = value
    return mine


def gather_reports(mine: np.ndarray, rank: int, workers: int) -> np.ndarray | None:
    """Every worker's :data:`REPORT` at the master (``None`` elsewhere; the master passes an
    empty report of its own)."""
    buf = torch.from_numpy(np.frombuffer(mine.tobytes(), dtype=np.uint8).copy())
    if rank != 0:
        dist.gather(buf, dst=0)
        return None
    out = [torch.zeros_like(buf) for _ in range(workers + 1)]
    dist.gather(buf, gather_list=out, dst=0)
    return np.frombuffer(b"".join(t.numpy().tobytes() for t in out[1:]), dtype=REPORT)
