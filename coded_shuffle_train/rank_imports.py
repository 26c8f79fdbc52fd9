"""What every rank would load for itself, for a process that forks ranks to load once before
it forks (the launcher's fork server: :mod:`coded_shuffle_train.preload`; the tests' forked
ranks: ``tests/ranks.py``). Warming runs the codec's serial kernel only, so no numba thread
exists at the fork."""

from __future__ import annotations


def load() -> None:
    """``torch._dynamo`` (DDP's constructor imports it; ``torch._inductor.config`` imports it,
    and torch.distributed imports that on first use), scipy's solvers (every rank's plan may
    solve a program: 0.3 s of CPU a rank) and the codec's compiled kernel, warmed (numba's CPU
    target set up and the kernel loaded from its cache: most of a second a process)."""
    import scipy.optimize  # noqa: F401
    import torch._inductor.config  # noqa: F401

    from coded_shuffle.codec import kernel

    kernel.warm()
