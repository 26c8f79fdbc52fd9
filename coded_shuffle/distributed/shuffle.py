"""``CodedShuffle``: every epoch's data moved to the workers by a coded delivery, in any loop.

Created on every rank of a ``torch.distributed`` job (rank 0 = master, holding the data set;
ranks ``1..K`` = workers), told the epoch like ``DistributedSampler``. Epoch 1 is the placement
(every point sent once, uncoded); every later epoch plans the transition with the scheme,
proves it decodable (:mod:`~coded_shuffle.math.index_decoder`), encodes, moves the symbols
through the transport registry (:mod:`~coded_shuffle.distributed.transports`), decodes at every
worker with its own store only, and verifies: the master compares every worker's batch digest
with its own and raises :class:`~coded_shuffle.errors.VerificationError` on a difference.
Nothing but bytes,
one header per message and one report per worker per epoch crosses the network: every rank
derives the assignments and plans from the seed (:mod:`~coded_shuffle.distributed.epochs`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from coded_shuffle.codec import kernel
from coded_shuffle.codec.buffers import IN_MEMORY, FileBuffers
from coded_shuffle.codec.records import LocalBatch, RecordLayout, check_labels, item_labels
from coded_shuffle.costs.wire import DEFAULT_CHUNK_BYTES
from coded_shuffle.distributed.context import EpochContext, ShuffleSettings
from coded_shuffle.distributed.epochs import EpochChain, placement_points
from coded_shuffle.distributed.liveness import Heartbeat, Liveness, is_peer_loss
from coded_shuffle.distributed.master import MasterSide
from coded_shuffle.distributed.persistence import StorePersistence, rank_folder
from coded_shuffle.distributed.transports import (
    LIBRARY_NAMES,
    Link,
    Peer,
    SettingNames,
    build_transport,
    transport_class,
)
from coded_shuffle.distributed.worker import WorkerSide
from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import batches
from coded_shuffle.math.policies import ShufflePolicy, by_label_assignment, check_placement
from coded_shuffle.math.schemes import Scheme, get_scheme
from coded_shuffle.math.schemes.memory_sharing import storage_used

log = logging.getLogger("coded_shuffle")

DEFAULT_TIMEOUT = timedelta(seconds=60)
DEFAULT_HEARTBEAT_SECONDS = 1.0
# with a watchdog, collectives may wait for long work: it ends the job when a peer is lost
WATCHED_WAIT = timedelta(days=7)
_instances = itertools.count()  # every rank creates its CodedShuffles in the same order


def check_transport(
    name: str,
    scheme: Scheme,
    workers: int,
    options: Mapping[str, Any],
    names: SettingNames = LIBRARY_NAMES,
) -> None:
    """A known transport, valid options, and no coded scheme on a point-to-point transport
    (``names``: how the caller names the settings in its errors)."""
    cls = transport_class(name, names)
    cls.parse_options(workers + 1, options, names)
    if cls.routing != "broadcast" and scheme.coded:
        t, s = names.transport, "scheme"
        raise UsageError(
            f"{t}={name} carries uncoded deliveries only (each row to one worker); "
            f"{s}={scheme.name} is coded: use {s}=uncoded, or {t}=chain, multicast or tree"
        )


def log_progress(records: dict[int, Heartbeat], seconds: float) -> None:
    """The master's progress line during a long delivery (logger ``coded_shuffle``)."""
    me = records.get(0)
    if me is not None and me.detail:
        log.info(f"  ... {me.stage}: {me.detail} ({seconds:.0f} s)")


class CodedShuffle:
    """Coded delivery of every epoch's data (README: "Your own training loop").

    Parameters
    ----------
    dataset : map-style data set on rank 0 (items: tensors or tuples of tensors of fixed shapes
        and dtypes, e.g. ``TensorDataset``); ``None`` on every other rank.
    scheme : a registered scheme (``coded-shuffle schemes``); ``"uncoded"`` for the baseline.
    storage : ``T``, what every worker stores, in batches (``1 <= T <= K``).
    seed : every epoch's assignment is drawn from ``(seed, epoch)`` on every rank.
    shuffle : the shuffle policy: ``"full"`` (a uniformly random assignment every epoch),
        ``"partial"`` (every worker gives up a random ``fraction`` of its points, dealt to
        the workers at random) or ``"none"`` (the placement stays; 0 bytes after it).
    fraction : ``Q`` in ``(0, 1]``, the share ``"partial"`` moves (ignored otherwise).
    placement : the first assignment: ``"random"`` (drawn from the seed), or ``"by_label"``
        (the points dealt in order of their label, the items' last field, an integer scalar:
        skewed shards; the master sends every rank the assignment, ``8 N`` bytes).
    transport : a registered transport (``coded-shuffle transports``); ``transport_options``
        its own settings.
    chunk_bytes : the largest message payload on the link.
    epochs : the number of epochs, if known: the master then encodes epoch ``e + 1`` right
        after delivering ``e`` (while the workers train) and stops at the last.
    drop_last : drop the last ``N mod K`` items so that ``K`` workers divide ``N``
        (``False``: such an ``N`` is an error).
    timeout : how soon a rank that died, was stopped or lost its link ends every rank, with
        one line naming it and its address (default 60 s). With ``heartbeat=0``: how long the
        delivery's collectives wait instead.
    heartbeat : seconds between the liveness heartbeats through the job's store (default 1;
        ``0``: no watchdog).
    liveness : an already running :class:`~coded_shuffle.distributed.liveness.Liveness` to
        use instead (the training jobs start theirs before their data set loads).
    on_progress : ``(bytes moved, bytes to move)`` after every message (progress lines; with
        ``unicast``'s ``socket`` plane the master calls it from its sender threads).
    store_dir : where every worker persists its store after each epoch (atomically, with a
        digest), so that :meth:`restore` can resume a restarted job; ``None``: in memory only.
    stream : an epoch the master did not make ready ahead (``epochs`` unknown) is encoded
        message by message while earlier messages are on the link (``False``: the whole
        epoch is encoded before the first byte is sent). Workers always decode as symbols
        arrive.

    Attributes
    ----------
    report : this epoch's delivery metrics (the ``metrics.jsonl`` keys of a delivery; on a
        worker: its own digest, decode time, stored bytes and host bytes).
    indices : (worker) the data set indices of the last batch, in order.
    workers_group : the workers' process group (gradient all-reduce, DDP).
    settings : what every rank agreed on (record layout, points, dropped points, workers,
        storage, seed).
    liveness : the watchdog (``None`` with ``heartbeat=0``); ``liveness.tick()`` in a long
        loop shows progress.
    """

    def __init__(
        self,
        dataset: Any | None,
        *,
        scheme: str = "cycles",
        storage: float = 1.0,
        seed: int = 0,
        shuffle: str = "full",
        fraction: float = 1.0,
        placement: str = "random",
        transport: str = "chain",
        transport_options: Mapping[str, Any] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        epochs: int | None = None,
        drop_last: bool = True,
        timeout: timedelta | None = None,
        heartbeat: float = DEFAULT_HEARTBEAT_SECONDS,
        liveness: Liveness | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        store_dir: str | os.PathLike[str] | None = None,
        stream: bool = True,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise UsageError("CodedShuffle needs torch.distributed: call init_process_group first")
        self.rank, world = dist.get_rank(), dist.get_world_size()
        if world < 2:
            raise UsageError(f"world size {world}: CodedShuffle needs a master and >= 1 worker")
        self.workers, self.epochs = world - 1, epochs
        if epochs is not None and epochs < 1:
            raise UsageError(f"epochs={epochs} out of range (must be >= 1)")
        self.policy = ShufflePolicy(shuffle, float(fraction))
        self.policy.check()
        check_placement(placement)
        self.placement = placement
        if heartbeat < 0:
            raise UsageError(f"heartbeat={heartbeat} out of range (seconds >= 0; 0: no watchdog)")
        deadline = timeout or DEFAULT_TIMEOUT
        if deadline.total_seconds() <= 0:
            raise UsageError(f"timeout={deadline} out of range (must be > 0)")
        # the codec's kernel loaded (compiled, on a fresh install) before any heartbeat can
        # be missed: the compiler holds the interpreter for a while
        kernel.warm()
        self.liveness, self._owns_liveness = liveness, False
        if liveness is None and heartbeat > 0:
            prefix = (
                f"coded-shuffle/live/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
                f"/cs{next(_instances)}"
            )
            on_line = log_progress if self.rank == 0 else None
            self.liveness = Liveness.for_default_group(
                deadline, heartbeat, prefix, on_progress=on_line, watch_progress=False
            ).start()
            self._owns_liveness = True
        try:
            wait = WATCHED_WAIT if self.liveness is not None else deadline
            options = dict(transport_options or {})
            layout, num_points, dropped = self._describe(dataset, drop_last, placement)
            self.settings = ShuffleSettings(
                layout, num_points, dropped, self.workers, storage, seed
            )
            self.scheme = get_scheme(scheme, layout.record_bytes)
            if not 1 <= storage <= self.workers:
                raise UsageError(f"storage={storage} out of range 1..{self.workers} (workers)")
            self.scheme.check(num_points, self.workers, storage)
            self.scheme.check_point_bytes(self.workers, storage)
            self.storage_used = storage_used(self.scheme, self.workers, storage)
            check_transport(transport, self.scheme, self.workers, options)
            self.workers_group = dist.new_group(list(range(1, world)), timeout=wait)
            dist.barrier()  # every worker joined its group before any rank can fail and leave
            peer = Peer(self.rank, world, wait)
            buffers = (
                IN_MEMORY if store_dir is None else FileBuffers(rank_folder(store_dir, self.rank))
            )
            self.link = Link(
                build_transport(transport, peer, options, buffers),
                chunk_bytes,
                self._progress(on_progress),
            )
            first = self._first_assignment(dataset, num_points) if placement == "by_label" else None
            self.chain = EpochChain(
                self.scheme, num_points, self.workers, storage, seed, self.policy, first
            )
            transitions = self.chain.transitions(epochs if epochs is not None else sys.maxsize)
            self._ctx = EpochContext(
                self.rank, self.settings, self.scheme, self.link, self.chain, transitions, epochs,
                self.storage_used,
            )  # fmt: skip
            self.report: dict[str, Any] = {}
            self.indices = np.zeros(0, dtype=np.int64)
            self._next = 1
            self._master: MasterSide | None = None
            self._worker: WorkerSide | None = None
            if self.rank == 0:
                records = layout.pack(dataset, num_points)
                self._master = MasterSide(self._ctx, records, stream)
            else:
                persistence = None
                if isinstance(buffers, FileBuffers):
                    persistence = StorePersistence(buffers, self.settings, self.scheme.name)
                self._worker = WorkerSide(self._ctx, persistence)
        except BaseException:
            if self._owns_liveness and self.liveness is not None:
                self.liveness.stop()  # a failed set-up leaves no watchdog behind
            raise

    def _progress(
        self, on_progress: Callable[[int, int], None] | None
    ) -> Callable[[int, int], None] | None:
        """Every message ticks the watchdog (progress it sees), then the caller's hook."""
        live = self.liveness
        if live is None:
            return on_progress

        def tick(done: int, total: int) -> None:
            live.tick(f"{done / 2**20:.1f} of {total / 2**20:.1f} MiB moved")
            if on_progress is not None:
                on_progress(done, total)

        return tick

    # -- the data set, from the master to every rank -----------------------------------------

    def _first_assignment(self, dataset: Any | None, num_points: int) -> np.ndarray:
        """``by_label``: the master deals its points in label order and sends every rank the
        assignment (control bytes, before the placement)."""
        first = torch.zeros(num_points, dtype=torch.int64)
        if self.rank == 0:
            labels = item_labels(dataset, num_points)
            first = torch.from_numpy(by_label_assignment(labels, self.workers))
        dist.broadcast(first, src=0)
        return first.numpy()

    def _describe(
        self, dataset: Any | None, drop_last: bool, placement: str = "random"
    ) -> tuple[RecordLayout, int, int]:
        """The master checks its data set and tells every rank its layout and size (or the
        error, so that every rank fails with the same line)."""
        message: list[Any] = [None]
        if self.rank == 0:
            try:
                message[0] = self._check_dataset(dataset, drop_last, placement)
            except UsageError as exc:
                message[0] = str(exc)
        elif dataset is not None:
            raise UsageError(f"rank {self.rank} passed a dataset: only rank 0 (the master) does")
        dist.broadcast_object_list(message, src=0)
        if isinstance(message[0], str):
            raise UsageError(message[0])
        layout, n, dropped = message[0]
        return RecordLayout.from_json(layout), int(n), int(dropped)

    def _check_dataset(
        self, dataset: Any | None, drop_last: bool, placement: str
    ) -> tuple[str, int, int]:
        if dataset is None:
            raise UsageError("rank 0 (the master) must pass the dataset to CodedShuffle")
        size = len(dataset)
        dropped = size % self.workers
        if dropped and not drop_last:
            raise UsageError(
                f"{size} items do not divide among {self.workers} workers: pass drop_last=True "
                f"or {size - dropped} items"
            )
        if size - dropped < self.workers:
            raise UsageError(
                f"{size} items for {self.workers} workers: every worker needs at least one"
            )
        layout = RecordLayout.of(dataset)
        if placement == "by_label":
            check_labels(layout)
        return layout.to_json(), size - dropped, dropped

    # -- the epoch ---------------------------------------------------------------------------

    def epoch(self, epoch: int) -> LocalBatch | None:
        """Delivers epoch ``epoch`` (1 = placement; epochs in order 1, 2, ...).

        Returns the worker's new batch as a data set (``None`` on the master); ``report``
        then holds the epoch's metrics.
        """
        if epoch != self._next:
            raise UsageError(f"epoch({epoch}): epochs are delivered in order, next is {self._next}")
        if self.epochs is not None and epoch > self.epochs:
            raise UsageError(f"epoch({epoch}) out of range 1..{self.epochs} (epochs=)")
        self._next += 1
        if self._owns_liveness and self.liveness is not None:
            self.liveness.mark(f"epoch {epoch} delivery")
        if self._master is not None:
            self.report = self._watched(self._master.epoch, epoch)
            return None
        assert self._worker is not None
        rows, assignment = self._watched(self._worker.epoch, epoch)
        self.report = self._worker.report
        self.indices = batches(assignment, self.workers)[self.rank - 1]
        return LocalBatch(rows, self.settings.layout, self.indices)

    @contextlib.contextmanager
    def watched(self) -> Iterator[None]:
        """A block of an own loop (its gradient all-reduce, say) whose collectives fail when
        a peer goes away: the watchdog then names the lost rank and ends this process, with
        the same one line on every rank, instead of each rank's own traceback."""
        try:
            yield
        except Exception as exc:
            if self.liveness is not None and is_peer_loss(exc):
                self.liveness.await_verdict(exc)
            raise

    def _watched(self, step: Callable[[int], Any], epoch: int) -> Any:
        with self.watched():
            return step(epoch)

    def close(self) -> None:
        """Stops the watchdog it started and releases the transport's sockets and threads."""
        if self._owns_liveness and self.liveness is not None:
            self.liveness.stop()
        self.link.transport.close()

    # -- resuming a restarted job ------------------------------------------------------------

    def restore(self, completed: int) -> dict[str, Any]:
        """Resumes after epoch ``completed`` (call on every rank, before any :meth:`epoch`).

        Every worker reloads its store of that epoch from ``store_dir`` and checks its digest;
        a worker whose store is missing or damaged gets the points its store holds again,
        uncoded (only those rows cross the link). Returns (and puts in ``report``)
        ``resumed_after_epoch``, ``replaced_workers`` and ``replacement_bytes`` (bytes the
        master sent, headers included), so a restart's cost is counted.
        """
        if self._next != 1:
            raise UsageError(f"restore({completed}) after epoch {self._next - 1}: call it first")
        if completed < 1 or (self.epochs is not None and completed > self.epochs):
            raise UsageError(f"restore({completed}) out of range 1..{self.epochs or 'epochs'}")
        side = self._master or self._worker
        assert side is not None
        state = side.advance(completed)
        loaded = self._worker.load(completed) if self._worker is not None else True
        intact = torch.tensor([int(loaded)])
        every = [torch.zeros_like(intact) for _ in range(self.workers + 1)]
        dist.all_gather(every, intact)
        broken = [k for k in range(self.workers) if not int(every[k + 1])]
        if broken and self._ctx.pending(completed):
            needs = {k: placement_points(self.scheme, state, k) for k in broken}
            side.replace(completed, needs, np.unique(np.concatenate(list(needs.values()))))
        counts, _ = self.link.take_counts()
        self._next = completed + 1
        self.report = {
            "resumed_after_epoch": completed,
            "replaced_workers": broken,
            "replacement_bytes": counts.egress if self.rank == 0 else 0,
        }
        return self.report
