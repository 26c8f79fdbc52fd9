"""What a coded shuffle does, as one frozen object that checks itself once
(:class:`ShuffleSettings`), and how a caller names each setting in its errors
(:class:`SettingNames`: the library's keyword arguments, the training job's Hydra keys).

``CodedShuffle`` takes the settings (or builds them from its keyword arguments); the training
job builds them from its typed config with :data:`JOB_NAMES`, so that both check the same
things the same way, once: a bad value is one :class:`~coded_shuffle.errors.UsageError`
naming the setting as the caller wrote it and its valid range.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from coded_shuffle.costs.wire import DEFAULT_CHUNK_BYTES
from coded_shuffle.distributed.transports import transport_class
from coded_shuffle.distributed.transports.base import LIBRARY_NAMES, SettingNames
from coded_shuffle.errors import UsageError
from coded_shuffle.math.policies import ShufflePolicy, check_placement
from coded_shuffle.math.schemes import REGISTRY, Scheme, get_scheme

DEFAULT_TIMEOUT = timedelta(seconds=60)
SCHEMES = tuple(sorted(REGISTRY))
# what each field must be, for the one line a value of another type gets
TYPES = {
    "scheme": "a scheme's name (coded-shuffle schemes)",
    "storage": "a number of batches, 1..K",
    "seed": "an integer",
    "shuffle": "full, partial or none",
    "fraction": "a number in (0, 1]",
    "placement": "random or by_label",
    "transport": "a transport's name (coded-shuffle transports)",
    "transport_options": "a mapping of the transport's options",
    "chunk_bytes": "an integer >= 1",
    "epochs": "an integer >= 1, or None",
    "drop_last": "True or False",
    "timeout": "seconds > 0, or a datetime.timedelta",
    "heartbeat": "seconds >= 0 (0: no watchdog)",
    "store_dir": "a directory (str or path), or None",
    "keep_batch": "True or False",
    "first_epoch": "an integer >= 1",
    "previous_workers": "an integer >= 1, or None",
    "stream": "True or False",
    "master_rank": "a rank of the job (an integer >= 0)",
    "prefetch": "True or False",
}
DEFAULT_HEARTBEAT_SECONDS = 1.0


@dataclass(frozen=True)
class ShuffleSettings:
    """Every setting of a coded shuffle (README: "Your own training loop"); checked when made.

    Parameters
    ----------
    scheme : a registered scheme (``coded-shuffle schemes``); ``"uncoded"`` for the baseline.
    storage : ``T``, what every worker stores, in batches (``1 <= T <= K``).
    seed : every epoch's assignment is drawn from ``(seed, epoch)`` on every rank.
    shuffle, fraction : the shuffle policy (``"full"``, ``"partial"`` with the share
        ``fraction`` in ``(0, 1]`` that every worker gives up each epoch, or ``"none"``).
    placement : the first assignment: ``"random"`` (from the seed) or ``"by_label"`` (dealt
        in label order, the items' last field: skewed shards).
    transport, transport_options : a registered transport (``coded-shuffle transports``) and
        its own options.
    chunk_bytes : the largest message payload on the link.
    epochs : the number of epochs, if known (the master then encodes epoch ``e + 1`` while the
        workers train on ``e``, and stops at the last).
    drop_last : drop the last ``N mod K`` items so that the workers divide ``N``.
    timeout : how soon a rank that died, was stopped or lost its link ends every rank (a
        ``timedelta``, or seconds).
    heartbeat : seconds between liveness heartbeats (``0``: no watchdog; then ``timeout``
        bounds the delivery's collectives).
    store_dir : where every rank keeps its large buffers and every worker its store, in
        memory-mapped files (persisted after every epoch, for :meth:`CodedShuffle.restore`);
        ``None``: in memory.
    keep_batch : with ``store_dir``, every worker also keeps its batch of the last delivered
        epoch there, so that a job restarted inside an epoch resumes without a new delivery
        (:meth:`CodedShuffle.resume_inside`).
    first_epoch, previous_workers : a job that goes on with another number of workers after
        epoch ``first_epoch - 1``: the placement is epoch ``first_epoch`` (its assignment drawn
        from ``(seed, first_epoch)`` for this ``K``), and with ``store_dir`` every worker that
        was one of the ``previous_workers`` offers the whole points its store held then, so
        that only the rest crosses the link.
    stream : an epoch not made ready ahead is encoded message by message while earlier
        messages travel (``False``: whole before the first byte).
    master_rank : the rank that holds the data set (the master); the workers are the others,
        in rank order (checked against the job's ranks when ``CodedShuffle`` starts).
    prefetch : with ``epochs`` known, epoch ``e + 1``'s delivery runs in the background as soon
        as epoch ``e``'s batch is handed out, while the loop trains on it (``False``: every
        epoch is delivered when it is asked for).
    names : how the caller names these settings in its errors.
    """

    scheme: str = "cycles"
    storage: float = 1.0
    seed: int = 0
    shuffle: str = "full"
    fraction: float = 1.0
    placement: str = "random"
    transport: str = "chain"
    transport_options: Mapping[str, Any] = field(default_factory=dict)
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    epochs: int | None = None
    drop_last: bool = True
    timeout: timedelta = DEFAULT_TIMEOUT
    heartbeat: float = DEFAULT_HEARTBEAT_SECONDS
    store_dir: Path | None = None
    keep_batch: bool = False
    first_epoch: int = 1
    previous_workers: int | None = None
    stream: bool = True
    master_rank: int = 0
    prefetch: bool = True
    names: SettingNames = field(default_factory=lambda: LIBRARY_NAMES, compare=False)

    def __post_init__(self) -> None:
        if self.store_dir is not None and isinstance(self.store_dir, str | os.PathLike):
            object.__setattr__(self, "store_dir", Path(os.fspath(self.store_dir)))
        if isinstance(self.timeout, int | float) and not isinstance(self.timeout, bool):
            object.__setattr__(self, "timeout", timedelta(seconds=float(self.timeout)))
        if self.transport_options is None or isinstance(self.transport_options, Mapping):
            object.__setattr__(self, "transport_options", dict(self.transport_options or {}))
        self.check()

    @property
    def policy(self) -> ShufflePolicy:
        return ShufflePolicy(self.shuffle, float(self.fraction))

    def check(self) -> None:
        """What can be checked without the job: :class:`UsageError` naming the first bad
        field as the caller names it, with its valid values."""
        self._check_types()
        n = self.names
        if self.scheme not in SCHEMES:
            raise UsageError(f"{n.scheme}={self.scheme!r} unknown; valid: {', '.join(SCHEMES)}")
        if not self.storage >= 1:
            raise UsageError(f"{n.storage}={self.storage:g} out of range (>= 1 and <= the workers)")
        self.policy.check(n.shuffle, n.fraction)
        check_placement(self.placement, n.placement)
        transport_class(self.transport, n).parse_options(None, self.transport_options, n)
        self._check_ranges()

    def _check_types(self) -> None:
        """Every field of the type it must have (a number where a number goes, ...)."""
        n = self.names
        for key, name, kinds in (
            ("scheme", n.scheme, str),
            ("storage", n.storage, int | float),
            ("seed", "seed", int),
            ("shuffle", n.shuffle, str),
            ("fraction", n.fraction, int | float),
            ("placement", n.placement, str),
            ("transport", n.transport, str),
            ("transport_options", "transport_options", dict),
            ("chunk_bytes", n.chunk_bytes, int),
            ("epochs", n.epochs, int | None),
            ("drop_last", "drop_last", bool),
            ("timeout", n.timeout, timedelta),
            ("heartbeat", n.heartbeat, int | float),
            ("store_dir", "store_dir", Path | None),
            ("keep_batch", "keep_batch", bool),
            ("first_epoch", "first_epoch", int),
            ("previous_workers", "previous_workers", int | None),
            ("stream", "stream", bool),
            ("master_rank", n.master_rank, int),
            ("prefetch", n.prefetch, bool),
        ):
            value = getattr(self, key)
            numeric = kinds in (int, int | float, int | None)
            if not isinstance(value, kinds) or (numeric and isinstance(value, bool)):
                raise UsageError(f"{name}={value!r}: {TYPES[key]}")

    def _check_ranges(self) -> None:
        """Every number in its range, and the fields that go together."""
        n = self.names
        if self.chunk_bytes < 1:
            raise UsageError(f"{n.chunk_bytes}={self.chunk_bytes} out of range (must be >= 1)")
        if self.epochs is not None and self.epochs < 1:
            raise UsageError(f"{n.epochs}={self.epochs} out of range (must be >= 1)")
        if self.timeout.total_seconds() <= 0:
            seconds = self.timeout.total_seconds()
            raise UsageError(f"{n.timeout}={seconds:g} out of range (seconds > 0)")
        if self.heartbeat < 0:
            raise UsageError(
                f"{n.heartbeat}={self.heartbeat} out of range (seconds >= 0; 0: no watchdog)"
            )
        if self.keep_batch and self.store_dir is None:
            raise UsageError("keep_batch=True needs a store_dir: the batch is kept there")
        last = self.epochs if self.epochs is not None else "epochs"
        beyond = self.epochs is not None and self.first_epoch > self.epochs
        if self.first_epoch < 1 or beyond:
            raise UsageError(f"first_epoch={self.first_epoch} out of range 1..{last}")
        if self.previous_workers is not None and self.previous_workers < 1:
            raise UsageError(f"previous_workers={self.previous_workers} out of range (>= 1)")
        if self.master_rank < 0:
            raise UsageError(f"{n.master_rank}={self.master_rank} out of range (a rank, >= 0)")

    def check_job(self, workers: int, points: int, point_bytes: int) -> Scheme:
        """What depends on the job: ``workers`` K, ``points`` N (already a multiple of K)
        of ``point_bytes`` each. Returns the scheme, ready to plan."""
        n = self.names
        scheme = get_scheme(self.scheme, point_bytes)
        if not 1 <= self.storage <= workers:
            raise UsageError(f"{n.storage}={self.storage:g} out of range 1..{workers} (workers)")
        scheme.check(points, workers, float(self.storage))
        scheme.check_point_bytes(workers, float(self.storage))
        cls = transport_class(self.transport, n)
        cls.parse_options(workers + 1, self.transport_options, n)
        t, s = n.transport, n.scheme
        if cls.own_symbols and scheme.sender != "workers":
            raise UsageError(
                f"{t}={self.transport} carries the symbols the workers send themselves; "
                f"{s}={scheme.name} is sent by the master: use {s}=decentralized, or {t}=p2p "
                "for an uncoded exchange between the workers"
            )
        if cls.routing != "broadcast" and scheme.coded and not cls.own_symbols:
            raise UsageError(
                f"{t}={self.transport} carries uncoded deliveries only (each row to one worker); "
                f"{s}={scheme.name} is coded: use {s}=uncoded, or {t}=chain, multicast or tree"
                + (", or peer-unicast" if scheme.sender == "workers" else "")
            )
        return scheme

    def replace(self, **changes: Any) -> ShuffleSettings:
        """These settings with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)
