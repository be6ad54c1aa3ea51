"""The asyncio face of :class:`~parallel_consumer.ParallelConsumer`: what
``async with ParallelConsumer(...) as pc`` gives, with ``await pc.run()`` and ``await pc.close()``.

Entering ``async with`` binds the consumer to the running loop: an ``async def`` handler
registered afterwards runs there (the asyncio runner on the caller's loop), so it may use the
application's loop-bound clients. The poller and the controller keep their threads. Closing is
the consumer's one close (the controller's), waited for here without blocking the loop: the
controller's ``stopped`` future is awaited, then the handlers' wind-down on this loop.

Owns nothing but the loop it was entered on; every request goes to the consumer through
:class:`CloseSeam` and the consumer's public methods.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, overload

from parallel_consumer._signals import LoopStopSignals, closing_on_signals
from parallel_consumer.context import PollContext
from parallel_consumer.engine.closing import FINAL_COMMIT_TIMEOUT, STOP_TIMEOUT
from parallel_consumer.health import HealthReport
from parallel_consumer.kafka.poller import RebalanceCallback
from parallel_consumer.produce import ProduceResult
from parallel_consumer.status import Lifecycle, Statistics

__all__ = ["AsyncParallelConsumer", "CloseSeam", "refuse_blocking_on"]

log = logging.getLogger("parallel_consumer")

F = TypeVar("F", bound=Callable[[PollContext], object])
OnProduced = Callable[[ProduceResult], object]

#: What a close may take beyond its timeout: the final commit, stopping the poller, slack.
_CLOSE_SLACK = FINAL_COMMIT_TIMEOUT + STOP_TIMEOUT + 5.0


@dataclass(frozen=True, slots=True)
class CloseSeam:
    """What the asyncio face needs of the consumer's one close, handed over by the consumer."""

    #: Ask the controller to close (or to close sooner): never blocks.
    request_close: Callable[[bool, float], None]
    #: The close timeout given (None: the options' default), checked.
    close_timeout: Callable[[float | None], float]
    #: Resolved by the controller thread once processing stopped (the failure, if any).
    stopped: concurrent.futures.Future[None]
    #: The runner on this loop, if the handler runs there: awaited after ``stopped``, until
    #: every call on this loop has ended.
    runner: Callable[[], _LoopRunner | None]
    #: A consumer whose processing never started closes here, at once.
    close_unstarted: Callable[[], None]
    #: Called once closed, whatever the outcome (telemetry stops reporting).
    closed: Callable[[], None]


class _LoopRunner(Protocol):
    async def ended(self) -> None: ...


class _Consumer(Protocol):
    """The public methods of ParallelConsumer that the asyncio face hands through."""

    @property
    def lifecycle(self) -> Lifecycle: ...
    @property
    def failure(self) -> BaseException | None: ...
    def subscribe(
        self,
        topics: str | list[str] | tuple[str, ...],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
    ) -> None: ...
    def poll(self, handler: F) -> F: ...
    @overload
    def poll_and_produce(self, handler: F, *, on_produced: OnProduced | None = None) -> F: ...
    @overload
    def poll_and_produce(
        self, handler: None = None, *, on_produced: OnProduced | None = None
    ) -> Callable[[F], F]: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def statistics(self) -> Statistics: ...
    def health(self) -> HealthReport: ...


class AsyncParallelConsumer:
    """A :class:`~parallel_consumer.ParallelConsumer` bound to the event loop it was entered on
    (``async with ParallelConsumer(...) as pc``). ``async def`` handlers run as tasks on that
    loop; ``run()`` and ``close()`` are awaited instead of blocking it. ``subscribe``, ``poll``,
    ``poll_and_produce``, ``pause``, ``resume``, ``statistics`` and ``health`` are the
    consumer's own (``statistics`` and ``health`` ask the controller thread, which answers in
    microseconds: fine in a route). See docs/async-handlers.md.
    """

    def __init__(
        self, consumer: _Consumer, seam: CloseSeam, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._consumer = consumer
        self._seam = seam
        self._loop = loop
        self.subscribe = consumer.subscribe
        self.poll = consumer.poll
        self.poll_and_produce = consumer.poll_and_produce
        self.pause = consumer.pause
        self.resume = consumer.resume
        self.statistics = consumer.statistics
        self.health = consumer.health

    @property
    def lifecycle(self) -> Lifecycle:
        return self._consumer.lifecycle

    @property
    def failure(self) -> BaseException | None:
        """The internal failure that stopped processing, if any."""
        return self._consumer.failure

    async def run(
        self, *, drain: bool = False, timeout: float | None = None, handle_signals: bool = False
    ) -> None:
        """Process records until closed; returns once closed, raising the failure that stopped
        processing, if any. Another task ends it with :meth:`close` (or by leaving
        ``async with``). Cancelling the task that awaits it closes gracefully (no new call
        starts, calls in flight may finish within ``timeout``, what finished is committed),
        then re-raises the cancellation; a second cancellation meanwhile closes fast. So
        Ctrl-C under ``asyncio.run`` (which cancels the main task) closes gracefully. (A task
        cancelled before it ever ran never runs this: the consumer goes on until closed.)

        No signal handler is installed unless ``handle_signals=True``: servers (uvicorn,
        aiohttp) and ``asyncio.run`` own the process's signals. With it, and on the main
        thread, SIGTERM and SIGINT close as the blocking ``run()`` does (the first gracefully,
        a second fast) through ``loop.add_signal_handler``; the previous handlers are put back
        when it returns.
        """
        if self._consumer.lifecycle is Lifecycle.NEW:
            raise RuntimeError(
                "run() needs a handler: register one with @pc.poll or @pc.poll_and_produce "
                "(after subscribe()) first"
            )
        close_timeout = self._seam.close_timeout(timeout)

        on_signal = closing_on_signals(self._seam.request_close, drain, close_timeout)
        stopped = self._stopped_on_loop()
        try:
            with LoopStopSignals(self._loop, on_signal, install=handle_signals):
                try:
                    await asyncio.wait({stopped})
                except asyncio.CancelledError:
                    log.info("run() was cancelled: closing")
                    self._seam.request_close(drain, close_timeout)
                    await self._closed(stopped, close_timeout + _CLOSE_SLACK)
                    raise
            await self._closed(stopped, 0.0)
        finally:
            self._seam.closed()

    async def close(self, drain: bool = False, timeout: float | None = None) -> None:
        """Close as :meth:`ParallelConsumer.close` does, awaiting instead of blocking the loop:
        returns once closed; re-raises the failure that stopped processing, if any. Cancelled
        meanwhile, it closes fast (calls still running are abandoned and processed again
        later; what finished is committed), then re-raises the cancellation."""
        timeout = self._seam.close_timeout(timeout)
        if self._consumer.lifecycle is Lifecycle.NEW:
            self._seam.close_unstarted()
            return
        self._seam.request_close(drain, timeout)
        try:
            await self._closed(self._stopped_on_loop(), timeout + _CLOSE_SLACK)
        finally:
            self._seam.closed()

    async def _closed(self, stopped: asyncio.Future[None], grace: float) -> None:
        """Wait until processing stopped and the handlers on this loop ended; then raise the
        failure, if any. A cancellation meanwhile asks for a fast close and is re-raised once
        closed (a close is never left half-way)."""
        cancelled: asyncio.CancelledError | None = None
        deadline = self._loop.time() + grace
        while not stopped.done():
            try:
                await asyncio.wait({stopped}, timeout=max(0.0, deadline - self._loop.time()))
            except asyncio.CancelledError as exc:
                if cancelled is None:
                    log.warning(
                        "cancelled while closing: closing now (calls still running are not "
                        "committed and will be processed again; what finished is committed)"
                    )
                    self._seam.request_close(False, 0.0)
                    deadline = min(deadline, self._loop.time() + _CLOSE_SLACK)
                cancelled = exc
                continue
            if not stopped.done():
                raise TimeoutError(f"ParallelConsumer did not close within {grace:.0f}s")
        runner = self._seam.runner()
        if runner is not None:
            await runner.ended()
        try:
            self._seam.stopped.result(0)
        finally:
            if cancelled is not None:
                raise cancelled

    def _stopped_on_loop(self) -> asyncio.Future[None]:
        """A future of this loop that is done once the controller's ``stopped`` is (set from
        the controller's thread; cancelling it leaves ``stopped`` alone)."""
        waiter: asyncio.Future[None] = self._loop.create_future()
        loop = self._loop

        def done(_: concurrent.futures.Future[None]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(_resolve, waiter)

        self._seam.stopped.add_done_callback(done)
        return waiter

    def __repr__(self) -> str:
        return f"<AsyncParallelConsumer of {self._consumer!r}>"


def refuse_blocking_on(loop: asyncio.AbstractEventLoop | None, what: str) -> None:
    """Raise RuntimeError if called on ``loop`` (the handlers' loop): a blocking ``what()``
    there would stop every handler while it waits."""
    if loop is None:
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return
    if running is loop:
        raise RuntimeError(
            f"{what}() blocks, and this consumer's handlers run on this event loop: await "
            f"pc.{'run' if what == 'run' else 'close'}() on the object that "
            "`async with ParallelConsumer(...) as pc` gives"
        )


def _resolve(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(None)
