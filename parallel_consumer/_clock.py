"""The clock the engine reads. Injected, so tests move time instead of sleeping."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic scale: deadlines, intervals and retry due times."""
        ...

    def now(self) -> datetime:
        """Wall-clock time (UTC), for timestamps shown to users."""
        ...

    def block_for(self, seconds: float) -> float:
        """How long a thread may block in real time while waiting ``seconds`` of clock time."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def block_for(self, seconds: float) -> float:
        return max(0.0, seconds)

    def __repr__(self) -> str:
        return "<SystemClock>"
