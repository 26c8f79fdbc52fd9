"""Faults put in on purpose, to show that a check catches them (their kinds:
:mod:`.fault_kinds`): a process-wide layer with one hook point, never part of
:class:`~coded_shuffle.CodedShuffle`'s settings and never a reason to take another path.

The hook point: :func:`outgoing`, the master's rows of an epoch as each message is framed:
its coded symbols, and the points it places (the first epoch, and a worker's store re-placed
after a restart).
Without a hook it returns the rows it was given, untouched; with one, it wraps them as a row
source whose rows the hook sees (and may change) after they are produced, whether they were
encoded ahead or are encoded message by message.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from coded_shuffle.distributed.transports.framing import RowSource, pick_rows

RowsHook = Callable[[int, int, torch.Tensor], None]
"""``(epoch, first, rows)``: rows ``first ..`` of a stream the master sends in ``epoch``
(symbols or placed points), just produced for a message (it may change them in place)."""

_outgoing: RowsHook | None = None


def set_outgoing(hook: RowsHook | None) -> None:
    """Installs (or, with None, removes) this process's hook on the master's symbols."""
    global _outgoing
    _outgoing = hook


def outgoing(epoch: int, rows: torch.Tensor | RowSource) -> torch.Tensor | RowSource:
    """The hook point: ``rows`` (an epoch's symbols, about to be framed) as the link sends
    them: themselves without a hook."""
    if _outgoing is None:
        return rows
    return HookedRows(rows, epoch, _outgoing)


class HookedRows:
    """``rows`` as a :class:`RowSource` whose every produced run of rows passes ``hook``."""

    def __init__(self, rows: torch.Tensor | RowSource, epoch: int, hook: RowsHook) -> None:
        self.src, self.epoch, self.hook = rows, epoch, hook
        self.shape = (int(rows.shape[0]), int(rows.shape[1]))

    def rows(self, first: int, count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(self.src, torch.Tensor):
            run = self.src[first : first + count]
            out = run.clone() if out is None else out.copy_(run)
        else:
            out = self.src.rows(first, count, out)
        self.hook(self.epoch, first, out)
        return out

    def pick(self, ids: np.ndarray) -> HookedRows:
        """The rows ``ids``, in that order, still through the hook (a routed transport)."""
        return HookedRows(pick_rows(self.src, ids), self.epoch, self.hook)
