"""Faults put in on purpose, to show that a check catches them (their kinds:
:mod:`.fault_kinds`): a process-wide layer with one hook point, never part of
:class:`~coded_shuffle.CodedShuffle`'s settings and never a reason to take another path.

The hook point: :func:`outgoing`, every message's rows as this process's link frames them
(the master's coded symbols, the points it places in the first epoch or re-places after a
restart; a worker's own symbols under ``peers`` routing). The hook sees the rows where they
are (the sender's own, not to be written) and returns rows to send instead, or None; the
framing path is the same with a hook or without (zero-copy where it was), and a message the
hook replaces is the only one copied.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Fault = Callable[[int, int, torch.Tensor], torch.Tensor | None]
"""``(epoch, first, rows)``: rows ``first ..`` of a stream this process sends in ``epoch``,
about to go out in one message (not to be written); the rows to send instead, or None."""

_outgoing: Fault | None = None


def set_outgoing(hook: Fault | None) -> None:
    """Installs (or, with None, removes) this process's hook on its outgoing rows."""
    global _outgoing
    _outgoing = hook


def outgoing(epoch: int) -> Callable[[int, torch.Tensor], torch.Tensor | None] | None:
    """The hook for the messages of a stream of ``epoch``, as the framing takes it
    (:data:`~coded_shuffle.distributed.transports.framing.RowsHook`; None without one)."""
    hook = _outgoing
    if hook is None:
        return None
    return lambda first, rows: hook(epoch, first, rows)
