"""The default runner: a fixed pool of worker threads calling a plain function."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from parallel_consumer._clock import Clock
from parallel_consumer._events import CallResult, WorkDone, WorkDoneMany
from parallel_consumer.context import PollContext
from parallel_consumer.hooks import Hooks, NoHooks
from parallel_consumer.runners.base import CallCancelled, Handler, not_a_result

__all__ = ["ThreadRunner"]

log = logging.getLogger("parallel_consumer")

Call = tuple[int, PollContext]
#: One call, a chunk of calls run one after another on one worker, or None (stop).
_Task = Call | list[Call] | None


class ThreadRunner:
    """``capacity`` worker threads named ``<name>-worker-<i>``, each owning only its current call.

    Worker threads are daemons: a handler that never returns cannot keep the interpreter alive
    after ``close()`` gave up waiting for it. A gate decides, under a lock, whether a dequeued
    call may start: once :meth:`stop` closed it, no handler call starts any more.
    """

    def __init__(
        self, capacity: int, clock: Clock, *, name: str = "pc", hooks: Hooks | None = None
    ) -> None:
        self.capacity = capacity
        self.backlog = max(1, capacity // 4)
        self._clock = clock
        self._name = name
        self._hooks = hooks or NoHooks()
        #: False for NoHooks: two calls per record saved on the hot path.
        self._has_hooks = type(self._hooks) is not NoHooks
        #: Calls inside the handler right now (set and read under the GIL: one add and one
        #: discard per call).
        self._running: set[int] = set()
        #: Calls cancelled before they started: a worker that takes one reports it cancelled
        #: instead of running it.
        self._cancelled: set[int] = set()
        self._tasks: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._gate = threading.Lock()
        self._open = True  # guarded by _gate

    def start(self, handler: Handler, done: Callable[[WorkDone], None]) -> None:
        for index in range(self.capacity):
            thread = threading.Thread(
                target=self._work,
                args=(handler, done),
                name=f"{self._name}-worker-{index}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def submit(self, batch: int, context: PollContext) -> None:
        self._tasks.put((batch, context))

    def submit_chunk(self, calls: list[Call]) -> None:
        """Run ``calls`` one after another on one worker and report them as one
        :class:`WorkDoneMany`: one thread hop each way for many short calls. The controller
        never puts two records of one lane in a chunk, so order is unchanged."""
        self._tasks.put(calls)

    def cancel_queued(self) -> list[int]:
        cancelled: list[int] = []
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return cancelled
            if isinstance(task, list):
                cancelled.extend(batch for batch, _ in task)
            elif task is not None:
                cancelled.append(task[0])

    def running(self, batch: int) -> bool:
        """Whether call ``batch`` is inside the handler now (not queued, not finished)."""
        return batch in self._running

    def cancel(self, batch: int, error: BaseException | None = None) -> None:
        """A call not started yet never starts (it is reported cancelled when a worker takes
        it); a running call runs on: a Python thread cannot be interrupted."""
        if batch not in self._running:
            self._cancelled.add(batch)

    def stop(self, timeout: float) -> bool:
        with self._gate:
            self._open = False
        self.cancel_queued()
        for _ in self._threads:
            self._tasks.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            log.warning("handler calls still running after %.1fs: %s", timeout, ", ".join(alive))
        return not alive

    def _work(self, handler: Handler, done: Callable[[WorkDone], None]) -> None:
        tasks = self._tasks
        while True:
            task = tasks.get()
            if task is None:
                return
            if isinstance(task, list):
                if not self._run_chunk(handler, done, task):
                    return
            elif not self._run_one(handler, done, *task):
                return

    def _run_one(
        self, handler: Handler, done: Callable[[WorkDone], None], batch: int, context: PollContext
    ) -> bool:
        started = time.perf_counter()
        result = self._call(handler, batch, context)
        if result is None:
            return False
        done(WorkDone(*result, took=time.perf_counter() - started))
        return True

    def _run_chunk(
        self, handler: Handler, done: Callable[[WorkDone], None], calls: list[Call]
    ) -> bool:
        """Returns False once stopped: calls not started then are never reported (the controller
        takes them back on close, like queued ones)."""
        started = time.perf_counter()
        results: list[CallResult] = []
        call = self._call
        for batch, context in calls:
            result = call(handler, batch, context)
            if result is None:
                break
            results.append(result)
        if results:
            service = (time.perf_counter() - started) / len(results)
            done(WorkDoneMany(results, service))  # type: ignore[arg-type]
        return len(results) == len(calls)

    def _call(self, handler: Handler, batch: int, context: PollContext) -> CallResult | None:
        """One handler call with its hooks; None when the runner was stopped before it began."""
        gate = self._gate
        hooks = self._hooks
        with gate:
            if not self._open:
                return None
        if self._has_hooks:
            hooks.on_call_start(batch, context)
            # Again, right before the call: stop() may have come while the hook ran.
            with gate:
                if not self._open:
                    return None
        error: BaseException | None = None
        value: object = None
        cancelled = self._cancelled
        if cancelled and batch in cancelled:
            cancelled.discard(batch)
            error = CallCancelled("cancelled before it started (the engine gave up on it)")
            return batch, (error,) * len(context), None, self._clock.monotonic(), False
        running = self._running
        running.add(batch)
        try:
            value = handler(context)
            if value is not None and (wrong := not_a_result(value)) is not None:
                value, error = None, wrong
        except Exception as exc:
            error = exc
        except BaseException as exc:
            # SystemExit / KeyboardInterrupt raised by a handler would silently end this
            # worker and strand its records in flight: count it as a failure instead.
            log.error(
                "handler raised %r for %r; treating it as a failure of the call", exc, context
            )
            error = exc
        running.discard(batch)
        if cancelled:
            cancelled.discard(batch)  # cancelled while it was being started: it ran anyway
        if self._has_hooks:
            hooks.on_call_end(batch, context, error)
        partial = error is None and context.has_failures
        return batch, context.outcomes(error), value, self._clock.monotonic(), partial

    def __repr__(self) -> str:
        alive = sum(t.is_alive() for t in self._threads)
        state = "open" if self._open else "stopped"
        return (
            f"<ThreadRunner {state} workers={alive}/{self.capacity} queued~{self._tasks.qsize()}>"
        )
