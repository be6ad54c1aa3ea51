"""Stop signals for :meth:`ParallelConsumer.run`: SIGTERM and SIGINT ask for a close.

Python runs signal handlers on the main thread only, and only one handler per signal, so the
handlers are installed only when ``run()`` is called from the main thread, and the previous ones
are put back when it returns. The handler itself only counts the signal and posts a request: it
never blocks (a handler runs between two bytecodes of whatever the main thread was doing).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

__all__ = ["STOP_SIGNALS", "StopSignals"]

#: The signals that stop ``run()``: Kubernetes and systemd send SIGTERM, a terminal SIGINT.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Installs handlers for :data:`STOP_SIGNALS` while in use (main thread only).

    ``on_signal(signum, count)`` is called for each signal, ``count`` being 1 for the first one
    received while installed, 2 for the second, and so on.
    """

    def __init__(self, on_signal: Callable[[int, int], None], *, install: bool = True) -> None:
        self._on_signal = on_signal
        self._install = install and threading.current_thread() is threading.main_thread()
        self._previous: dict[signal.Signals, Any] = {}
        self.received = 0

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        self._on_signal(signum, self.received)

    def __enter__(self) -> StopSignals:
        if self._install:
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
