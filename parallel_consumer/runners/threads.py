"""The default runner: a fixed pool of worker threads calling a plain function."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

from parallel_consumer._clock import Clock
from parallel_consumer._events import WorkDone
from parallel_consumer.context import PollContext
from parallel_consumer.runners.base import Handler
from parallel_consumer.work.item import WorkItem

__all__ = ["ThreadRunner"]

log = logging.getLogger("parallel_consumer")

_Task = tuple[Sequence[WorkItem], PollContext] | None


class ThreadRunner:
    """``capacity`` worker threads named ``<name>-worker-<i>``, each owning only its current call.

    Worker threads are daemons: a handler that never returns cannot keep the interpreter alive
    after ``close()`` gave up waiting for it.
    """

    def __init__(self, capacity: int, clock: Clock, *, name: str = "pc") -> None:
        self.capacity = capacity
        self.backlog = max(1, capacity // 4)
        self._clock = clock
        self._name = name
        self._tasks: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

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

    def submit(self, items: Sequence[WorkItem], context: PollContext) -> None:
        self._tasks.put((items, context))

    def stop(self, timeout: float) -> bool:
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
        monotonic = self._clock.monotonic
        while True:
            task = tasks.get()
            if task is None:
                return
            items, context = task
            try:
                handler(context)
            except Exception as exc:
                done(WorkDone(items, exc, monotonic()))
            except BaseException as exc:
                # SystemExit / KeyboardInterrupt raised by a handler would silently end this
                # worker and strand its records in flight: count it as a failure instead.
                log.error("handler raised %r; treating it as a failure of the call", exc)
                done(WorkDone(items, exc, monotonic()))
            else:
                done(WorkDone(items, None, monotonic()))

    def __repr__(self) -> str:
        alive = sum(t.is_alive() for t in self._threads)
        return f"<ThreadRunner workers={alive}/{self.capacity} queued~{self._tasks.qsize()}>"
