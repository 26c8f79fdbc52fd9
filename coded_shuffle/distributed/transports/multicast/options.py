"""``multicast``'s settings (one dataclass: defaults, documentation, checks) and the network
interface it sends and listens on."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

from coded_shuffle.costs.model import BACKGROUND_SHARE
from coded_shuffle.costs.rates import parse_rate
from coded_shuffle.distributed.transports.base import KeyName
from coded_shuffle.distributed.transports.multicast.lanes import SLOW_LANES
from coded_shuffle.errors import UsageError

# a receiver's socket buffer: seconds of the stream at a few hundred Mbit/s, so that a
# receiver slowed for a while (its first delivery's fresh pages) catches up instead of losing
# datagrams (64 MiB lost 453 of a 380 MB stream's datagrams at 400 Mbit/s, and the pace cut
# cost three epochs; docs/benchmarks.md)
RCVBUF_BYTES = 256 << 20
PORTS = (10000, 20000)  # derived ports: below Linux's ephemeral range and torch's 29500


class MulticastUnavailable(UsageError):
    """The host cannot send or receive IP multicast on the configured interface."""


def interface_of(name: str | None) -> tuple[int, int]:
    """``(ifindex, mtu)`` of the interface (0 and 1500 when unnamed: the kernel's choice)."""
    if not name:
        return 0, 1500
    try:
        index = socket.if_nametoindex(name)
    except OSError:
        raise MulticastUnavailable(
            f"multicast: network interface {name!r} does not exist on this host"
        ) from None
    try:
        mtu = int(Path(f"/sys/class/net/{name}/mtu").read_text())
    except OSError:
        mtu = 1500
    return index, mtu


def job_group(job: int) -> tuple[str, int]:
    """The group and port a job uses unless set: from its identifier, in the
    organisation-local scope 239.255.0.0/16 (RFC 2365), so two jobs on one network do not
    share a group by default."""
    x, y, p = (job >> 48) % 254 + 1, (job >> 32) % 254 + 1, job % (PORTS[1] - PORTS[0])
    return f"239.255.{x}.{y}", PORTS[0] + p


def mreqn(group: str, ifindex: int) -> bytes:
    """``struct ip_mreqn``: group, any local address, interface index."""
    return struct.pack("4s4si", socket.inet_aton(group), socket.inet_aton("0.0.0.0"), ifindex)


@dataclass
class MulticastOptions:
    """``dist.multicast`` / ``CodedShuffle(transport_options=...)`` of ``multicast``."""

    rate: str | None = field(default=None, metadata={"required": True})
    """Required: pacing on the wire, e.g. 380mbit (a little below the slowest NIC)."""
    master_rate: str | None = None
    """The master's pacing where it differs from the workers' (``peer-multicast``: the
    master places, the workers send the reshuffles); null: rate."""
    receiver_rates: list[str] | None = None
    """Each worker's pacing (worker 1 first), where some are slower than ``rate``: the master
    sends a slow worker only the datagrams it keeps, at its rate, the rest beside them at
    ``rate`` (:mod:`~.lanes`; on a network that snoops IGMP); null: every worker at ``rate``."""
    slow_lanes: int = SLOW_LANES
    """Lanes of slow workers, 0..4: where more workers are slower than ``rate``, those of
    nearest rates share one, which hears what any of them keeps at its slowest's pace
    (:func:`~.lanes.slow_lanes`); ``2 ** slow_lanes`` groups at most. 0: one group, paced for
    the slowest (a network that does not snoop IGMP floods every group to every port)."""
    group: str | None = None
    """IPv4 multicast group of the job; null: 239.255.x.y derived from the job's identifier."""
    port: int | None = None
    """UDP port of the job, 1..65535; null: 10000..19999 derived from the job's identifier."""
    datagram_bytes: int | None = None
    """Stream bytes per datagram, 512..65000; null: one frame (the MTU less 48 bytes)."""
    interface: str | None = None
    """Default: GLOO_SOCKET_IFNAME, else the kernel's route."""
    drop: float = 0.0
    """Debug: receivers discard this share of datagrams (repairs run), in [0, 1)."""
    grace_seconds: float = 0.02
    """After "round sent", how long a receiver drains its socket, >= 0."""
    parity_window: int = 2048
    """Datagrams per window of repair datagrams while receivers lose datagrams (as many
    repairs as the last stream's loss calls for, :mod:`~.parity`), 16..65536; 0: no parity."""
    rcvbuf_bytes: int = RCVBUF_BYTES
    """A receiver's socket buffer, 4096..1 GiB."""
    seed: int = 0
    """Which datagrams ``drop`` discards."""
    slow_seconds: float = 0.0
    """Debug: rank 1 sleeps this long after every datagram it reads, in [0, 0.1]."""
    background_share: float = BACKGROUND_SHARE
    """A delivery in the background (prefetched while the loop trains) is paced at this
    share of the pace, in (0, 1]: the rest of the link is left to the training's own traffic
    (its gradient all-reduce), which UDP would otherwise queue behind the stream."""

    def check(self, world_size: int | None, name: KeyName) -> None:
        if self.rate is None:
            raise UsageError(
                f"{name('rate')} is required with multicast: the master paces datagrams to it "
                "(e.g. 380mbit, a little below the slowest NIC)"
            )
        parse_rate(self.rate, name("rate"))
        if self.master_rate is not None:
            parse_rate(self.master_rate, name("master_rate"))
        self._check_receivers(world_size, name)
        if not 0 <= int(self.slow_lanes) <= SLOW_LANES:
            raise UsageError(f"{name('slow_lanes')}={self.slow_lanes} out of range 0..{SLOW_LANES}")
        try:
            first = int(socket.inet_aton(str(self.group))[0]) if self.group is not None else 239
        except OSError:
            first = 0
        if not 224 <= first <= 239:
            raise UsageError(f"{name('group')}={self.group!r} is not an IPv4 multicast address")
        if self.port is not None and not 1 <= int(self.port) <= 65535:
            raise UsageError(f"{name('port')}={self.port} out of range 1..65535")
        if self.datagram_bytes is not None and not 512 <= int(self.datagram_bytes) <= 65000:
            raise UsageError(
                f"{name('datagram_bytes')}={self.datagram_bytes} out of range 512..65000"
            )
        if not 0.0 <= float(self.drop) < 1.0:
            raise UsageError(f"{name('drop')}={self.drop} out of range [0, 1)")
        if float(self.grace_seconds) < 0:
            raise UsageError(f"{name('grace_seconds')}={self.grace_seconds} must be >= 0")
        if int(self.parity_window) != 0 and not 16 <= int(self.parity_window) <= 65536:
            raise UsageError(
                f"{name('parity_window')}={self.parity_window} out of range (0 or 16..65536)"
            )
        if not 4096 <= int(self.rcvbuf_bytes) <= 1 << 30:
            raise UsageError(f"{name('rcvbuf_bytes')}={self.rcvbuf_bytes} out of range 4096..2^30")
        if not 0.0 <= float(self.slow_seconds) <= 0.1:
            raise UsageError(f"{name('slow_seconds')}={self.slow_seconds} out of range [0, 0.1]")
        if not 0.0 < float(self.background_share) <= 1.0:
            raise UsageError(
                f"{name('background_share')}={self.background_share} out of range (0, 1]"
            )

    def _check_receivers(self, world_size: int | None, name: KeyName) -> None:
        if self.receiver_rates is None:
            return
        rates = list(self.receiver_rates)
        if world_size is not None and len(rates) != world_size - 1:
            raise UsageError(
                f"{name('receiver_rates')} has {len(rates)} rates, expected one per worker "
                f"({world_size - 1})"
            )
        for r in rates:
            parse_rate(r, name("receiver_rates"))
