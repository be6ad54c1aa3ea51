"""Stop signals for :meth:`ParallelConsumer.run`: SIGTERM and SIGINT ask for a close.

Python runs signal handlers on the main thread only, and only one handler per signal, so the
handlers are installed only when ``run()`` is called from the main thread, and the previous ones
are put back when it returns. The handler itself only counts the signal and posts a request: it
never blocks (a handler runs between two bytecodes of whatever the main thread was doing).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

__all__ = ["STOP_SIGNALS", "LoopStopSignals", "StopSignals", "closing_on_signals"]

#: The signals that stop ``run()``: Kubernetes and systemd send SIGTERM, a terminal SIGINT.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


log = logging.getLogger("parallel_consumer")


def closing_on_signals(
    request_close: Callable[[bool, float], None], drain: bool, timeout: float
) -> Callable[[int, int], None]:
    """What ``run()`` does on a stop signal: the first closes gracefully (``drain`` and
    ``timeout`` as given), a second one fast. ``request_close(drain, timeout)`` never blocks."""

    def on_signal(signum: int, count: int) -> None:
        name = signal.Signals(signum).name
        if count == 1:
            log.info("%s received: closing (a second signal closes at once)", name)
            request_close(drain, timeout)
        else:
            log.warning(
                "%s received again: closing now (calls still running are not committed "
                "and will be processed again)",
                name,
            )
            request_close(False, 0.0)

    return on_signal


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


class LoopStopSignals:
    """:class:`StopSignals` for an asyncio application: the handlers go through
    ``loop.add_signal_handler`` (they run on the loop, between its callbacks) while in use, and
    only when asked and on the main thread. asyncio forgets the handler it replaced; the
    previous Python-level handler (``asyncio.run``'s own SIGINT handler, for one) is put back
    on exit."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_signal: Callable[[int, int], None],
        *,
        install: bool,
    ) -> None:
        self._loop = loop
        self._on_signal = on_signal
        self._install = install and threading.current_thread() is threading.main_thread()
        self._previous: dict[signal.Signals, Any] = {}
        self.received = 0

    def _handle(self, signum: int) -> None:
        self.received += 1
        self._on_signal(signum, self.received)

    def __enter__(self) -> LoopStopSignals:
        if self._install:
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.getsignal(sig)
                self._loop.add_signal_handler(sig, self._handle, sig)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, previous in self._previous.items():
            self._loop.remove_signal_handler(sig)
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
