"""ServiceTime: the time per handler call that adaptive dispatch goes by.

Owned by the controller thread. See :meth:`ServiceTime.observe` for the rule.
"""

from __future__ import annotations

__all__ = ["MIN_SERVICE", "SERVICE_GROWTH", "ServiceTime"]

#: Within one window the time per call rises at most this many times its value at the
#: window's start (unless the windows before were held at that cap too, see observe()).
SERVICE_GROWTH = 1.6
#: The shortest time per call reckoned with (seconds).
MIN_SERVICE = 1e-7


class ServiceTime:
    """A mean of the reported times per call, weighting each report 0.2, that rises at most
    SERVICE_GROWTH times per ``window`` of real time, unless the two windows before were
    held at that cap too.

    A report is wall time on a worker: a pause of the whole process (a full garbage
    collection takes 20-50 ms here) or a long wait for the GIL makes every report that spans
    it up to a thousand times the calls' own, and they come in one window: the cap keeps
    them from switching chunks and runs off. Calls that really turned slow keep hitting the
    cap, and after two windows the mean follows them. Shorter calls lower it by a fifth of the
    gap per report."""

    __slots__ = ("_cap", "_capped", "_capped_windows", "_window", "_window_end", "value")

    def __init__(self, window: float) -> None:
        self._window = window
        #: The mean, or None before the first report.
        self.value: float | None = None
        #: The most the mean may rise to until ``_window_end``.
        self._cap = 0.0
        self._window_end = 0.0
        #: A report hit the cap in this window; in how many windows in a row before it.
        self._capped = False
        self._capped_windows = 0

    def observe(self, took: float, now: float) -> float:
        """Take a report of ``took`` seconds per call at real time ``now``; return the mean."""
        previous = self.value
        if previous is None:
            service = took
            self._cap = max(took, MIN_SERVICE) * SERVICE_GROWTH
            self._window_end = now + self._window
        else:
            if now >= self._window_end:
                # A new window: was the one that ended held at the cap?
                self._capped_windows = self._capped_windows + 1 if self._capped else 0
                self._capped = False
                self._cap = max(previous, MIN_SERVICE) * SERVICE_GROWTH
                self._window_end = now + self._window
            service = previous * 0.8 + took * 0.2
            if service > self._cap:
                self._capped = True
                if self._capped_windows < 2:
                    service = self._cap
        self.value = service
        return service
