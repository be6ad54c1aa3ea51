"""Stall watch: notice when records wait and nothing can make progress (pure, no threads).

Every waiting record is either runnable now or behind a record of its lane that is running or
waiting for its retry. Records waiting while nothing is in flight and no retry is due can only
mean a bug in the engine, so the controller reports it loudly instead of stalling silently.
"""

from __future__ import annotations

__all__ = ["STALL_AFTER", "StallWatch"]

#: How long the stalled state must last before it is reported (once per episode).
STALL_AFTER = 1.0


class StallWatch:
    """Owned by the controller thread; fed once per turn of its loop."""

    __slots__ = ("_after", "_reported", "_since")

    def __init__(self, after: float = STALL_AFTER) -> None:
        self._after = after
        self._since: float | None = None
        self._reported = False

    def observe(self, now: float, *, stalled: bool) -> float | None:
        """Feed the current state; returns how long it has lasted when a stall is to be
        reported now (once per episode), else None."""
        if not stalled:
            self._since = None
            self._reported = False
            return None
        if self._since is None:
            self._since = now
            return None
        if self._reported or now - self._since < self._after:
            return None
        self._reported = True
        return now - self._since

    def wake_at(self) -> float | None:
        """When the controller must look again even if no event arrives."""
        if self._since is None or self._reported:
            return None
        return self._since + self._after
