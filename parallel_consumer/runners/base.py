"""The one interface between the controller and whatever runs user code.

A runner receives batches (a batch id plus the PollContext built for its records) and reports
each finished call as a :class:`~parallel_consumer._events.WorkDone` through the ``done``
callback it was started with: one outcome per record, and the handler's return value (for an
``async def`` handler, the awaited value). It owns nothing but the user call: no work state, no
Kafka client, no WorkItem. The thread, asyncio and process runners (and later Spark) plug in
here without the controller knowing which it drives.

The contract every runner keeps:

- every call that *started* reports exactly one ``WorkDone``, whatever happens to it (it
  returned, raised, was cancelled, or its worker process died: then it reports a failure, so
  the controller retries the records and none is lost);
- a call taken back by :meth:`Runner.cancel_queued` or dropped by :meth:`Runner.stop` before it
  started never starts and never reports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from parallel_consumer._events import WorkDone
from parallel_consumer.context import PollContext
from parallel_consumer.errors import ParallelConsumerError

__all__ = ["CallCancelled", "Handler", "Runner"]

#: A plain function for the thread and process runners; an ``async def`` function (returning an
#: awaitable) for the asyncio runner.
Handler = Callable[[PollContext], object]


class CallCancelled(ParallelConsumerError):
    """A handler call was cancelled before it could finish (``Runner.cancel``, or a close that
    ran out of time); its records count as failed and are retried."""


class Runner(Protocol):
    #: How many handler calls may run at once.
    capacity: int
    #: How many more calls may wait inside the runner for a free worker. A small backlog lets a
    #: worker that finishes start its next call at once instead of waiting for the controller's
    #: answer to its result (a thread round trip per call); it does not raise ``capacity``.
    backlog: int

    def start(self, handler: Handler, done: Callable[[WorkDone], None]) -> None:
        """Start workers that call ``handler`` and report through ``done``. Raises
        :class:`~parallel_consumer.errors.ConfigurationError` when the runner cannot run
        ``handler`` (nothing is left running then)."""
        ...

    def submit(self, batch: int, context: PollContext) -> None:
        """Run one handler call. Never blocks; the controller respects ``capacity + backlog``."""
        ...

    def cancel_queued(self) -> list[int]:
        """Take back every submitted call that has not started; returns their batch ids.
        They are never started and never reported."""
        ...

    def cancel(self, batch: int, error: BaseException | None = None) -> None:
        """Ask for call ``batch`` to end early. If the runner can interrupt it (the asyncio
        runner cancels its task; the process runner terminates and replaces the worker process
        running it; a call not started yet is dropped), the call reports ``error`` (default
        :class:`CallCancelled`; a terminated worker's calls report ``WorkerCrashed``) as the
        failure of each of its records. A no-op where the runner cannot interrupt a running
        call (a thread) and for a call that has already ended. Thread-safe; never blocks."""
        ...

    def stop(self, timeout: float) -> bool:
        """From now on no call starts (queued ones never will and are not reported); wait up to
        ``timeout`` for running calls, then stop (a runner that can, cancels what is still
        running; such calls report :class:`CallCancelled`). False if some did not end in
        time."""
        ...
