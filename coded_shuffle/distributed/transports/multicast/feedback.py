"""``multicast``'s feedback over the process group, between a stream's sender and its
receivers: the sender's "round sent" (awaited in a thread), and the size of a receiver's
report of what it missed."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from coded_shuffle.distributed.transports.base import Peer

CONTROL_TAG = 0x6D63  # the master's "round sent"
UNION_TAG = 0x6D64  # the union of the workers' missing datagrams
REPORT_TAG = 0x6D65  # a receiver's report of what it missed, to the stream's sender


def feedback_bytes(n: int) -> int:
    """A worker's report of a round of ``n`` datagrams (and the union the master sends back):
    one bit per datagram, then a 4-byte count of the datagrams it lost or got late."""
    return -(-n // 8) + 4


class Arrival:
    """The sender's "round sent" message (the master's, or a worker's under ``peer-multicast``),
    awaited in a thread so that the caller can poll it.

    (gloo's receive completes only inside ``wait``, which releases the GIL.)
    """

    def __init__(self, peer: Peer, src: int = 0) -> None:
        self.flag = torch.zeros(1, dtype=torch.int32)
        self.work = dist.irecv(self.flag, peer.at(src), group=peer.group, tag=CONTROL_TAG)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        try:
            self.work.wait()
        except BaseException as exc:  # re-raised in the caller's thread
            self.error = exc

    def arrived(self) -> bool:
        if self.thread.is_alive():
            return False
        if self.error is not None:
            raise self.error
        return True

    def wait(self) -> None:
        """Until the message is in (no polling delay)."""
        self.thread.join()
        self.arrived()
