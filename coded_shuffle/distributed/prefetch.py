"""An epoch's delivery in the background: it runs on a thread of its own while the training
loop works on the epoch before, and the loop collects it when it asks for that epoch.

Every rank starts the same delivery at the same point (when it hands the epoch before out),
so the collectives inside it meet as they do in the foreground; they run over the delivery's
own process group, never the groups the loop itself uses (its gradient all-reduce, its own
messages), so neither waits for the other. A failure is raised where the loop collects the
delivery; ``on_error(exc, collecting)`` runs on the delivery's thread meanwhile and decides
how long the loop may take to come for it (``collecting`` is set when it does: the caller
waits up to the job's timeout, then ends the process with one line, since the loop may wait
in a collective that gloo cannot interrupt: the failure surfaces within the timeout, not at the
next epoch's boundary after a hang).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Ahead(Generic[T]):
    """``work()`` for ``epoch`` on a daemon thread, started at once."""

    def __init__(
        self,
        epoch: int,
        work: Callable[[], T],
        on_error: Callable[[BaseException, threading.Event], None],
    ) -> None:
        self.epoch = epoch
        self.started = time.perf_counter()
        self.finished: float | None = None
        self._work, self._on_error = work, on_error
        self._value: T | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._collecting = threading.Event()  # the loop waits in :meth:`result`
        self._thread = threading.Thread(target=self._run, name=f"delivery-e{epoch}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._work()
        except BaseException as exc:  # raised in the loop, or on_error ends the process
            self._error = exc
            self._on_error(exc, self._collecting)
        finally:
            self.finished = time.perf_counter()
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> T:
        """The delivery's result once it is done (waits for the rest); its error raised here."""
        self._collecting.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
