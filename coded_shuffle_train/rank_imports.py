"""What every rank would load for itself, for a process that forks ranks to load once before
it forks (the launcher's fork server: :mod:`coded_shuffle_train.preload`; the tests' forked
ranks: ``tests/ranks.py``). Warming runs the codec's serial kernel only, so no numba thread
exists at the fork."""

from __future__ import annotations


def load() -> None:
    """What an own loop's rank loads (:func:`~coded_shuffle.tools.ranks.load_own_loop_imports`:
    the library, scipy's solvers, the codec's kernel warmed) and ``torch._dynamo`` (DDP's
    constructor imports it; ``torch._inductor.config`` imports it, and torch.distributed
    imports that on first use)."""
    import torch._inductor.config  # noqa: F401

    from coded_shuffle.tools.ranks import load_own_loop_imports

    load_own_loop_imports()
