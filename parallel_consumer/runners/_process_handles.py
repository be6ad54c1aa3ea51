"""The process pool's handles on its worker processes (parent side; the child runs
``_process_worker.py``): start one with its pipes and feeder thread, wait until it loaded the
handler, queue messages for it, and close or terminate it.

Each worker has a feeder thread (``<name>-proc-feed-<i>``) that writes its messages to its task
pipe, so the pool thread never waits for a worker to read.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from parallel_consumer.context import PollContext
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.runners._process_worker import WorkerCrashed, worker_main
from parallel_consumer.runners.base import CallCancelled, Handler

__all__ = [
    "KILL_GRACE",
    "START_TIMEOUT",
    "WorkerHandle",
    "await_ready",
    "close",
    "could_not_start",
    "pickled_handler",
    "send",
    "spawn",
    "start_all",
    "terminate",
]

log = logging.getLogger("parallel_consumer")

#: How long start() waits for the workers to load the handler.
START_TIMEOUT = 60.0
#: After stop's timeout, how long a terminated worker may take to exit before it is killed.
KILL_GRACE = 1.0


@dataclass(eq=False)
class WorkerHandle:
    """The pool's handle on one worker process: the process, its pipes and its feeder thread,
    and the calls it holds (owned by the pool thread)."""

    index: int
    process: BaseProcess
    #: Messages for the worker, pickled, on their way to its task pipe (None: no more). Its
    #: feeder thread owns the task pipe.
    outbox: queue.SimpleQueue[bytes | None]
    feeder: threading.Thread
    results: Connection  # worker -> parent
    #: Calls shipped and not reported yet, in shipping order.
    outstanding: dict[int, PollContext] = field(default_factory=dict)
    ready: bool = False
    #: Set once the worker cannot take calls (a send failed, or it was told to stop).
    closed: bool = False
    #: Terminated by the pool because a call it held was cancelled (its deadline passed).
    killed: bool = False
    #: Terminated by the pool because stop's timeout ran out: its calls were cancelled.
    cut_off: bool = False

    def exit_error(self, code: int | None) -> BaseException:
        """What the calls it held report once it exited with ``code``."""
        pid = self.process.pid
        if self.cut_off:
            return CallCancelled(
                f"worker process {pid} was stopped at close while it ran this call or held it "
                "queued"
            )
        why = "was terminated (a call it held was cancelled)" if self.killed else "exited"
        return WorkerCrashed(
            f"worker process {pid} {why} with code {code} while it ran this call or held it queued",
            code,
        )


def start_all(count: int, spawn: Callable[[int], WorkerHandle]) -> list[WorkerHandle]:
    """Start ``count`` workers with ``spawn`` (worker index -> handle) and wait until each has
    loaded the handler; if one cannot, a ConfigurationError says why, and nothing is left
    running."""
    workers: list[WorkerHandle] = []
    try:
        # Every worker is started before any is awaited: they load the handler in parallel.
        # One by one, so the clean-up below knows every worker started before a failure.
        for index in range(count):
            workers.append(spawn(index))  # noqa: PERF401
        deadline = time.monotonic() + START_TIMEOUT
        problem: str | None = None
        for worker in workers:
            problem = await_ready(worker, deadline)
            if problem is not None:
                break
    except OSError as exc:  # too many open files or processes (EMFILE, EAGAIN), ...
        problem = could_not_start(len(workers), count, exc)
        cause: BaseException | None = exc
    except BaseException:
        _abandon(workers)
        raise
    else:
        cause = None
    if problem is not None:
        _abandon(workers)
        raise ConfigurationError(f"runner='process': {problem}") from cause
    return workers


def could_not_start(started: int, count: int, exc: OSError) -> str:
    return (
        f"could not start the worker processes ({started} of {count} started): {exc}. Lower "
        "Options.processes, or raise the limit on open files and processes"
    )


def _abandon(workers: list[WorkerHandle]) -> None:
    """A start that failed leaves nothing running."""
    for worker in workers:
        terminate(worker)
        close(worker)


def spawn(context: Any, index: int, handler: bytes, name: str) -> WorkerHandle:
    """Start worker process ``index`` of the pool ``name``, running ``handler`` (pickled), and
    its feeder thread."""
    task_r, task_w = context.Pipe(duplex=False)
    result_r, result_w = context.Pipe(duplex=False)
    process = context.Process(
        target=worker_main,
        args=(handler, task_r, result_w),
        name=f"{name}-proc-{index}",
        daemon=True,
    )
    try:
        process.start()
    except BaseException:
        task_w.close()
        result_r.close()
        raise
    finally:
        # Only the child keeps these ends: its exit then reads as the end of our pipe.
        task_r.close()
        result_w.close()
    outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    feeder = threading.Thread(
        target=_feed, args=(task_w, outbox), name=f"{name}-proc-feed-{index}", daemon=True
    )
    feeder.start()
    return WorkerHandle(index, process, outbox, feeder, result_r)


def await_ready(worker: WorkerHandle, deadline: float) -> str | None:
    """None once ``worker`` loaded the handler, else what went wrong."""
    remaining = max(0.0, deadline - time.monotonic())
    if not wait([worker.results, worker.process.sentinel], remaining):
        return f"worker process {worker.process.name} did not start within {START_TIMEOUT:.0f}s"
    try:
        message = worker.results.recv()
    except (EOFError, OSError):
        worker.process.join(KILL_GRACE)
        return (
            f"worker process {worker.process.name} exited during start-up (exit code "
            f"{worker.process.exitcode}; its traceback is on stderr). Each worker is a fresh "
            "interpreter that imports your main module again: start the consumer under "
            "'if __name__ == \"__main__\":', and define the handler at module level"
        )
    if message[0] == "ready":
        worker.ready = True
        return None
    return f"a worker process could not load the handler:\n{message[1]}"


def send(worker: WorkerHandle, message: tuple[Any, ...]) -> None:
    """Queue ``message`` for ``worker``; never blocks. If the worker dies first, its sentinel
    tells the pool thread, and its exit reports the calls it held."""
    if worker.closed:
        return
    worker.outbox.put(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
    if message[0] == "stop":
        worker.closed = True


def _feed(tasks: Connection, outbox: queue.SimpleQueue[bytes | None]) -> None:
    """A worker's feeder thread: writes what the pool thread queued to the worker's task pipe.

    The write blocks while the pipe is full, until the worker reads, and a worker whose handler
    keeps the GIL (C code) reads nothing until that call ends: here it holds up this worker's
    messages only, never the pool thread, which goes on reading every worker's results and
    shipping to the others."""
    try:
        while (data := outbox.get()) is not None:
            tasks.send_bytes(data)
    except OSError:
        pass  # the worker died: its sentinel tells the pool thread
    finally:
        tasks.close()


def close(worker: WorkerHandle) -> None:
    """Release the pipes, the feeder thread and the process object (the process has exited or
    was terminated: a write the feeder is blocked in fails at once)."""
    worker.closed = True
    worker.outbox.put(None)
    worker.feeder.join(KILL_GRACE)
    if worker.feeder.is_alive():  # pragma: no cover - only while the process still runs
        log.warning("the feeder thread of worker process %s did not end", worker.process.name)
    worker.results.close()
    with contextlib.suppress(ValueError):  # still running: only terminate() may end it
        worker.process.close()


def terminate(worker: WorkerHandle) -> None:
    process = worker.process
    try:
        if process.is_alive():
            process.terminate()
            process.join(KILL_GRACE)
            if process.is_alive():
                process.kill()
                process.join(KILL_GRACE)
    except ValueError:  # already closed
        pass


def pickled_handler(handler: Handler) -> bytes:
    """``handler`` pickled for the worker processes, or a ConfigurationError saying why not."""
    try:
        return pickle.dumps(handler)
    except Exception as exc:
        raise ConfigurationError(
            f"runner='process' needs a handler that can be pickled (a function defined at "
            f"module level, imported by name in each worker process); {handler!r} cannot be: "
            f"{exc}. Lambdas, nested functions and closures cannot; neither can bound methods "
            "of objects holding locks, clients or sockets"
        ) from exc
