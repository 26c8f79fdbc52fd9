"""``CodedShuffle``: every epoch's data moved to the workers by a coded delivery, in any loop.

Created on every rank of a ``torch.distributed`` job (the master, holding the data set, on
``master_rank``, rank 0 by default; the workers on the other ranks), told the epoch like
``DistributedSampler``. Epoch 1 is the placement (every point sent once, uncoded); every later
epoch plans the transition with the scheme, proves it decodable
(:mod:`~coded_shuffle.math.index_decoder`), encodes, moves the symbols through the transport
registry (:mod:`~coded_shuffle.distributed.transports`), decodes at every worker with its own
store only, and verifies: the master compares every worker's batch digest with its own and
raises :class:`~coded_shuffle.errors.VerificationError` on a difference. Nothing but bytes,
one header per message and one report per worker per epoch crosses the network: every rank
derives the assignments and plans from the seed (:mod:`~coded_shuffle.distributed.epochs`).
With ``epochs`` known, each epoch's delivery runs in the background while the loop trains on
the epoch before (:mod:`~coded_shuffle.distributed.prefetch`).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from coded_shuffle.codec import kernel
from coded_shuffle.codec.buffers import IN_MEMORY, Buffers, FileBuffers
from coded_shuffle.codec.records import LocalBatch
from coded_shuffle.distributed.context import DataShape, EpochContext
from coded_shuffle.distributed.dataset import EpochDataset, EpochSampler
from coded_shuffle.distributed.ddp import data_parallel, minibatch_order
from coded_shuffle.distributed.delivery_report import Report, Restored
from coded_shuffle.distributed.describe import describe, first_assignment
from coded_shuffle.distributed.epochs import EpochChain, placement_points
from coded_shuffle.distributed.launcher_env import attempt
from coded_shuffle.distributed.liveness import (
    WATCHED_WAIT,
    Heartbeat,
    Liveness,
    end_process,
    first_line,
    is_peer_loss,
)
from coded_shuffle.distributed.master import MasterSide
from coded_shuffle.distributed.persistence import StorePersistence, rank_folder
from coded_shuffle.distributed.prefetch import Ahead
from coded_shuffle.distributed.roles import Roles
from coded_shuffle.distributed.settings import ShuffleSettings
from coded_shuffle.distributed.transports import Link, Peer, build_transport
from coded_shuffle.distributed.worker import WorkerSide
from coded_shuffle.errors import UsageError
from coded_shuffle.math.assignment import batches
from coded_shuffle.math.schemes.memory_sharing import storage_used
from coded_shuffle.math.state import CacheState
from coded_shuffle.math.warm import counting_compiles, warm_planner

log = logging.getLogger("coded_shuffle")

_instances = itertools.count()  # every rank creates its CodedShuffles in the same order
_open: weakref.WeakSet[CodedShuffle] = weakref.WeakSet()  # made and not closed


@atexit.register
def _release_at_exit() -> None:
    """Releases what every ``CodedShuffle`` left open holds when the interpreter exits (its
    watchdog's threads, its transport's sockets and threads), with no collective: the
    process group may be gone already. An own loop that never closes it still exits 0."""
    for cs in list(_open):
        cs._release()


def log_progress(records: dict[int, Heartbeat], seconds: float) -> None:
    """The master's progress line during a long delivery (logger ``coded_shuffle``)."""
    me = records.get(0)
    if me is not None and me.detail:
        log.info(f"  ... {me.stage}: {me.detail} ({seconds:.0f} s)")


@dataclass(frozen=True)
class Delivered:
    """One epoch's delivery, as this rank's side made it (on the thread that made it)."""

    epoch: int
    report: Report
    assignment: np.ndarray
    rows: torch.Tensor | None  # a worker's new batch (records); None on the master


class CodedShuffle:
    """Coded delivery of every epoch's data (README: "Your own training loop").

    Parameters
    ----------
    dataset : map-style data set on the master's rank (items: tensors or tuples of tensors of
        fixed shapes and dtypes, e.g. ``TensorDataset``); ``None`` on every other rank.
    settings : a :class:`~coded_shuffle.distributed.settings.ShuffleSettings` (scheme, storage,
        seed, shuffle policy, placement, transport and its options, epochs, liveness, store
        directory, the master's rank, prefetch); or its fields as keyword arguments
        (``scheme="cycles", master_rank=4, ...``).
    liveness : an already running :class:`~coded_shuffle.distributed.liveness.Liveness` to
        use instead of starting one (the training jobs start theirs before their data loads).
    on_progress : ``(bytes moved, bytes to move)`` after every message (progress lines; with
        ``unicast``'s ``socket`` plane the master calls it from its sender threads).

    Attributes
    ----------
    settings : the :class:`ShuffleSettings` in force.
    shape : what every rank agreed on: record layout, points, dropped points, workers.
    roles : which rank is the master (:class:`~coded_shuffle.distributed.roles.Roles`).
    is_master, worker : whether this rank is the master; else its worker index (0-based).
    report : the last epoch's report (:mod:`~coded_shuffle.distributed.delivery_report`), a
        mapping of its keys: on the master a ``DeliveryReport`` (the ``metrics.jsonl`` keys
        of a delivery), on a worker a ``WorkerReport`` (its own digest, decode time, stored
        bytes and host bytes), with ``wait_seconds``: how long this rank waited for it when
        it asked; after a restart, a ``Restored`` (what it sent again).
    indices : (worker) the data set indices of the last batch, in order.
    assignment : every point's worker (0-based) in the last delivered or resumed epoch.
    workers_group : the workers' process group (gradient all-reduce, DDP: :meth:`ddp`).
    dataset, sampler : one data set for the whole run and the order to visit it in, for a
        ``DataLoader`` built once (:mod:`~coded_shuffle.distributed.dataset`).
    liveness : the watchdog (``None`` with ``heartbeat=0``); ``liveness.tick()`` in a long
        loop shows progress.

    With ``epochs`` known and ``prefetch`` on (the default), epoch ``e + 1``'s delivery runs
    in the background from the moment epoch ``e``'s batch is handed out: ``epoch(e + 1)`` (or
    ``set_epoch(e + 1)``) then returns as soon as it is done. The batch handed out stays
    readable, unchanged, until the next is asked for.

    ``close()`` (or leaving a ``with CodedShuffle(...) as cs:`` block) waits for a delivery
    still in the background, then stops the watchdog, the transport and the groups.
    """

    def __init__(
        self,
        dataset: Any | None,
        settings: ShuffleSettings | None = None,
        *,
        liveness: Liveness | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        **options: Any,
    ) -> None:
        if settings is not None and options:
            raise UsageError(f"pass settings or keyword options, not both (got {sorted(options)})")
        self.settings = settings if settings is not None else ShuffleSettings(**options)
        if not dist.is_available() or not dist.is_initialized():
            raise UsageError("CodedShuffle needs torch.distributed: call init_process_group first")
        self.rank, world = dist.get_rank(), dist.get_world_size()
        if world < 2:
            raise UsageError(f"world size {world}: CodedShuffle needs a master and >= 1 worker")
        self.roles = Roles(self.settings.master_rank, world)
        self.roles.check(self.settings.names.master_rank)
        self.role = self.roles.role(self.rank)
        self.is_master = self.role == 0
        self.worker = None if self.is_master else self.role - 1
        self.workers = world - 1
        # the codec's kernel loaded (compiled, on a fresh install) before any heartbeat can
        # be missed: the compiler holds the interpreter for a while
        kernel.warm()
        self.liveness, self._owns_liveness = self._watchdog(liveness)
        self._closed = False
        self._ahead: Ahead[Delivered] | None = None
        self._dataset: EpochDataset | None = None
        self._batch: LocalBatch | None = None
        self._epoch = 0  # the last epoch handed out
        try:
            self._wire(dataset, on_progress)
        except BaseException:
            if self._owns_liveness and self.liveness is not None:
                self.liveness.stop()  # a failed set-up leaves no watchdog behind
            raise
        _open.add(self)

    def _watchdog(self, given: Liveness | None) -> tuple[Liveness | None, bool]:
        """The given watchdog, or one started here (none with ``heartbeat=0``)."""
        s = self.settings
        if given is not None or s.heartbeat == 0:
            return given, False
        prefix = f"coded-shuffle/live/attempt{attempt()}/cs{next(_instances)}"
        on_line = log_progress if self.is_master else None
        live = Liveness.for_default_group(
            s.timeout,
            s.heartbeat,
            prefix,
            on_progress=on_line,
            watch_progress=False,
            master=self.roles.master,
        )
        return live.start(), True

    def _wire(self, dataset: Any | None, on_progress: Callable[[int, int], None] | None) -> None:
        """The data set described, the settings checked against it, the groups, the link,
        the epochs from the seed and this rank's side of every epoch."""
        s, roles = self.settings, self.roles
        wait = WATCHED_WAIT if self.liveness is not None else s.timeout
        self.shape: DataShape = describe(dataset, roles, s)
        self.scheme = s.check_job(self.workers, self.shape.num_points, self.record_bytes)
        with counting_compiles() as compiles:  # no plan holds a compile
            took = warm_planner(self.scheme, s.storage, self.workers)
        if compiles:
            log.info(
                f"compiled the {self.scheme.name} planner in {took:.1f} s (first use after "
                "an install; cached for the next)"
            )
        self.storage_used = storage_used(self.scheme, self.workers, s.storage)
        self.workers_group = dist.new_group(roles.worker_ranks(), timeout=wait)
        # the delivery's own group: its collectives never meet the loop's (a prefetch runs
        # beside the loop's gradient all-reduce and messages)
        self.delivery_group = dist.new_group(list(range(roles.world)), timeout=wait)
        dist.barrier()  # every worker joined its group before any rank can fail and leave
        buffers: Buffers = IN_MEMORY
        if s.store_dir is not None:
            buffers = FileBuffers(rank_folder(s.store_dir, self.role))
        by_label = s.placement == "by_label" and s.first_epoch == 1
        first = first_assignment(dataset, self.shape, roles) if by_label else None
        chain = EpochChain(
            self.scheme,
            self.shape.num_points,
            self.workers,
            s.storage,
            s.seed,
            s.policy,
            first,
            s.first_epoch,
        )
        transitions = chain.transitions(s.epochs if s.epochs is not None else sys.maxsize)
        peer = Peer(self.role, roles.world, wait, self.delivery_group, roles=roles)
        transport = build_transport(s.transport, peer, s.transport_options, buffers)
        placement = None
        if transport.routing == "broadcast" and self._placed_once(chain):
            placement = build_transport("unicast", transport.peer, None, buffers)
        self.link = Link(transport, s.chunk_bytes, self._progress(on_progress), placement)
        self._ctx = EpochContext(
            self.role,
            self.shape,
            s,
            self.scheme,
            self.link,
            chain,
            transitions,
            self.storage_used,
        )
        self.report: Report = Report()
        self.indices = np.zeros(0, dtype=np.int64)
        self.assignment = chain.first  # the last delivered (or resumed) epoch's
        self._next = s.first_epoch
        self._sides(dataset, buffers)

    def _sides(self, dataset: Any | None, buffers: Buffers) -> None:
        """This rank's side of every epoch: the master's (with the records) or a worker's."""
        self._master: MasterSide | None = None
        self._worker: WorkerSide | None = None
        if self.is_master:
            records = self.shape.layout.pack(dataset, self.shape.num_points)
            self._master = MasterSide(self._ctx, records, self.settings.stream)
            return
        persistence = None
        if isinstance(buffers, FileBuffers):
            persistence = StorePersistence(buffers, self._ctx)
        self._worker = WorkerSide(self._ctx, persistence)

    def _placed_once(self, chain: EpochChain) -> bool:
        """Whether the placement puts every point at one worker only: then ``unicast`` sends
        it in the same bytes as a broadcast, and no worker hears the others' points."""
        kept = (placement_points(self.scheme, chain.initial, k).size for k in range(self.workers))
        return sum(kept) == self.shape.num_points

    @property
    def record_bytes(self) -> int:
        return self.shape.layout.record_bytes

    @property
    def ready(self) -> bool:
        """Whether the next epoch can be handed out without waiting: no delivery runs in the
        background, or it is done."""
        return self._ahead is None or self._ahead.done

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

    # -- the epoch ---------------------------------------------------------------------------

    def epoch(self, epoch: int) -> LocalBatch | None:
        """Delivers epoch ``epoch`` (the first, 1 or ``first_epoch``, is the placement; epochs
        in order), or collects it from the background where it was prefetched, then starts
        the next one's delivery in the background (``prefetch``).

        Returns the worker's new batch as a data set (``None`` on the master); ``report``
        then holds the epoch's metrics.
        """
        if epoch != self._next:
            raise UsageError(f"epoch({epoch}): epochs are delivered in order, next is {self._next}")
        epochs = self.settings.epochs
        if epochs is not None and epoch > epochs:
            raise UsageError(f"epoch({epoch}) out of range 1..{epochs} (epochs=)")
        began = time.perf_counter()
        ahead, self._ahead = self._ahead, None
        with self.watched():
            got = ahead.result() if ahead is not None else self._deliver(epoch, False)
        self._next = epoch + 1
        batch = self._hand_out(got, time.perf_counter() - began, ahead is not None)
        self._prefetch(epoch)
        return batch

    def set_epoch(self, epoch: int) -> None:
        """:meth:`epoch` for a loop that reads :attr:`dataset` (as ``DistributedSampler``'s
        ``set_epoch``: every rank, before the epoch's loader is iterated)."""
        self.epoch(epoch)

    def _deliver(self, epoch: int, background: bool) -> Delivered:
        """Epoch ``epoch``'s delivery by this rank's side (in the foreground, or on the
        ``background`` thread of a prefetch)."""
        if self._owns_liveness and self.liveness is not None:
            self.liveness.mark(f"epoch {epoch} delivery")
        self.link.behind_training(background)
        if self._master is not None:
            report = self._master.epoch(epoch)
            return Delivered(epoch, report, self._master.assignment, None)
        assert self._worker is not None
        rows, assignment = self._worker.epoch(epoch)
        assert self._worker.report is not None
        return Delivered(epoch, self._worker.report, assignment, rows)

    def _hand_out(
        self, got: Delivered, waited: float | None, prefetched: bool | None
    ) -> LocalBatch | None:
        """The delivered epoch becomes the current one: its report (with how long the loop
        waited for it and whether it came from behind the loop; None: not a delivery the loop
        asked for), assignment, batch."""
        self.report = replace(got.report, wait_seconds=waited, prefetched=prefetched)
        self.assignment = got.assignment
        self._epoch = got.epoch
        batch = None
        if got.rows is not None and self.worker is not None:
            self.indices = batches(self.assignment, self.workers)[self.worker]
            batch = LocalBatch(got.rows, self.shape.layout, self.indices)
        self._batch = batch
        if self._dataset is not None:
            self._dataset.show(got.epoch, batch)
        return batch

    def _prefetch(self, epoch: int) -> None:
        """The next epoch's delivery started in the background (``prefetch``), where it will be
        asked for: only with ``epochs`` known, so that a delivery nobody asks for is never
        started."""
        epochs = self.settings.epochs
        if not self.settings.prefetch or epochs is None or epoch >= epochs:
            return
        following = epoch + 1
        self._ahead = Ahead(
            following, lambda: self._deliver(following, True), self._background_failed
        )

    def _background_failed(self, exc: BaseException, collecting: threading.Event) -> None:
        """A prefetched delivery failed (on its thread): the loop gets the job's timeout to come
        for it (it then raises the error where it asks for the epoch, as a delivery in the
        foreground does; a lost peer's watchdog names it and ends this process meanwhile);
        after that this process ends with the error's one line: the loop waits in something
        that cannot be interrupted (a collective with a rank that waits for it, say)."""
        limit = self.settings.timeout.total_seconds()
        if self.liveness is not None:  # the watchdog's verdict on a lost peer comes first
            limit += 4 * self.liveness.interval
        if self._closed or collecting.wait(limit) or self._closed:
            return
        end_process(self.roles.label(self.rank), first_line(exc), exc)

    # -- an own loop's pieces ----------------------------------------------------------------

    @property
    def dataset(self) -> EpochDataset:
        """The worker's batch of the epoch last handed out, as one ``torch`` data set for the
        whole run (empty on the master): build the ``DataLoader`` once, over it."""
        if self._dataset is None:
            self._dataset = EpochDataset(self.shape.layout, self.set_epoch)
            if self._epoch:
                self._dataset.show(self._epoch, self._batch)
        return self._dataset

    @property
    def sampler(self) -> EpochSampler:
        """The order the training job visits the worker's batch in (from the seed and the
        epoch), for the ``DataLoader`` over :attr:`dataset`; empty on the master."""
        return EpochSampler(self.order)

    def order(self) -> np.ndarray:
        """The positions of the current batch in the job's order (``cs.sampler``'s)."""
        if self.worker is None or not self._epoch:
            return np.zeros(0, dtype=np.int64)
        size = self.shape.num_points // self.workers
        return minibatch_order(self.settings.seed, self._epoch, self.worker, size)

    def ddp(self, model: torch.nn.Module, **options: Any) -> torch.nn.Module:
        """``model`` in DDP over :attr:`workers_group` on a worker, its gradients averaged
        in the model's parameter order (:func:`~coded_shuffle.distributed.ddp.data_parallel`:
        the same bits as the training job, and after a restart); on the master ``model``
        itself (it trains nothing). ``options`` go to DDP (``process_group=`` an NCCL group
        of the workers on GPUs)."""
        if self.is_master:
            return model
        group = options.pop("process_group", self.workers_group)
        device = next(model.parameters()).device
        return data_parallel(model, group, device, **options)

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

    def close(self) -> None:
        """Waits for a delivery still in the background (every rank started it), stops the
        watchdog it started, releases the transport's sockets and threads, and destroys the
        groups once every rank is done with them, so that a DDP wrapped around the workers'
        group may be freed whenever its owner lets it go (freed after the group's last
        reference, at exit, gloo's threads and the interpreter's lock could deadlock).
        Idempotent; while an exception unwinds, or once the process group is destroyed,
        only this rank's own parts are released (a ``CodedShuffle`` never closed is released
        so when the interpreter exits)."""
        if self._closed:
            return
        try:
            clean = sys.exc_info()[0] is None
            if clean and dist.is_initialized():  # every rank closes together
                with self.watched():
                    if self._ahead is not None:
                        self._ahead.result()  # a prefetch nobody asked for, done everywhere
                    dist.barrier()  # nobody uses the groups any more
                if not self.is_master:
                    dist.destroy_process_group(self.workers_group)
        finally:
            self._release()

    def _release(self) -> None:
        """This rank's own parts: the watchdog it started, the transport, the master's digest
        thread, the data set's published files (no collective)."""
        if self._closed:
            return
        self._closed = True
        _open.discard(self)
        if self._owns_liveness and self.liveness is not None:
            self.liveness.stop()
        self.link.close()
        if self._master is not None:
            self._master.close()
        if self._dataset is not None:
            self._dataset.close()

    def __enter__(self) -> CodedShuffle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- resuming a restarted job ------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds to resume this shuffle (torch's ``Stateful`` protocol, as
        torchtitan's trainer gathers its parts): ``epoch``, the last epoch handed out
        (``first_epoch - 1`` before the first), and every key that decides the batches
        (:meth:`~coded_shuffle.distributed.context.EpochContext.identity`, the stores' stamp
        too). The stores themselves live in ``store_dir``."""
        return {"epoch": self._next - 1, **self._ctx.identity()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes after ``state["epoch"]`` (:meth:`restore`; call on every rank before any
        :meth:`epoch`; nothing to do when no epoch was handed out). :class:`UsageError` naming
        the first key on which ``state`` differs from this shuffle's (another run's state: its
        batches would differ)."""
        mine = self.state_dict()
        for key in self._ctx.identity():
            if key not in state or state[key] != mine[key]:
                hint = ""
                if key == "workers":  # a resize: the next epoch places the data anew
                    hint = (
                        " (another number of workers goes on with first_epoch=, previous_workers=)"
                    )
                raise UsageError(
                    f"load_state_dict: {key}={mine[key]!r} but the state holds "
                    f"{state.get(key, 'nothing')!r}: it is another run's{hint}"
                )
        epoch = int(state["epoch"])
        if epoch >= self.settings.first_epoch:
            self.restore(epoch)

    def restore(self, completed: int) -> Restored:
        """Resumes after epoch ``completed`` (call on every rank, before any :meth:`epoch`).

        Every worker reloads its store of that epoch from ``store_dir`` and checks its digest;
        a worker whose store is missing or damaged gets the points its store holds again,
        uncoded (only those rows cross the link). Returns (and puts in ``report``)
        ``resumed_after_epoch``, ``replaced_workers`` and ``replacement_bytes`` (bytes the
        master sent, headers included), so a restart's cost is counted.
        """
        self.report, _ = self._restore(completed, "restore")
        return self.report

    def _restore(self, completed: int, name: str) -> tuple[Restored, CacheState]:
        """:meth:`restore`'s work; also the state after ``completed``."""
        first = self.settings.first_epoch
        if self._next != first or self._ahead is not None:
            raise UsageError(f"{name}({completed}) after epoch {self._next - 1}: call it first")
        epochs = self.settings.epochs
        if completed < first or (epochs is not None and completed > epochs):
            raise UsageError(f"{name}({completed}) out of range {first}..{epochs or 'epochs'}")
        side = self._master or self._worker
        assert side is not None
        state = side.advance(completed)
        self.assignment = state.assignment
        loaded = self._worker.load(completed) if self._worker is not None else True
        broken = self._every_worker_lacking(not loaded)
        if broken and self._ctx.pending(completed):
            needs = {k: placement_points(self.scheme, state, k) for k in broken}
            side.replace(completed, needs, np.unique(np.concatenate(list(needs.values()))))
        counts, _ = self.link.take_counts()
        self._next = completed + 1
        report = Restored(
            resumed_after_epoch=completed,
            replaced_workers=broken,
            replacement_bytes=counts.egress if self.is_master else 0,
        )
        return report, state

    def _every_worker_lacking(self, lacking: bool) -> list[int]:
        """The workers (0-based) that lack what they need, known to every rank (a collective
        of the delivery's group; the master lacks nothing)."""
        mine = torch.tensor([int(lacking and not self.is_master)])
        every = [torch.zeros_like(mine) for _ in range(self.workers + 1)]
        dist.all_gather(every, mine, group=self.delivery_group)
        flags = self.roles.by_role(every)[1:]
        return [k for k in range(self.workers) if int(flags[k])]

    def resume_inside(self, epoch: int) -> LocalBatch | None:
        """Resumes a job restarted inside ``epoch``, after its delivery (call on every rank,
        instead of :meth:`restore` and :meth:`epoch`; needs ``keep_batch``).

        The stores after ``epoch`` come back as :meth:`restore` brings them, and every
        worker's batch of ``epoch`` is the copy it kept, checked against its digest; a worker
        whose copy is missing or damaged gets its batch's points again, uncoded. Returns the
        worker's batch (``None`` on the master); ``report``: ``resumed_inside_epoch``,
        ``replaced_workers``, ``replacement_bytes``, ``rebatched_workers`` and
        ``rebatch_bytes`` (bytes the master sent, headers included).
        """
        if not self.settings.keep_batch:
            raise UsageError(f"resume_inside({epoch}) needs keep_batch=True (and a store_dir)")
        restored, state = self._restore(epoch, "resume_inside")
        rows = self._worker.kept_batch(epoch) if self._worker is not None else None
        missing = self._every_worker_lacking(rows is None)
        mine = batches(state.assignment, self.workers)
        if missing:
            needs = {k: mine[k] for k in missing}
            union = np.unique(np.concatenate(list(needs.values())))
            if self._master is not None:
                self._master.replace(epoch, needs, union)
            elif self._worker is not None:
                got = self._worker.receive_again(epoch, needs, union, store=False)
                rows = got if self.worker in needs else rows
        counts, _ = self.link.take_counts()
        report = replace(
            restored,
            resumed_after_epoch=None,
            resumed_inside_epoch=epoch,
            rebatched_workers=missing,
            rebatch_bytes=counts.egress if self.is_master else 0,
        )
        batch = self._hand_out(Delivered(epoch, report, state.assignment, rows), None, None)
        self._prefetch(epoch)  # the rest of the epoch trains while the next is delivered
        return batch
