"""FakeClock: time that moves only when a test says so."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

__all__ = ["FakeClock"]

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class FakeClock:
    """A manually advanced clock for ``ParallelConsumer(..., clock=FakeClock())``.

    Threads waiting on it block in short real-time slices, so an :meth:`advance` takes effect
    within a few milliseconds. Thread-safe.
    """

    #: Longest real-time block while waiting for clock time to pass.
    slice = 0.005

    def __init__(self, start: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._now = start

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def now(self) -> datetime:
        return _EPOCH + timedelta(seconds=self.monotonic())

    def block_for(self, seconds: float) -> float:
        return min(max(0.0, seconds), self.slice)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        with self._lock:
            self._now += seconds

    def __repr__(self) -> str:
        return f"<FakeClock t={self.monotonic():.3f}>"
