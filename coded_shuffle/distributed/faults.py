"""Faults put in on purpose, to show that a check catches them (tests, ``debug.*`` of the
training job): a process-wide hook, never part of :class:`~coded_shuffle.CodedShuffle`."""

from __future__ import annotations

from collections.abc import Callable

import torch

SymbolsHook = Callable[[int, list[torch.Tensor]], None]

before_send: SymbolsHook | None = None
"""On the master: ``(epoch, symbols)`` called before an epoch's symbols are sent (it may
change them; the master then encodes every epoch whole before sending it)."""


def set_before_send(hook: SymbolsHook | None) -> None:
    """Installs (or, with None, removes) the :data:`before_send` hook of this process."""
    global before_send
    before_send = hook
