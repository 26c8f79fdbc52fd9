"""``multicast``'s parity datagrams at a receiver: the XOR of a block of datagrams rebuilds
the one datagram of the block it lacks, without waiting for a repair round."""

from __future__ import annotations

import numpy as np

FLAG_PARITY = 1


class Parity:
    """A receiver's parity datagrams of one stream, and the datagrams they rebuild."""

    def __init__(self, total: int, d: int, block: int) -> None:
        self.n, self.d, self.block, self.total = -(-total // d), d, block, total
        n = self.n
        blocks = -(-n // block) if block else 0
        self.data = np.zeros((blocks, d), dtype=np.uint8)
        self.have = np.zeros(blocks, dtype=bool)

    def receive(self, b: int, payload: memoryview, out: np.ndarray, have: np.ndarray) -> list:
        """Keeps block ``b``'s parity; returns the datagrams it rebuilt (none or one)."""
        if not self.block or b >= self.have.size or self.have[b]:
            return []
        self.data[b, : len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        self.have[b] = True
        return self._rebuild(b, out, have)

    def _rebuild(self, b: int, out: np.ndarray, have: np.ndarray) -> list:
        lo, hi = b * self.block, min(self.n, (b + 1) * self.block)
        missing = np.flatnonzero(~have[lo:hi])
        if missing.size != 1:
            return []
        j, d = lo + int(missing[0]), self.d
        # zero padding, as in the master's parity (another datagram may have landed there)
        out[self.total :] = 0
        out[j * d : (j + 1) * d] = 0
        rows = out[lo * d : hi * d].reshape(-1, d)
        out[j * d : (j + 1) * d] = np.bitwise_xor.reduce(rows, axis=0) ^ self.data[b]
        have[j] = True
        return [j]

    def rebuild_all(self, out: np.ndarray, have: np.ndarray) -> int:
        """Every block whose parity is in and that lacks exactly one datagram, rebuilt."""
        return sum(len(self._rebuild(int(b), out, have)) for b in np.flatnonzero(self.have))
