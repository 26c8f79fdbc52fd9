"""What a delivery reports to the loop that asked for it (``CodedShuffle.report``), typed: the
master's :class:`DeliveryReport` (the ``metrics.jsonl`` keys of a delivery, docs/training.md,
"Outputs"), a worker's :class:`WorkerReport`, a restart's :class:`Restored`. Each is built in
one place and reads as the mapping of its keys (``report["broadcast_bytes"]``, ``{**report}``,
``dict(report)``), so a row of the job's records is the report's keys and the job's own."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import numpy as np

from coded_shuffle.distributed.reports import COUNTS, HostCpu, anon_bytes, cpu_per_gb
from coded_shuffle.distributed.transports import HostBytes

HANDED = ("wait_seconds", "prefetched")  # what handing an epoch out adds, the row's last keys


def flat() -> Any:
    """A field of a :class:`Report` that is a mapping whose keys stand in its place (as a
    nested report's do), not under the field's name."""
    return field(metadata={"flat": True})


@dataclass(frozen=True, kw_only=True, eq=False)
class Report(Mapping[str, Any]):
    """A typed report read as the mapping of its keys: each field under its name, a nested
    report's keys (or a :func:`flat` field's) in its place, a field that is ``None`` left
    out, :data:`HANDED` last (a key already there keeps its place and takes the later
    value). Equal to any mapping with the same keys and values (a ``dict`` included)."""

    wait_seconds: float | None = None  # how long the loop waited for the epoch when it asked
    prefetched: bool | None = None  # whether its delivery ran behind the loop

    @cached_property
    def row(self) -> dict[str, Any]:
        """The report's keys and values, in order (computed once: the report is frozen)."""
        out: dict[str, Any] = {}
        ordered = [f for f in fields(self) if f.name not in HANDED]
        ordered += [f for f in fields(self) if f.name in HANDED]
        for f in ordered:
            value = getattr(self, f.name)
            if isinstance(value, Report) or f.metadata.get("flat"):
                out.update(value)
            elif value is not None:
                out[f.name] = value
        return out

    def __getitem__(self, key: str) -> Any:
        return self.row[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.row)

    def __len__(self) -> int:
        return len(self.row)


@dataclass(frozen=True, kw_only=True, eq=False)
class HostTraffic(Report):
    """Every host's bytes and CPU seconds in one delivery (rank 0 first) and their summaries."""

    transport: str
    master_egress_bytes: int
    host_egress_bytes_max: int
    host_ingress_bytes_max: int
    network_bytes: int
    repair_bytes: int
    control_bytes: int
    parity_bytes: int
    foreign_datagrams: int
    refused_connections: int
    host_egress_bytes: list[int]
    host_ingress_bytes: list[int]
    host_cpu_seconds: list[float]
    host_cpu_system_seconds: list[float]
    cpu_seconds_per_gb_max: float
    host_anon_bytes: list[int]

    @classmethod
    def of(cls, name: str, master: HostBytes, reports: np.ndarray, cpu: HostCpu) -> HostTraffic:
        """The master's own counts and CPU beside every worker's :data:`~.reports.REPORT`."""
        egress = [master.egress, *(int(v) for v in reports["egress"])]
        ingress = [master.ingress, *(int(v) for v in reports["ingress"])]
        user = [cpu.user, *(float(v) for v in reports["cpu_user_seconds"])]
        system = [cpu.system, *(float(v) for v in reports["cpu_system_seconds"])]
        busy = [u + s for u, s in zip(user, system, strict=True)]
        return cls(
            transport=name,
            master_egress_bytes=egress[0],
            host_egress_bytes_max=max(egress),
            host_ingress_bytes_max=max(ingress),
            network_bytes=sum(egress),
            repair_bytes=master.repairs + int(reports["repairs"].sum()),
            control_bytes=master.control + int(reports["control"].sum()),
            parity_bytes=master.parity + int(reports["parity"].sum()),
            foreign_datagrams=master.foreign + int(reports["foreign"].sum()),
            refused_connections=master.refused + int(reports["refused"].sum()),
            host_egress_bytes=egress,
            host_ingress_bytes=ingress,
            host_cpu_seconds=busy,
            host_cpu_system_seconds=system,
            cpu_seconds_per_gb_max=cpu_per_gb(busy, egress, ingress),
            host_anon_bytes=[anon_bytes(), *(int(v) for v in reports["anon_bytes"])],
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class DeliveryReport(Report):
    """The master's report of one epoch's delivery (docs/training.md, "Outputs", every key):
    what moved, what it would have cost uncoded, the bound, the seconds, the verification."""

    epoch: int
    phase: str  # "placement" or "coded"
    scheme: str
    workers: int
    storage: float
    storage_used: float
    shuffle: str
    fraction: float
    points: int
    point_bytes: int
    dropped_points: int
    broadcast_bytes: int
    payload_bytes: int
    header_bytes: int
    messages: int
    uncoded_bytes: int
    lower_bound_points: float
    lower_bound_exact: bool
    lower_bound_bytes: int
    load_points: float
    uncoded_points: float
    saved_percent: float
    hosts: HostTraffic  # its keys in its place
    network_bytes_model: int | None = None  # where the transport models its network bytes
    transport_settings: dict[str, Any]
    link_seconds: float
    delivery_seconds: float
    plan_seconds: float
    encode_seconds: float
    decode_seconds: float
    verified: bool
    stored_points_max: float
    worker_stored_bytes_max: int
    breakdown: dict[str, float]
    reused_points: int | None = None  # a placement after a change in the number of workers
    placement_transport: str | None = None  # the placement's: what carried it


@dataclass(frozen=True, kw_only=True, eq=False)
class WorkerReport(Report):
    """A worker's report of its side of a delivery: its batch's digest, its decode seconds,
    its store's bytes, its transport's bytes (:data:`~.reports.COUNTS`) and CPU seconds."""

    batch_sha256: str
    decode_seconds: float
    stored_bytes: int
    link_seconds: float
    cpu_seconds: float
    egress: int
    ingress: int
    repairs: int
    control: int
    parity: int
    foreign: int
    refused: int

    @classmethod
    def of(cls, record: np.ndarray, link_seconds: float) -> WorkerReport:
        """Read from the :data:`~.reports.REPORT` record the worker sends the master (one home
        for what it reports), with the seconds its link moved bytes."""
        r = record[0]
        return cls(
            batch_sha256=bytes(r["digest"]).hex(),
            decode_seconds=float(r["decode_seconds"]),
            stored_bytes=int(r["stored_bytes"]),
            link_seconds=link_seconds,
            cpu_seconds=float(r["cpu_user_seconds"] + r["cpu_system_seconds"]),
            **{key: int(r[key]) for key in COUNTS},
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class Restored(Report):
    """What a restart cost: after epoch ``resumed_after_epoch`` (``CodedShuffle.restore``) or
    inside epoch ``resumed_inside_epoch`` (``resume_inside``: the workers' kept batches too);
    the workers whose store (``replaced_workers``) or batch (``rebatched_workers``) was sent
    again, uncoded, and the bytes the master sent for them (headers included; 0 elsewhere)."""

    resumed_after_epoch: int | None = None
    resumed_inside_epoch: int | None = None
    replaced_workers: list[int]
    replacement_bytes: int
    rebatched_workers: list[int] | None = None
    rebatch_bytes: int | None = None
