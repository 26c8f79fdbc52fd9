"""What every transport implements, and what it counts.

A transport moves *streams* of framed messages between the ranks of a torch.distributed job
(rank 0 is the master, ranks ``1..K`` the workers). Every rank derives the same streams from
the shared seed, so a receiver knows the size of every message before it arrives. Each
transport counts what crosses this rank's NIC (its host's egress and ingress, in message bytes:
framing headers and padding included; TCP, UDP and IP headers are not).

Routing (:attr:`Transport.routing`) says which streams a transport carries:

* ``"broadcast"``: one stream from the master to every worker; every worker hears every
  message (the papers' shared link), and keeps what its decoder needs.
* ``"master"``: one stream from the master to each worker with only that worker's rows.
* ``"peers"``: after the placement, streams between workers: every row comes from a worker
  that caches it (or, for a transport with ``own_symbols``, every coded symbol from the
  worker the plan names as its sender); the master sends nothing.
"""

from __future__ import annotations

import dataclasses
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, Literal

import torch
import torch.distributed as dist

from coded_shuffle.codec.buffers import IN_MEMORY, Buffers
from coded_shuffle.costs.model import Cost
from coded_shuffle.distributed.roles import Roles
from coded_shuffle.errors import UsageError

Routing = Literal["broadcast", "master", "peers"]
OnMessage = Callable[[int, int, torch.Tensor], None]
KeyName = Callable[[str], str]  # an option's key -> how the caller's errors name it


@dataclass(frozen=True)
class SettingNames:
    """How a caller names the settings of a coded shuffle in its errors: the library's
    keyword arguments (:data:`LIBRARY_NAMES`) or the training job's Hydra keys
    (:data:`JOB_NAMES`)."""

    transport: str = "transport"
    option: str = "transport_options[{key!r}]"  # formatted with {transport} and {key}
    scheme: str = "scheme"
    storage: str = "storage"
    shuffle: str = "shuffle"
    fraction: str = "fraction"
    placement: str = "placement"
    chunk_bytes: str = "chunk_bytes"
    epochs: str = "epochs"
    timeout: str = "timeout"
    heartbeat: str = "heartbeat"
    master_rank: str = "master_rank"
    prefetch: str = "prefetch"

    def of(self, transport: str) -> KeyName:
        return lambda key: self.option.format(transport=transport, key=key)


LIBRARY_NAMES = SettingNames()
JOB_NAMES = SettingNames(
    transport="dist.transport",
    option="dist.{transport}.{key}",
    fraction="shuffle.fraction",
    placement="data.placement",
    chunk_bytes="dist.chunk_bytes",
    timeout="dist.timeout_seconds",
    heartbeat="dist.heartbeat_seconds",
    master_rank="dist.master_rank",
    prefetch="dist.prefetch",
)


@dataclass
class NoOptions:
    """The options of a transport that takes none."""

    def check(self, world_size: int | None, name: KeyName) -> None:
        """Raises :class:`UsageError` naming the first bad option (``name(key)``); what depends
        on the job's ranks only where ``world_size`` is known."""
        del world_size, name


@dataclass(frozen=True)
class Stream:
    """Messages from rank ``src`` to ranks ``dsts``, of the given sizes, in order."""

    src: int
    dsts: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def total(self) -> int:
        return int(sum(self.sizes))


@dataclass
class HostBytes:
    """Bytes that crossed one host's NIC since the last reset (message bytes), and what this
    host turned away as not the job's."""

    egress: int = 0
    ingress: int = 0
    repairs: int = 0  # of the egress: datagrams sent again because a receiver missed them
    control: int = 0  # of the egress: the transport's own feedback messages
    parity: int = 0  # of the egress: parity datagrams (multicast), sent ahead of any loss
    foreign: int = 0  # datagrams dropped: another job's identifier, or not the master's address
    refused: int = 0  # connections closed: no hello, another job's, or not the rank's address

    def add(self, other: HostBytes) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass(frozen=True)
class Peer:
    """This rank's place in the job, as a transport needs it: ``rank`` is its *role* (0 the
    master, ``1..K`` the workers; :mod:`~coded_shuffle.distributed.roles`), and every call to
    another rank names it by :meth:`at`."""

    rank: int
    world_size: int
    timeout: timedelta
    group: Any = None  # the process group over all ranks (None: the default group)
    job: int = 0  # the job's identifier (:func:`job_identifier`): what strangers do not carry
    roles: Roles | None = None
    """Which rank plays which role; None given: rank = role (:class:`Roles` set at once)."""

    def __post_init__(self) -> None:
        if self.roles is None:
            object.__setattr__(self, "roles", Roles(0, self.world_size))

    @property
    def workers(self) -> tuple[int, ...]:
        return tuple(range(1, self.world_size))

    def at(self, role: int) -> int:
        """The rank (in :attr:`group`, over every rank in order) that plays ``role``."""
        return self.roles.rank(role)

    def label(self, role: int | None = None) -> str:
        """How messages name the rank that plays ``role`` (None: this one)."""
        return self.roles.label(self.at(self.rank if role is None else role))


def job_identifier(peer: Peer) -> int:
    """A random 64-bit identifier drawn by the master and handed to every rank of the peer's
    group (collective). Every datagram and every connection's hello carries it, so two jobs on
    one network, or a stranger, are told apart from the job's own."""
    drawn = torch.frombuffer(bytearray(os.urandom(8)), dtype=torch.uint8)
    dist.broadcast(drawn, src=peer.at(0), group=peer.group)
    return int.from_bytes(drawn.numpy().tobytes(), "little")


class Transport(ABC):
    """Moves streams of messages; counts this host's bytes (:attr:`counts`).

    Its settings are one dataclass, :attr:`Options` (defaults, documentation and checks in one
    place), which the training job's Hydra schema takes from the registry as ``dist.<name>``
    (``coded_shuffle_train.config.transport_fields``): a transport is its module and its
    registry entry."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    routing: ClassVar[Routing] = "broadcast"
    prunes: ClassVar[bool] = False
    """A broadcast that sends a message only towards workers that keep a row of it: its
    :meth:`exchange` takes ``keepers`` (at the master, ``message_keepers`` of each stream; at
    a worker, which of each stream's messages it keeps), and a worker may not hear a message
    it keeps no row of."""
    own_symbols: ClassVar[bool] = False
    """Under ``peers`` routing: the workers send the plan's coded symbols, each its own (a
    scheme the workers send, ``decentralized``), not uncoded rows."""
    shares_medium: ClassVar[bool] = False
    """Under ``peers`` routing: one stream per sender that every other rank hears (a shared
    medium; every rank passes every stream), not one per sender and receiver; a placement
    from the master is one broadcast stream."""
    Options: ClassVar[type] = NoOptions
    options_key: ClassVar[str | None] = None
    """The name its options go by (the job's ``dist.<key>``) where it shares another
    transport's mechanism and options; None: its own name."""
    cost: ClassVar[Cost] = Cost()
    """What a delivery over it costs (seconds, the master's bytes): ``predict`` and the run's
    model ask this, never the transport's name."""

    def __init__(self, peer: Peer, options: Any = None) -> None:
        self.peer = peer
        self.options = self.parse_options(peer.world_size, options)
        # whether exchange() takes framing.Parts and a ``targets`` keyword (where each
        # message's payload may be received in place), and carries its own integrity (no
        # payload digest): the ``socket`` plane
        self.zero_copy = getattr(self.options, "plane", "gloo") == "socket"
        self.counts = HostBytes()
        self.buffers: Buffers = IN_MEMORY  # where a transport's own large buffers go
        # the delivery runs behind a training loop (prefetched): a transport that paces its
        # own sending (multicast) leaves the loop's traffic part of the link
        self.background = False

    @classmethod
    def parse_options(
        cls, world_size: int | None, options: Any = None, names: SettingNames = LIBRARY_NAMES
    ) -> Any:
        """:attr:`Options` from a mapping (or as given), checked: :class:`UsageError` naming
        the first unknown or bad option the way the caller does (``names``)."""
        if not isinstance(options, cls.Options):
            given = dict(options or {})
            valid = [f.name for f in dataclasses.fields(cls.Options)]
            unknown = sorted(set(given) - set(valid))
            if unknown and not valid:
                raise UsageError(f"{names.transport}={cls.name} takes no options, got {unknown}")
            if unknown:
                raise UsageError(
                    f"{names.of(cls.options_key or cls.name)(unknown[0])} is not an option of "
                    f"{names.transport}={cls.name}; valid: {', '.join(valid)}"
                )
            options = cls.Options(**given)
        options.check(world_size, names.of(cls.options_key or cls.name))
        return options

    @classmethod
    def deliveries(cls) -> tuple[str, ...]:
        """What it carries: ``uncoded`` rows, the master's ``coded`` broadcast, or the workers'
        own ``decentralized`` symbols (:attr:`own_symbols`)."""
        if cls.own_symbols:
            return ("decentralized",)
        return ("uncoded", "coded") if cls.routing == "broadcast" else ("uncoded",)

    @classmethod
    def validate(cls, world_size: int, names: SettingNames = LIBRARY_NAMES, **options: Any) -> None:
        """Raises :class:`UsageError` for options this transport cannot use (before any
        process starts)."""
        cls.parse_options(world_size, options, names)

    @property
    def digests(self) -> bool:
        """Whether the link digests every message's payload (CRC-32, framed by the sender and
        checked where rows are kept): not where every byte on the way carries the network's
        own checksum (TCP's on the socket plane, UDP's on every datagram) and every delivered
        batch is checked against the master's SHA-256 anyway."""
        return not self.zero_copy

    def take_counts(self) -> HostBytes:
        """This host's bytes since the last call; counting starts again from zero."""
        done, self.counts = self.counts, HostBytes()
        return done

    @abstractmethod
    def exchange(
        self,
        streams: Sequence[Stream],
        outgoing: Mapping[int, Iterable[torch.Tensor]],
        on_message: OnMessage,
    ) -> None:
        """Sends this rank's streams and receives the streams addressed to it.

        ``outgoing[i]`` yields the messages of ``streams[i]`` when this rank is its source (it
        may be lazy: sending starts with the first one). ``on_message(i, j, buf)`` is called
        for message ``j`` of every stream ``i`` addressed to this rank, in order, as soon as
        it has arrived (so checks overlap with the transfer). Every rank passes the streams it
        takes part in, in the same order as the other ranks; under ``broadcast`` routing that
        is every stream.
        """

    def scratch_shapes(self, stream_bytes: int) -> list[tuple[int, int]]:
        """The ``(rows, width)`` rows this transport takes from :attr:`buffers` to send or
        receive one stream of ``stream_bytes`` framed bytes (none here: its messages land in
        the caller's rows or in recycled payloads), for :meth:`Buffers.prime`."""
        del stream_bytes
        return []

    def network_bytes(self, stream: Stream, keepers: Any) -> int | None:
        """The bytes ``stream`` puts on all links, by the transport's byte model, where it
        depends on who keeps what (``keepers``: ``message_keepers``); None where it has no
        such model."""
        del stream, keepers
        return None

    def check_streams(self, streams: Sequence[Stream]) -> None:
        """Raises ValueError for a stream this transport cannot carry."""
        for s in streams:
            if self.routing == "broadcast" and (s.src != 0 or s.dsts != self.peer.workers):
                raise ValueError(f"{self.name} carries streams from the master to every worker")
            if self.routing != "broadcast" and len(s.dsts) != 1 and not self.shares_medium:
                raise ValueError(f"{self.name} carries streams to one worker each")
            if self.routing == "master" and s.src != 0:
                raise ValueError(f"{self.name}: only the master sends")

    def settings(self) -> dict[str, Any]:
        """The effective settings (defaults resolved), recorded beside the metrics."""
        return dataclasses.asdict(self.options)

    def close(self) -> None:
        """Releases sockets and threads (idempotent)."""
        return None


def empty_messages(sizes: Sequence[int]) -> list[torch.Tensor]:
    """Fresh uint8 receive buffers of the given sizes."""
    return [torch.empty(n, dtype=torch.uint8) for n in sizes]
