"""The one interruption path of ``alma flash``: SIGINT and SIGTERM set a flag, nothing else.

No KeyboardInterrupt lands at an arbitrary line (inside a lock, half way through a record):
the handler only sets ``cancel`` (first signal) and ``urgent`` (any further one). The
session owns the child processes: it sees ``cancel``, stops every initrd-flash process
group, writes an INTERRUPTED record per board with the phases reached and keeps the logs;
``urgent`` only makes the stop faster (SIGKILL, no grace). The command exits 130.

``alma flash`` installs the handlers once the user confirmed (or passed ``--yes``): before
that nothing was touched, and Ctrl-C at the prompt simply aborts it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SignalFlag(threading.Event):
    """A ``threading.Event`` whose ``set`` takes no lock.

    ``Event.set`` acquires a non-reentrant lock; a handler runs in the main thread between
    two bytecodes, so a second signal arriving while the first handler is inside ``set``
    (umockdev-run and terminals deliver SIGINT twice within microseconds) re-entered it and
    deadlocked the process for good. Here ``set`` is one attribute store; nobody waits on
    the flag without a timeout (everything polls it), so no wake-up is lost.
    """

    def set(self) -> None:
        self._flag = True  # CPython's Event keeps its state here

    def wait(self, timeout: float | None = None) -> bool:
        import time

        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.05)
        return True


class Interruption:
    def __init__(self) -> None:
        self.cancel = SignalFlag()
        self.urgent = SignalFlag()
        self.received: list[int] = []
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self.cancel.is_set():
            self.urgent.set()
        self.cancel.set()

    @property
    def interrupted(self) -> bool:
        return self.cancel.is_set()

    def install(self) -> None:
        """Signals only set flags from now on (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread() or self._old:
            return
        self._old = {s: signal.signal(s, self._handler) for s in SIGNALS}

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    @contextmanager
    def installed(self) -> Iterator[Interruption]:
        self.install()
        try:
            yield self
        finally:
            self.restore()
