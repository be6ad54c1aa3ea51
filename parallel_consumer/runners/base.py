"""The one interface between the controller and whatever runs user code.

A runner receives batches (a batch id plus the PollContext built for its records) and reports
each finished call as a :class:`~parallel_consumer._events.WorkDone` through the ``done``
callback it was started with: one outcome per record, and the handler's return value. It owns
nothing but the user call: no work state, no Kafka client, no WorkItem. Thread, asyncio,
process and Spark runners plug in here without the controller knowing which it drives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from parallel_consumer._events import WorkDone
from parallel_consumer.context import PollContext

__all__ = ["Handler", "Runner"]

Handler = Callable[[PollContext], object]


class Runner(Protocol):
    #: How many handler calls may run at once.
    capacity: int
    #: How many more calls may wait inside the runner for a free worker. A small backlog lets a
    #: worker that finishes start its next call at once instead of waiting for the controller's
    #: answer to its result (a thread round trip per call); it does not raise ``capacity``.
    backlog: int

    def start(self, handler: Handler, done: Callable[[WorkDone], None]) -> None:
        """Start workers that call ``handler`` and report through ``done``."""
        ...

    def submit(self, batch: int, context: PollContext) -> None:
        """Run one handler call. Never blocks; the controller respects ``capacity + backlog``."""
        ...

    def cancel_queued(self) -> list[int]:
        """Take back every submitted call that has not started; returns their batch ids.
        They are never started and never reported."""
        ...

    def stop(self, timeout: float) -> bool:
        """From now on no call starts (queued ones never will and are not reported); wait up to
        ``timeout`` for running calls, then stop. False if some did not end in time."""
        ...
