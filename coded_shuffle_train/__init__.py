"""Training harness: torch.distributed (gloo) jobs launched by ``coded-shuffle-train``.

Rank 0 is the master, ranks 1..K are the workers. Jobs live in ``coded_shuffle_train/<name>.py`` and
are selected with ``job=<name>`` (see :mod:`coded_shuffle_train.entry` for the contract)."""
