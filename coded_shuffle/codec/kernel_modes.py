"""The gather-XOR kernel's modes and tuning constants, shared by its front
(:mod:`~coded_shuffle.codec.kernel`) and its compiled body (:mod:`~coded_shuffle.codec.compiled`)
without either importing the other."""

PREFETCH_ROWS = 8  # rows ahead whose sources are prefetched (measured best: 8-16)
LINE = 64  # bytes per cache line

COPY, XOR, ACC, ACC_XOR = 0, 1, 2, 3  # dst = a; dst = a ^ b; dst ^= a; dst ^= a ^ b
