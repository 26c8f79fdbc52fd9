"""The distributed layer: :class:`~coded_shuffle.CodedShuffle` (one object per rank) and the
sides of an epoch it delegates to (the master's, the worker's, the stores' persistence), the
epochs derived from the seed, proved deliveries, the transports (one module each behind a
registry) and liveness (heartbeats and the watchdog)."""
