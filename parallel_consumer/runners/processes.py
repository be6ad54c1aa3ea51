"""The process runner: a plain, picklable handler in ``processes`` worker processes, for CPU-bound
work that threads cannot run in parallel (the GIL).

Worker processes are started with ``multiprocessing``'s *spawn* method, never *fork*: the parent
has threads and a librdkafka client, which a forked child would inherit in an unusable state.
Spawn starts a fresh interpreter that imports the handler by name, so the handler must be a
module-level function (or another picklable callable), and a script that starts a consumer must
do so under ``if __name__ == "__main__":`` (the child imports the main module again).

One thread, ``<name>-proc-pool``, owns the workers: it ships calls to them, reads their results,
and replaces a worker that died. It never waits for a worker to read: each worker has a feeder
thread (``<name>-proc-feed-<i>``) that writes its messages to its pipe. To keep the cost per
record low, calls and results travel in chunks: a worker holds up to ``PER_WORKER`` calls (one
running, the others waiting in its own queue), several go in one message, and a worker sends
back what it finished in one message. The handles on the worker processes (start, pipes,
feeder threads, terminate) are in ``_process_handles.py``; the code the workers run is in
``_process_worker.py``.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from parallel_consumer._clock import Clock
from parallel_consumer._events import RunnerReport, WorkDone
from parallel_consumer.context import PollContext
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.hooks import Hooks, NoHooks
from parallel_consumer.runners._process_handles import (
    KILL_GRACE,
    WorkerHandle,
    close,
    could_not_start,
    pickled_handler,
    send,
    spawn,
    start_all,
    terminate,
)
from parallel_consumer.runners._process_worker import (
    DetachedRecord,
    RemoteError,
    WorkerCrashed,
    pack_records,
    unpack_result,
)
from parallel_consumer.runners.base import NO_FEATURES, CallCancelled, Handler, RunnerFeatures

__all__ = [
    "DetachedRecord",
    "ProcessRunner",
    "RemoteError",
    "WorkerCrashed",
    "default_processes",
    "pickled_handler",
]

log = logging.getLogger("parallel_consumer")

#: Calls a worker process holds at once: one running, the rest waiting in its queue, so it starts
#: the next without a round trip and calls travel several to a message.
PER_WORKER = 8
#: A replacement worker that exits before it loaded the handler is started again after this
#: many seconds, doubling with each failure in a row up to RESPAWN_DELAY_MAX: the cause (the
#: handler's module changed or broke under a running consumer) rarely goes away by itself.
RESPAWN_DELAY = 10.0
RESPAWN_DELAY_MAX = 300.0


class ProcessRunner:
    """``processes`` worker processes, each running one call at a time.

    ``capacity`` is ``processes``; ``backlog`` lets each worker hold ``PER_WORKER - 1`` more
    calls. Calls submitted and not shipped yet wait in a queue shared with the controller thread
    (guarded by ``_lock`` with the open/closed gate and the stop deadline); the workers and
    their outstanding calls belong to the pool thread.

    Runner hooks run in the parent on the pool thread: ``on_call_start`` when a call is shipped
    to a worker, ``on_call_end`` when its result arrives.
    """

    def __init__(
        self,
        processes: int,
        clock: Clock,
        *,
        name: str = "pc",
        hooks: Hooks | None = None,
        start_method: str = "spawn",
        call_timeout: float | None = None,
    ) -> None:
        self.capacity = processes
        #: Options.processing_timeout: a call's deadline starts again when it is shipped, so
        #: waiting for a replacement worker to start does not count against it.
        self._call_timeout = call_timeout
        self._next_keep_alive = 0.0  # pool thread only
        self.backlog = processes * (PER_WORKER - 1)
        self._clock = clock
        self._name = name
        self._hooks = hooks or NoHooks()
        self._context = multiprocessing.get_context(start_method)
        self._lock = threading.Lock()
        self._pending: deque[tuple[int, PollContext]] = deque()  # guarded by _lock
        self._open = True  # guarded by _lock
        self._stop_at: float | None = None  # guarded by _lock: set by stop()
        #: Calls to end by terminating the worker process running them (guarded by _lock).
        self._kills: list[int] = []
        self._wake_pending = False  # guarded by _lock
        #: Wakes the pool thread (created by start(), closed by the pool thread as it ends).
        self._wake_r: Connection | None = None
        self._wake_w: Connection | None = None  # written under _lock
        self._handler_bytes = b""
        self._done: Callable[[RunnerReport], None] | None = None
        self._thread: threading.Thread | None = None
        # -- pool thread only (after start) --
        self._workers: list[WorkerHandle] = []
        #: Worker slots whose replacement failed to start: when to try again.
        self._respawn_at: dict[int, float] = {}
        #: Failed starts in a row per worker slot (reset once a worker loads the handler).
        self._failed_starts: dict[int, int] = {}
        self._stop_sent = False
        self._in_time = True
        #: Worker processes started to replace one that died.
        self.restarts = 0

    # -- any thread -------------------------------------------------------------------------------

    def start(self, handler: Handler, done: Callable[[RunnerReport], None]) -> None:
        """Start the workers and wait until each has loaded the handler."""
        self._handler_bytes = pickled_handler(handler)
        self._done = done
        try:
            self._wake_r, self._wake_w = self._context.Pipe(duplex=False)
        except OSError as exc:  # too many open files (EMFILE), ...
            raise ConfigurationError(
                f"runner='process': {could_not_start(0, self.capacity, exc)}"
            ) from exc
        try:
            workers = start_all(self.capacity, self._spawn)
        except BaseException:
            self._close_wake()
            raise
        self._workers = workers
        self._thread = threading.Thread(
            target=self._serve, name=f"{self._name}-proc-pool", daemon=True
        )
        self._thread.start()

    #: Single calls only.
    features: RunnerFeatures = NO_FEATURES

    def submit(self, batch: int, context: PollContext) -> None:
        with self._lock:
            if not self._open:
                return
            self._pending.append((batch, context))
            self._wake()

    def cancel_queued(self) -> list[int]:
        """Takes back the calls not shipped to a worker yet; calls a worker holds still run."""
        with self._lock:
            taken = [batch for batch, _ in self._pending]
            self._pending.clear()
        return taken

    def cancel(self, batch: int, error: BaseException | None = None) -> None:
        """Drops ``batch`` if no worker has it yet (it then reports ``error``). A call inside a
        worker process cannot be interrupted there, so the worker process is terminated and a
        replacement started: the call (and any other the worker held) reports
        :class:`WorkerCrashed`. This is how a call past its deadline ends."""
        with self._lock:
            context = None
            for index, (queued, queued_context) in enumerate(self._pending):
                if queued == batch:
                    del self._pending[index]
                    context = queued_context
                    break
            if context is None and self._open:
                self._kills.append(batch)
                self._wake()
        if context is not None:
            reason = error or CallCancelled(f"handler call {batch} cancelled")
            assert self._done is not None
            self._done(WorkDone(batch, (reason,) * len(context), None, self._clock.monotonic()))

    def stop(self, timeout: float) -> bool:
        thread = self._thread
        with self._lock:
            if not self._open:
                return self._in_time
            self._open = False
            self._pending.clear()
            self._stop_at = time.monotonic() + timeout
            self._wake()
        if thread is None:
            return True
        thread.join(timeout + KILL_GRACE + 5.0)
        if thread.is_alive():  # pragma: no cover - the pool thread never blocks that long
            log.warning("the process pool of %s did not stop", self._name)
            return False
        return self._in_time

    def _wake(self) -> None:
        """Under ``_lock``: make sure the pool thread looks at the shared state soon."""
        if not self._wake_pending and self._wake_w is not None:
            self._wake_pending = True
            self._wake_w.send_bytes(b"w")

    def _close_wake(self) -> None:
        with self._lock:
            for end in (self._wake_r, self._wake_w):
                if end is not None:
                    end.close()
            self._wake_r = self._wake_w = None

    # -- the pool thread --------------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while self._serve_once():
                pass
        except BaseException:  # pragma: no cover - a bug in this module
            # Loud, not silent: its calls stay in flight, which the engine's stall report shows.
            log.exception("the process pool of %s failed", self._name)
            raise
        finally:
            for worker in self._workers:
                terminate(worker)
                close(worker)
            self._workers = []
            self._close_wake()

    def _serve_once(self) -> bool:
        """Wait for something to happen and handle it; False once stopped."""
        with self._lock:
            stop_at = self._stop_at
        timeout: float | None = None
        if stop_at is not None:
            if not self._stop_sent:
                self._stop_sent = True
                for worker in self._workers:
                    send(worker, ("stop",))
            if not self._workers:
                return False
            timeout = stop_at - time.monotonic()
            if timeout <= 0:
                self._terminate_after_timeout()
                return False
        else:
            if self._call_timeout is not None:
                timeout = self._keep_queued_alive(self._call_timeout)
            respawn = self._respawn_due()
            if respawn is not None and (timeout is None or respawn < timeout):
                timeout = respawn
        owners: dict[Any, WorkerHandle] = {}
        for worker in self._workers:
            owners[worker.results] = worker
            owners[worker.process.sentinel] = worker
        wake = self._wake_r
        assert wake is not None
        for ready in wait([wake, *owners], timeout):
            if ready is wake:
                with self._lock:
                    self._wake_pending = False
                    while wake.poll():
                        wake.recv_bytes()
                continue
            worker = owners[ready]
            if worker not in self._workers:
                continue  # both its pipe and its sentinel were ready: already handled
            if ready is worker.results:
                self._read(worker)
            else:
                self._read_all(worker)
                self._exited(worker)
        self._kill_cancelled()
        self._ship()
        return True

    def _keep_queued_alive(self, call_timeout: float) -> float | None:
        """Calls waiting for a worker (one is being replaced) have not started: keep their
        deadlines from running out meanwhile. Returns how soon to do it again."""
        with self._lock:
            queued = [context for _, context in self._pending]
        if not queued:
            return None
        now = time.monotonic()
        if now >= self._next_keep_alive:
            self._next_keep_alive = now + call_timeout / 3
            for context in queued:
                context.extend_deadline(call_timeout)
        return max(0.0, self._next_keep_alive - now)

    def _respawn_due(self) -> float | None:
        """Start the replacements whose wait is over; returns how soon the next one is due."""
        if not self._respawn_at:
            return None
        now = time.monotonic()
        for index, due in sorted(self._respawn_at.items()):
            if due <= now:
                del self._respawn_at[index]
                self._replace(index)
        if not self._respawn_at:
            return None
        return max(0.0, min(self._respawn_at.values()) - now)

    def _replace(self, index: int) -> None:
        """Start a worker in slot ``index``, or schedule another try if it cannot start."""
        self.restarts += 1
        try:
            self._workers.append(self._spawn(index))
        except OSError as exc:  # too many open files or processes: a transient shortage
            log.error("could not start a replacement worker process: %s", exc)
            self._failed_start(index)

    def _failed_start(self, index: int) -> None:
        failures = self._failed_starts.get(index, 0) + 1
        self._failed_starts[index] = failures
        delay = min(RESPAWN_DELAY * 2 ** (failures - 1), RESPAWN_DELAY_MAX)
        self._respawn_at[index] = time.monotonic() + delay
        log.error(
            "a replacement worker process of %s could not start (%d time(s) in a row); trying "
            "again in %.0fs. %d of %d worker processes run meanwhile%s",
            self._name,
            failures,
            delay,
            len(self._workers),
            self.capacity,
            "" if self._workers else ": no handler call runs until one starts",
        )

    def _kill_cancelled(self) -> None:
        with self._lock:
            kills, self._kills = self._kills, []
        for batch in kills:
            for worker in self._workers:
                if batch in worker.outstanding:
                    log.warning(
                        "terminating worker process %s (pid %s): its handler call %d was "
                        "cancelled (past its deadline); a replacement starts",
                        worker.process.name,
                        worker.process.pid,
                        batch,
                    )
                    worker.killed = True
                    terminate(worker)
                    self._read_all(worker)
                    self._exited(worker)
                    break

    def _read(self, worker: WorkerHandle) -> None:
        try:
            message = worker.results.recv()
        except (EOFError, OSError):
            self._exited(worker)
            return
        except Exception:  # pragma: no cover - messages hold only ints and bytes
            # Never let it end the pool thread: end that worker (its calls report
            # WorkerCrashed and are retried), and a replacement starts.
            log.exception("unreadable message from worker process %s", worker.process.name)
            terminate(worker)
            self._exited(worker)
            return
        kind = message[0]
        if kind == "extend":
            context = worker.outstanding.get(message[1])
            if context is not None:
                context.extend_deadline(message[2])
        elif kind == "done":
            now = self._clock.monotonic()
            done = self._done
            assert done is not None
            for batch, payload in message[1]:
                context = worker.outstanding.pop(batch, None)
                if context is None:  # pragma: no cover - already reported as failed
                    continue
                value, error, failures = unpack_result(payload)
                self._hooks.on_call_end(batch, context, error)
                if error is None and failures:
                    # Failed one by one with PollContext.fail in the worker process.
                    errors = tuple(failures.get(i) for i in range(len(context)))
                    done(WorkDone(batch, errors, value, now, True))
                else:
                    done(WorkDone(batch, (error,) * len(context), value, now))
        elif kind == "ready":
            worker.ready = True
            self._failed_starts.pop(worker.index, None)
        else:  # "load_failed": a replacement could not load the handler the first ones loaded
            log.error("a replacement worker process could not load the handler:\n%s", message[1])

    def _read_all(self, worker: WorkerHandle) -> None:
        """Results a worker sent before it exited."""
        try:
            while worker in self._workers and worker.results.poll():
                self._read(worker)
        except (EOFError, OSError):  # pragma: no cover - _read handles the end of the pipe
            pass

    def _exited(self, worker: WorkerHandle) -> None:
        if worker not in self._workers:
            return
        self._workers.remove(worker)
        process = worker.process
        process.join(KILL_GRACE)
        code, pid, name = process.exitcode, process.pid, process.name
        with self._lock:
            stopping = self._stop_at is not None
        if stopping and code == 0:
            # A clean stop: what it still held never started, and is not reported.
            close(worker)
            return
        self._fail_outstanding(worker, worker.exit_error(code))
        close(worker)
        if stopping:
            return
        if not worker.ready:
            # It never loaded the handler (load_failed, or it died importing): a replacement
            # started now would fail the same way, in a loop.
            self._failed_start(worker.index)
            return
        if not worker.killed:
            log.error(
                "worker process %s (pid %s) exited with code %s; its calls are reported failed "
                "and retried; starting a replacement",
                name,
                pid,
                code,
            )
        self._replace(worker.index)

    def _fail_outstanding(self, worker: WorkerHandle, error: BaseException) -> None:
        now = self._clock.monotonic()
        done = self._done
        assert done is not None
        for batch, context in worker.outstanding.items():
            self._hooks.on_call_end(batch, context, error)
            done(WorkDone(batch, (error,) * len(context), None, now))
        worker.outstanding.clear()

    def _terminate_after_timeout(self) -> None:
        for worker in list(self._workers):
            if worker.outstanding:
                self._in_time = False
            worker.cut_off = True
            terminate(worker)
            self._read_all(worker)  # may find its end and report it as exited
            if worker.outstanding:
                self._fail_outstanding(worker, CallCancelled("the worker was stopped at close"))
        if not self._in_time:
            log.warning("worker processes of %s were still running calls at close", self._name)

    def _ship(self) -> None:
        """Hand waiting calls to the workers with room, the least loaded first."""
        hooks = self._hooks
        while True:
            workers = [w for w in self._workers if w.ready and not w.closed]
            if not workers:
                return
            worker = min(workers, key=lambda w: len(w.outstanding))
            room = PER_WORKER - len(worker.outstanding)
            with self._lock:
                if not self._pending or room <= 0 or not self._open:
                    return
                share = min(room, math.ceil(len(self._pending) / len(workers)))
                chunk = [self._pending.popleft() for _ in range(share)]
            calls = []
            for batch, context in chunk:
                try:
                    records = pack_records(context.records)
                except TypeError as exc:
                    # It cannot travel, now or ever: it fails here, like a handler error, and
                    # takes the failure path (retry, dead letter) without reaching a worker.
                    self._report_unsent(batch, context, exc)
                    continue
                if self._call_timeout is not None:
                    context.extend_deadline(self._call_timeout)
                hooks.on_call_start(batch, context)
                worker.outstanding[batch] = context
                calls.append((batch, records))
            # A failed send leaves the calls outstanding: the worker's exit reports them.
            if calls:
                send(worker, ("calls", calls))

    def _report_unsent(self, batch: int, context: PollContext, error: BaseException) -> None:
        assert self._done is not None
        self._done(WorkDone(batch, (error,) * len(context), None, self._clock.monotonic()))

    def _spawn(self, index: int) -> WorkerHandle:
        return spawn(self._context, index, self._handler_bytes, self._name)

    def __repr__(self) -> str:
        state = "open" if self._open else "stopped"
        return (
            f"<ProcessRunner {state} workers={len(self._workers)}/{self.capacity} "
            f"pending={len(self._pending)} restarts={self.restarts}>"
        )


def default_processes() -> int:
    return os.cpu_count() or 1
