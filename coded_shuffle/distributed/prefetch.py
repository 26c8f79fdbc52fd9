"""An epoch's delivery in the background: it runs on a thread of its own while the training
loop works on the epoch before, and the loop collects it when it asks for that epoch.

Every rank starts the same delivery at the same point (when it hands the epoch before out),
so the collectives inside it meet as they do in the foreground; they run over the delivery's
own process group, never the groups the loop itself uses (its gradient all-reduce, its own
messages), so neither waits for the other. A failure is raised where the loop collects the
delivery; where the loop is busy elsewhere then (in a collective that gloo cannot interrupt,
say), ``on_error`` decides at once (the caller ends the process with one line: the failure
surfaces within the job's timeout, not at the next epoch's boundary).
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
        self, epoch: int, work: Callable[[], T], on_error: Callable[[BaseException], None]
    ) -> None:
        self.epoch = epoch
        self.started = time.perf_counter()
        self.finished: float | None = None
        self._work, self._on_error = work, on_error
        self._value: T | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._collecting = False  # the loop waits in :meth:`result`: it raises the error
        self._thread = threading.Thread(target=self._run, name=f"delivery-e{epoch}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._work()
        except BaseException as exc:  # handed to the loop, or to on_error
            self._error = exc
        self.finished = time.perf_counter()
        with self._lock:
            self._done.set()
            unattended = self._error is not None and not self._collecting
        if unattended:
            assert self._error is not None
            self._on_error(self._error)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> T:
        """The delivery's result once it is done (waits for the rest); its error raised here."""
        with self._lock:
            self._collecting = True
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
