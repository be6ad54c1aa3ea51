"""Collecting what a runner reports, for the runner tests (a plain module: tests import it
by name)."""

from __future__ import annotations

import queue
import time

from parallel_consumer._events import WorkDone, WorkDoneMany


class Results:
    """A runner's ``done`` callback: collects the calls' results from the runner's threads
    (a ``WorkDoneMany``, as the asyncio runner sends for the calls that ended in one pass of
    its loop, counts as its calls) and counts the events."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[WorkDone] = queue.SimpleQueue()
        self.events = 0

    def __call__(self, event: WorkDone | WorkDoneMany) -> None:
        self.events += 1
        if isinstance(event, WorkDoneMany):
            for call in event.calls:
                self._queue.put(WorkDone(*call))
        else:
            self._queue.put(event)

    def take(self, count: int, timeout: float = 20.0) -> dict[int, WorkDone]:
        deadline = time.monotonic() + timeout
        out: dict[int, WorkDone] = {}
        while len(out) < count:
            event = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            assert event.batch not in out, f"call {event.batch} reported twice"
            out[event.batch] = event
        return out

    def empty(self) -> bool:
        return self._queue.empty()
