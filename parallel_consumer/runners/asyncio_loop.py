"""The asyncio runner: ``async def`` handlers as tasks on one event loop, either its own in its
own thread (the private loop) or the application's (the caller's loop, given as ``loop``).

The private loop thread (``<name>-aio-loop``) is a portal in the manner of anyio's
``BlockingPortal`` and dramatiq's ``EventLoopThread``: other threads never touch the loop's
objects, they hand it callbacks with ``call_soon_threadsafe``. The caller's loop is used the
same way, except that the runner never blocks its own callers on it (:meth:`AsyncioRunner.stop`
only schedules the wind-down there, and :meth:`AsyncioRunner.ended` awaits it on the loop): the
loop may be busy in the application's own code, even in a call to this consumer. Calls cross
in batches both ways: one ``call_soon_threadsafe`` per burst of submissions, one report per
pass of the loop for the calls that ended in it. Thousands of calls may be in flight at once
(each is a task, not a thread); the only limit is ``capacity`` (``Options.max_concurrency``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import threading
import types
from collections import deque
from collections.abc import Callable, Iterable

from parallel_consumer._clock import Clock
from parallel_consumer._events import CallResult, RunnerReport, WorkDone, WorkDoneMany
from parallel_consumer.context import PollContext
from parallel_consumer.errors import ConfigurationError, ParallelConsumerError
from parallel_consumer.hooks import Hooks, NoHooks, active_hooks
from parallel_consumer.runners._private_loop import LagWatch, new_loop
from parallel_consumer.runners.base import CallCancelled, Handler, RunnerFeatures, not_a_result

__all__ = ["AsyncioRunner"]

log = logging.getLogger("parallel_consumer")

#: After ``stop``'s timeout, how long cancelled calls may take to unwind (their ``finally``
#: blocks, ``async with`` exits) before the loop stops anyway.
CANCEL_GRACE = 1.0

_Coroutine = types.CoroutineType


class AsyncioRunner:
    """Runs an ``async def`` handler as up to ``capacity`` concurrent tasks on one event loop.

    Owns the loop and its thread. Calls submitted beyond ``capacity`` wait in a queue shared
    with the controller thread (guarded by ``_lock``, with the open/closed gate), so
    :meth:`cancel_queued` can take them back synchronously; the loop starts the next queued call
    as soon as one ends, without a round trip through the controller. Everything else (the tasks
    in flight, cancellation reasons) belongs to the loop thread.

    Runner hooks (``on_call_start``/``on_call_end``) run on the loop thread around each call: they
    must not block.
    """

    def __init__(
        self,
        capacity: int,
        clock: Clock,
        *,
        name: str = "pc",
        hooks: Hooks | None = None,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if loop is not None and loop_factory is not None:
            raise ConfigurationError(
                "Options.loop_factory makes the loop of the private-loop runner; handlers on the "
                "caller's loop (async with ParallelConsumer(...)) run on that loop: remove "
                "loop_factory"
            )
        self.capacity = capacity
        #: The caller's loop (the application's), or None for a loop of the runner's own.
        self._callers_loop = loop
        self._loop_factory = loop_factory or asyncio.new_event_loop
        self.backlog = max(1, capacity // 4)
        self._clock = clock
        self._name = name
        self._hooks = hooks or NoHooks()
        #: None for hooks nobody wrote (NoHooks): two calls per record saved on the loop.
        active = active_hooks(self._hooks)
        self._on_call_start = self._hooks.on_call_start if "on_call_start" in active else None
        self._on_call_end = self._hooks.on_call_end if "on_call_end" in active else None
        self._lock = threading.Lock()
        self._queued: deque[tuple[int, PollContext]] = deque()  # guarded by _lock
        self._open = True  # guarded by _lock
        self._wake_pending = False  # guarded by _lock: a _on_wake is scheduled on the loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._handler: Handler | None = None
        self._done: Callable[[RunnerReport], None] | None = None
        # -- loop thread only --
        #: The task of each call in flight, with its context.
        #: (None while its task is being created: an eager task may end inside create_task.)
        self._running: dict[int, tuple[asyncio.Task[None] | None, PollContext]] = {}
        self._reasons: dict[int, BaseException] = {}
        #: Results of calls that ended in this pass of the loop, reported together at its end
        #: (:meth:`_report`): one event, one wake-up of the controller, for many calls.
        self._results: list[CallResult] = []
        self._halted = False  # set by stop(), through the loop: the loop is to end
        #: On the caller's loop: the wind-down that stop() scheduled (loop thread only).
        self._winding_down: asyncio.Task[bool] | None = None
        self._lag: LagWatch | None = None  # the private loop's

    # -- any thread -------------------------------------------------------------------------------

    def start(self, handler: Handler, done: Callable[[RunnerReport], None]) -> None:
        self._handler = handler
        self._done = done
        if self._callers_loop is not None:
            if self._callers_loop.is_closed():
                raise ConfigurationError("the event loop given for the handlers is closed")
            self._loop = self._callers_loop
            return
        loop = new_loop(self._loop_factory)
        ready = threading.Event()
        thread = threading.Thread(
            target=self._run_loop, args=(loop, ready), name=f"{self._name}-aio-loop", daemon=True
        )
        self._loop = loop
        self._thread = thread
        thread.start()
        ready.wait()

    def submit(self, batch: int, context: PollContext) -> None:
        self.submit_many(((batch, context),))

    @property
    def features(self) -> RunnerFeatures:
        """Many single calls at once; no chunks (a task per call needs no hand-over batching)."""
        return RunnerFeatures(many=self)

    def submit_many(self, calls: Iterable[tuple[int, PollContext]]) -> None:
        """:meth:`submit` for each of ``calls``, in order, with one take of the lock."""
        with self._lock:
            if not self._open:
                return
            self._queued.extend(calls)
            if self._wake_pending:
                return  # the loop will take these with the others: one wake-up per burst
            self._wake_pending = True
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._on_wake)
        except RuntimeError as exc:  # (only the caller's loop can close under a running runner)
            raise ParallelConsumerError(
                "the event loop the async handlers run on closed while the consumer was running: "
                "close the consumer before its loop ends (async with ParallelConsumer(...))"
            ) from exc

    def cancel_queued(self) -> list[int]:
        with self._lock:
            taken = [batch for batch, _ in self._queued]
            self._queued.clear()
        return taken

    def cancel(self, batch: int, error: BaseException | None = None) -> None:
        reason = error if error is not None else CallCancelled(f"handler call {batch} cancelled")
        with self._lock:
            context = self._take_queued(batch)
            open_ = self._open
        if context is not None:
            # Never started: it ends here, failed, so the controller gets its records back.
            assert self._done is not None
            self._done(WorkDone(batch, (reason,) * len(context), None, self._clock.monotonic()))
            return
        if open_ and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._cancel_task, batch, reason)

    def stop(self, timeout: float) -> bool:
        with self._lock:
            was_open = self._open
            self._open = False
            self._queued.clear()
        if self._callers_loop is not None:
            return self._stop_on_callers_loop(was_open, timeout)
        loop, thread = self._loop, self._thread
        if not was_open or loop is None or thread is None or not thread.is_alive():
            return True
        in_time = False
        try:
            wind_down = asyncio.run_coroutine_threadsafe(self._wind_down(timeout), loop)
            in_time = wind_down.result(timeout + CANCEL_GRACE + 1.0)
        except concurrent.futures.TimeoutError:
            log.warning(
                "the event loop of %s did not answer within %.1fs: a handler blocks it "
                "(time.sleep, a synchronous client, heavy CPU?)",
                self._name,
                timeout + CANCEL_GRACE + 1.0,
            )
        finally:
            with contextlib.suppress(RuntimeError):  # already closed
                loop.call_soon_threadsafe(self._halt)
            thread.join(CANCEL_GRACE)
        return in_time

    def _stop_on_callers_loop(self, was_open: bool, timeout: float) -> bool:
        """stop() on the caller's loop: schedule the wind-down there and return at once. The
        caller (the controller thread) must not wait for a loop that may be waiting for it (a
        handler or route asking for ``health()``); :meth:`ended` awaits the wind-down."""
        loop = self._loop
        if not was_open or loop is None:
            return True
        try:
            loop.call_soon_threadsafe(self._begin_wind_down, timeout)
        except RuntimeError:  # the loop closed: its tasks are gone with it
            log.warning("the event loop of %s closed before the consumer: calls lost", self._name)
            return False
        return True

    async def ended(self) -> None:
        """On the caller's loop, once :meth:`stop` was called: wait until every call has ended
        and reported (those still running after the stop's timeout are cancelled). Cancelling
        the waiter leaves the wind-down running."""
        if self._loop is None:
            return
        task = self._begin_wind_down(0.0)
        await asyncio.shield(task)

    def _begin_wind_down(self, timeout: float) -> asyncio.Task[bool]:
        """The wind-down task on the caller's loop, started once: what stop() asked for."""
        assert self._loop is not None
        if self._winding_down is None:
            self._winding_down = self._loop.create_task(self._wind_down_and_end(timeout))
        return self._winding_down

    async def _wind_down_and_end(self, timeout: float) -> bool:
        in_time = await self._wind_down(timeout)
        # Calls that ignored their cancellation past CANCEL_GRACE end here, failed: the engine
        # is closing and will not hear from them again.
        for batch, (_, context) in list(self._running.items()):
            self._end(batch, context, None, CallCancelled("the runner stopped"))
        self._report()
        return in_time

    def _take_queued(self, batch: int) -> PollContext | None:
        """Under ``_lock``: remove ``batch`` from the queue if it is still there."""
        for index, (queued, context) in enumerate(self._queued):
            if queued == batch:
                del self._queued[index]
                return context
        return None

    # -- the loop thread --------------------------------------------------------------------------

    def _run_loop(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        # Our own executor for run_in_executor(None, ...) and asyncio.to_thread, so the loop
        # can end without waiting for its threads: a blocking call cannot be interrupted, and
        # loop.shutdown_default_executor() would keep this thread (and the loop) alive after
        # close() for as long as one runs. Like a thread runner's call, it finishes on its own;
        # its result goes nowhere (its task was cancelled and the loop is closed).
        blocking = concurrent.futures.ThreadPoolExecutor(
            thread_name_prefix=f"{self._name}-aio-blocking"
        )
        loop.set_default_executor(blocking)
        loop.call_soon(ready.set)
        self._lag = LagWatch(loop, f"{self._name}-aio-loop")
        loop.call_soon(self._lag.check, loop.time())
        try:
            self._run_until_halted(loop)
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                # Calls that never ended (one that ignored its cancellation past CANCEL_GRACE)
                # end here: the loop that would have run them is gone.
                for batch, (_, context) in list(self._running.items()):
                    self._end(batch, context, None, CallCancelled("the runner stopped"))
                self._report()  # calls that ended in the loop's last passes
                blocking.shutdown(wait=False, cancel_futures=True)
                asyncio.set_event_loop(None)
                loop.close()

    def _run_until_halted(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the loop until :meth:`_halt`, whatever escapes it meanwhile.

        asyncio lets SystemExit and KeyboardInterrupt out of ``run_forever`` when a task raises
        them, even a task nobody here created: ``wait_for``, ``gather`` and ``create_task`` in a
        handler wrap its coroutines in tasks, and ``sys.exit()`` in one would end this thread
        and strand every call in flight. The task still holds the exception, so whoever awaits
        it (the handler) gets it, and :func:`_call` makes it the failure of that one call; the
        loop resumes where it stopped (the callbacks not run yet are still queued)."""
        while True:
            try:
                loop.run_forever()
            except (SystemExit, KeyboardInterrupt) as exc:
                log.error(
                    "%r escaped a task on the event loop %s-aio-loop; the call that awaited "
                    "it fails, the others go on",
                    exc,
                    self._name,
                )
            if self._halted:
                return

    def _halt(self) -> None:
        self._report()  # (the loop stops after this pass: report what ended in it)
        self._halted = True
        assert self._loop is not None
        self._loop.stop()

    def _on_wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        self._fill()

    def _fill(self) -> None:
        """Start queued calls while there is room."""
        with self._lock:
            if not self._open:
                return
            room = self.capacity - len(self._running)
            taken = [self._queued.popleft() for _ in range(min(room, len(self._queued)))]
        loop = self._loop
        assert loop is not None
        create_task = loop.create_task
        running = self._running
        call = self._call
        on_call_start = self._on_call_start
        for batch, context in taken:
            if on_call_start is not None:
                on_call_start(batch, context)
                if not self._open:  # stop() came while the hook ran: this call never starts
                    return
            running[batch] = (None, context)
            task = create_task(call(batch, context))
            if batch in running:  # (an eager task that ended at once has reported already)
                running[batch] = (task, context)

    async def _call(self, batch: int, context: PollContext) -> None:
        """One handler call, which reports its own outcome as it ends (no done callback: one
        pass of the loop less per call). Only a cancellation of the call's own task propagates,
        once reported; anything else is the call's outcome, even SystemExit or
        KeyboardInterrupt, which would otherwise stop the whole loop. A task whose first step
        comes after stop() (the loop was blocked meanwhile) never calls the handler; a task
        cancelled before its first step never runs this body (:meth:`_cancel_task` reports
        it)."""
        value: object = None
        error: BaseException | None = None
        if not self._open:
            error = CallCancelled("the runner stopped before the call started")
        else:
            try:
                value = self._handler(context)  # type: ignore[misc]
                if type(value) is _Coroutine or inspect.isawaitable(value):
                    value = await value
                elif (wrong := not_a_result(value)) is not None:
                    value, error = None, wrong  # an async generator: nothing ran
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    reason = self._reasons.get(batch) or CallCancelled("handler call cancelled")
                    self._end(batch, context, None, reason)
                    raise
                value, error = None, exc  # a cancellation of the handler's own making
            except Exception as exc:
                value, error = None, exc
            except GeneratorExit as exc:
                # The coroutine is being closed: a task that outlived its loop (there is no one
                # to report to), or a handler that raised it (a failure like any other). Either
                # way it must go on: a coroutine may not swallow GeneratorExit.
                if not self._halted:
                    self._end(batch, context, None, exc)
                    task = asyncio.current_task()
                    if task is not None:  # (its exception is reported: asyncio need not log it)
                        task.add_done_callback(_retrieve)
                raise
            except BaseException as exc:
                log.error(
                    "async handler raised %r for %r; treating it as a failure of the call",
                    exc,
                    context,
                )
                value, error = None, exc
        self._end(batch, context, value, error)

    def _end(
        self, batch: int, context: PollContext, value: object, error: BaseException | None
    ) -> None:
        """Call ``batch`` ended: its outcome joins the next report (which also starts queued
        calls in the room it leaves); a second report of the same call does nothing."""
        if self._running.pop(batch, None) is None:
            return  # reported already
        self._reasons.pop(batch, None)
        on_call_end = self._on_call_end
        if on_call_end is not None:
            on_call_end(batch, context, error)
        partial = error is None and bool(context._failed)  # has_failures, without a call
        results = self._results
        results.append((batch, context.outcomes(error), value, self._clock.monotonic(), partial))
        if self._halted:
            self._report()  # (the loop is stopping: a report scheduled now might never run)
        elif len(results) == 1:
            assert self._loop is not None
            self._loop.call_soon(self._report)

    def _report(self) -> None:
        """Report the calls that ended since the last report, and start queued calls in their
        place: scheduled by the first of them, it runs after the callbacks already due (the
        other tasks that ended meanwhile), so one take of the lock serves them all."""
        results, self._results = self._results, []
        try:
            if self._queued:
                self._fill()
        finally:
            if results:
                self._send(results)

    def _send(self, results: list[CallResult]) -> None:
        assert self._done is not None
        if len(results) == 1:
            self._done(WorkDone(*results[0]))
        else:
            # (service 0.0: not measured; only the thread runner's chunks measure it)
            self._done(WorkDoneMany(results, 0.0))

    def _cancel_task(self, batch: int, reason: BaseException | None) -> None:
        """Cancel call ``batch``'s task if it still runs. A task cancelled before its first step
        never runs :meth:`_call`'s body, so a done callback reports the call too (with the
        latest reason); whichever comes second finds the call reported and does nothing."""
        task, context = self._running.get(batch, (None, None))
        if task is None or context is None or task.done():
            return  # it ended meanwhile and reported its own outcome
        if reason is not None:
            self._reasons[batch] = reason
        task.add_done_callback(functools.partial(self._cancelled_ended, batch, context))
        task.cancel()

    def _cancelled_ended(self, batch: int, context: PollContext, _: asyncio.Task[None]) -> None:
        reason = self._reasons.get(batch) or CallCancelled("handler call cancelled")
        self._end(batch, context, None, reason)

    async def _wind_down(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the running calls, then cancel the rest."""
        tasks = [task for task, _ in self._running.values() if task is not None]
        if not tasks:
            return True
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, timeout))
        if not pending:
            return True
        log.warning(
            "cancelling %d async handler calls still running at close (their records are not "
            "committed and will be processed again)",
            len(pending),
        )
        for batch in list(self._running):
            self._cancel_task(batch, None)
        _, stuck = await asyncio.wait(pending, timeout=CANCEL_GRACE)
        if stuck:
            log.warning(
                "%d async handler calls did not end within %.1fs of their cancellation",
                len(stuck),
                CANCEL_GRACE,
            )
        return False

    @property
    def blocked_loop_count(self) -> int:
        """How often the private loop was found blocked for longer than LAG_WARNING."""
        return self._lag.blocked_count if self._lag is not None else 0

    def __repr__(self) -> str:
        state = "open" if self._open else "stopped"
        where = "caller's loop" if self._callers_loop is not None else "own loop"
        return (
            f"<AsyncioRunner {where} {state} running={len(self._running)}/{self.capacity} "
            f"queued={len(self._queued)}>"
        )


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark the exception of ``task`` as seen (its call reported it as its failure)."""
    if not task.cancelled():
        task.exception()
