"""Sizes on the wire (no torch): message framing, TCP segments and IP-fragmented datagrams.

The transports frame and count with these functions; the cost model (:mod:`.model`) predicts
with the same ones.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import numpy as np

from coded_shuffle.errors import UsageError

# epoch u32, part u16, kind u16, first row u32, row count u32, row bytes u32, CRC-32 of payload
HEADER_FORMAT = "<IHHIIII"
HEADER_BYTES = struct.calcsize(HEADER_FORMAT)  # 24
DEFAULT_CHUNK_BYTES = 256 << 10

# the multicast datagram's header, its one definition: the sender packs it, the receivers
# read it (the compiled loop at the offsets derived from it: multicast/drain.py)
DGRAM_HEADER = np.dtype(
    [("job", "<u8"), ("stream", "<u4"), ("seq", "<u4"), ("round", "<u2"), ("flags", "<u2")]
)
DGRAM_HEADER_BYTES = DGRAM_HEADER.itemsize  # 20
IPV4_BYTES, UDP_BYTES = 20, 8  # headers: IPv4 (every fragment), UDP (once per datagram)
ETHERNET_HEADER_BYTES = 14  # what tc and the NIC counters count per frame
ETHERNET_WIRE_BYTES = 38  # on a real link: header 14, FCS 4, preamble 8, inter-frame gap 12
TCP_IP_BYTES = 52  # IPv4 20 + TCP 20 + timestamp option 12, per segment
REACH_DTYPE = np.dtype("<u4")  # a chain's reach table: one entry per message of a stream


def rows_per_message(row_bytes: int, chunk_bytes: int) -> int:
    """Rows in one message: as many as fit in ``chunk_bytes`` of payload (at least one)."""
    if chunk_bytes < 1:
        raise UsageError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    return max(1, chunk_bytes // max(row_bytes, 1))


def message_ranges(num_rows: int, row_bytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``(first, count)`` of every message that carries ``num_rows`` rows (none if zero)."""
    step = rows_per_message(row_bytes, chunk_bytes)
    return [(a, min(step, num_rows - a)) for a in range(0, num_rows, step)]


def message_sizes(num_rows: int, row_bytes: int, chunk_bytes: int) -> list[int]:
    """Wire bytes of every message of a stream of ``num_rows`` rows: header plus payload."""
    ranges = message_ranges(num_rows, row_bytes, chunk_bytes)
    return [HEADER_BYTES + count * row_bytes for _, count in ranges]


def message_keepers(
    needs: Sequence[np.ndarray], num_rows: int, row_bytes: int, chunk_bytes: int
) -> np.ndarray:
    """``(K, M)`` bools: worker ``k`` keeps a row of message ``j`` of the stream of
    ``num_rows`` rows (``needs[k]``: the stream rows it keeps)."""
    step = rows_per_message(row_bytes, chunk_bytes)
    out = np.zeros((len(needs), -(-num_rows // step)), dtype=bool)  # one column per message
    for k, need in enumerate(needs):
        out[k, np.asarray(need, dtype=np.int64) // step] = True
    return out


def chain_reach(keepers: np.ndarray, order: Sequence[int]) -> np.ndarray:
    """How far each message travels down a chain: the position (1..K) of the last worker in
    relay ``order`` (ranks ``1..K``) that keeps one of its rows, at least 1 (the master sends
    every message to the first worker; a relay forwards only what someone after it keeps).
    ``keepers``: :func:`message_keepers`."""
    position = np.zeros(keepers.shape[0], dtype=np.int64)
    position[np.asarray(order, dtype=np.int64) - 1] = np.arange(1, len(order) + 1)
    reach = np.where(keepers, position[:, None], 0).max(axis=0, initial=1)
    return reach.astype(REACH_DTYPE)


def chain_bytes(sizes: Sequence[int], reach: np.ndarray, workers: int) -> int:
    """Bytes on all the links of a chain of ``workers``: every message on as many links as it
    reaches, and the reach table (:data:`REACH_DTYPE` per message) on every link."""
    hops = int(np.dot(np.asarray(sizes, dtype=np.int64), reach.astype(np.int64)))
    return hops + workers * len(sizes) * REACH_DTYPE.itemsize


def framed_bytes(num_rows: int, row_bytes: int, chunk_bytes: int) -> int:
    """Bytes of ``num_rows`` rows as messages: payload plus one header per message (closed
    form: as many headers as messages)."""
    if num_rows <= 0:
        return 0
    return (
        num_rows * row_bytes
        + math.ceil(num_rows / rows_per_message(row_bytes, chunk_bytes)) * HEADER_BYTES
    )


def framed_parts_bytes(rows: list[int], row_bytes: list[int], chunk_bytes: int) -> int:
    """:func:`framed_bytes` summed over the parts of a delivery (one message stream each)."""
    return sum(framed_bytes(n, b, chunk_bytes) for n, b in zip(rows, row_bytes, strict=True))


def tcp_wire_bytes(payload: float, mtu: int, frame: int = ETHERNET_HEADER_BYTES) -> float:
    """Bytes a TCP stream of ``payload`` bytes puts on an Ethernet link: full segments of
    ``mtu - 52`` bytes, each with its TCP/IP headers and ``frame`` bytes of framing."""
    mss = mtu - TCP_IP_BYTES
    return payload + math.ceil(payload / mss) * (TCP_IP_BYTES + frame)


def wire_bytes(datagram: int, mtu: int, frame: int = ETHERNET_HEADER_BYTES) -> int:
    """Bytes a datagram of ``datagram`` UDP payload bytes puts on an Ethernet link.

    IPv4 fragments of at most ``mtu`` bytes, each with its own framing and IP header.
    """
    ip_payload = datagram + UDP_BYTES
    if ip_payload <= mtu - IPV4_BYTES:  # one frame: no fragment, whatever its length
        return ip_payload + frame + IPV4_BYTES
    per_fragment = (mtu - IPV4_BYTES) // 8 * 8  # fragment offsets count 8-byte units
    fragments = -(-ip_payload // per_fragment)
    return ip_payload + fragments * (frame + IPV4_BYTES)


def default_datagram_bytes(mtu: int) -> int:
    """One Ethernet frame's worth: no IP fragments (a lost frame loses one datagram, and the
    kernel neither cuts nor reassembles); ``multicast`` sends and reads them in batches."""
    return mtu - IPV4_BYTES - UDP_BYTES - DGRAM_HEADER_BYTES
