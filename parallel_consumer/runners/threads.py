"""The default runner: a fixed pool of worker threads calling a plain function."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable

from parallel_consumer._clock import Clock
from parallel_consumer._events import CallResult, RunDone, RunnerReport, WorkDone, WorkDoneMany
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.hooks import Hooks, NoHooks, active_hooks
from parallel_consumer.produce import ProducerRecord, outputs_of
from parallel_consumer.runners.base import CallCancelled, Handler, RunnerFeatures, not_a_result
from parallel_consumer.work.runs import Run, drain_left

__all__ = ["ThreadRunner"]

log = logging.getLogger("parallel_consumer")

Call = tuple[int, PollContext]


class _Chunk:
    """Calls run one after another by one worker (its owner). ``calls`` holds the ones not
    started yet and ``results`` the ones finished and not yet reported: both are deques, whose
    ``append`` and ``popleft`` are atomic, so :meth:`ThreadRunner.release_stuck` can take over
    what the owner has not started (or reported) while the owner is inside a call that hangs:
    each call is started, and each result reported, exactly once."""

    __slots__ = ("calls", "chain", "first", "results", "started")

    def __init__(self, calls: list[Call], *, chain: bool = False) -> None:
        self.calls: deque[Call] = deque(calls)
        self.results: deque[CallResult] = deque()
        #: perf_counter() when a worker took the chunk (0.0 while it waits in the queue).
        self.started = 0.0
        #: A chain: records of one lane, each to start only after the one before succeeded.
        self.chain = chain
        #: Its first call's id: the chain's name (:meth:`ThreadRunner.take_back_chain`).
        self.first = calls[0][0] if calls else 0

    def take_results(self) -> list[CallResult]:
        return drain_left(self.results)

    def take_calls(self) -> list[Call]:
        return drain_left(self.calls)


#: One call, a chunk of calls, a run, or None (stop).
_Task = Call | _Chunk | Run | None


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
        active = active_hooks(self._hooks)
        self._on_call_start = self._hooks.on_call_start if "on_call_start" in active else None
        self._on_call_end = self._hooks.on_call_end if "on_call_end" in active else None
        #: Calls inside the handler right now (set and read under the GIL: one add and one
        #: discard per call).
        self._running: set[int] = set()
        #: Calls cancelled before they started: a worker that takes one reports it cancelled
        #: instead of running it.
        self._cancelled: set[int] = set()
        self._tasks: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        #: Chunks submitted and not finished, queued or running: added when submitted (so that
        #: close finds their calls even while a worker is taking one), removed by their owner.
        self._active: set[_Chunk] = set()
        self._threads: list[threading.Thread] = []
        self._gate = threading.Lock()
        self._open = True  # guarded by _gate

    def start(self, handler: Handler, done: Callable[[RunnerReport], None]) -> None:
        self._done = done
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
        never puts two records of one lane in a chunk, so any of its calls may run on another
        worker (see :meth:`release_stuck`) without changing the order of a lane."""
        chunk = _Chunk(calls)
        self._active.add(chunk)
        self._tasks.put(chunk)

    def submit_chain(self, calls: list[Call]) -> None:
        """Run ``calls`` (consecutive records of one lane, in order) one after another on one
        worker, each only once the one before it succeeded: the next records of a lane start
        without a round trip through the controller (calls of milliseconds, where that round
        trip is most of the gap between two records of a lane). After a failed call the rest
        come back unstarted (``WorkDoneMany.unstarted``). Reported as one
        :class:`WorkDoneMany`; :meth:`release_stuck` reports the finished calls of a chain
        early, but never hands its calls to other workers, where they would overtake the call
        before them in their lane."""
        chunk = _Chunk(calls, chain=True)
        self._active.add(chunk)
        self._tasks.put(chunk)

    def take_back_chain(self, chain: int) -> tuple[list[CallResult], list[int]]:
        """Chain ``chain`` (the id of its first call) ends here for the engine, whatever its
        worker is doing (a call the engine gave up on hangs; its partition was revoked): the
        results of its calls that finished and were not reported yet, and the ids of its calls
        not started, which never will be. Its worker finishes the call it is in, if any, and
        reports that one alone. Controller thread."""
        for chunk in list(self._active):
            if chunk.chain and chunk.first == chain:
                rest = [taken for taken, _ in chunk.take_calls()]
                return chunk.take_results(), rest
        return [], []

    def take_finished(self, first: int) -> list[CallResult]:
        """The results of chunk ``first`` (the id of its first call) that its worker finished
        and has not reported yet, taken now: each is reported once, here or by the worker (a
        revoke's final commit must cover the finished calls of a bundle). Controller thread."""
        for chunk in list(self._active):
            if not chunk.chain and chunk.first == first:
                return chunk.take_results()
        return []

    @property
    def runs(self) -> bool:
        """Whether :meth:`submit_run` may be used: a run calls no per-call hook."""
        return self._on_call_start is None and self._on_call_end is None

    @property
    def features(self) -> RunnerFeatures:
        """Chunks, chains and ``running``; runs unless per-call hooks are set."""
        return RunnerFeatures(
            chunks=self,
            runs=self if self.runs else None,
            chains=self,
            running=self.running,
        )

    def submit_run(self, run: Run) -> None:
        """Run ``run``'s records one after another on one worker, in offset order, and report
        once, with a :class:`RunDone`, when they are done, when one fails (the rest is not
        started) or when the controller took the rest back (:meth:`Runs.detach`)."""
        self._tasks.put(run)

    def release_stuck(self, older_than: float, report: Callable[[WorkDoneMany], None]) -> int:
        """For each chunk a worker has run for longer than ``older_than`` seconds (a call that
        hangs, or calls that turned slow): report the calls it finished and hand the ones it
        has not started to any free worker, one by one, so that they neither wait behind a hung
        call nor run one after another while other workers are idle. Returns how many calls
        moved. Called by the controller, on its thread, with ``report`` to handle the finished
        calls at once (posted as events instead, they would miss the final commit of a revoke
        handled before them)."""
        if not self._open or not self._active:
            return 0
        now = time.perf_counter()
        moved = 0
        for chunk in list(self._active):
            started = chunk.started
            if not started or now - started <= older_than:
                continue
            moved_here = 0
            if not chunk.chain:
                for call in chunk.take_calls():
                    self._tasks.put(call)
                    moved_here += 1
            moved += moved_here
            results = chunk.take_results()
            if results or moved_here:
                # The mean time per call so far, the running one counted: it tells the
                # controller that calls are no longer short.
                service = (now - started) / (len(results) + 1)
                report(WorkDoneMany(results, service))
        return moved

    def cancel_queued(self) -> list[int]:
        cancelled: list[int] = []
        runs: list[Run] = []
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                break
            if isinstance(task, _Chunk):
                cancelled.extend(batch for batch, _ in task.take_calls())
            elif isinstance(task, Run):
                runs.append(task)
            elif task is not None:
                cancelled.append(task[0])
        for run in runs:
            # The controller takes back what a run has not started itself (Runs.detach); the
            # run goes back to the queue, and the worker that takes it reports it at once.
            self._tasks.put(run)
        for chunk in list(self._active):
            cancelled.extend(batch for batch, _ in chunk.take_calls())
        return cancelled

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
            log.warning(
                "closing without %d handler calls still running (their records are not "
                "committed and will be processed again): %s",
                len(alive),
                ", ".join(alive),
            )
        return not alive

    def _work(self, handler: Handler, done: Callable[[RunnerReport], None]) -> None:
        tasks = self._tasks
        while True:
            task = tasks.get()
            if task is None:
                return
            if isinstance(task, Run):
                run = self._run_batches if task.batched else self._run_records
                if not run(handler, done, task):
                    return
            elif isinstance(task, _Chunk):
                if not self._run_chunk(handler, done, task):
                    return
            elif not self._run_one(handler, done, *task):
                return

    def _run_one(
        self,
        handler: Handler,
        done: Callable[[RunnerReport], None],
        batch: int,
        context: PollContext,
    ) -> bool:
        started = time.perf_counter()
        result = self._call(handler, batch, context)
        if result is None:
            return False
        done(WorkDone(*result, took=time.perf_counter() - started))
        return True

    def _run_chunk(
        self, handler: Handler, done: Callable[[RunnerReport], None], chunk: _Chunk
    ) -> bool:
        """Returns False once stopped: calls not started then are never reported (the controller
        takes them back on close, like queued ones)."""
        active = self._active
        started = chunk.started = time.perf_counter()
        ran = 0
        call = self._call
        calls = chunk.calls
        chain = chunk.chain
        unstarted: list[int] = []
        stopped = False
        try:
            while True:
                try:
                    batch, context = calls.popleft()
                except IndexError:
                    break
                result = call(handler, batch, context)
                if result is None:
                    stopped = True
                    break
                chunk.results.append(result)
                ran += 1
                if chain and (result[4] or any(e is not None for e in result[1])):
                    # It failed: the lane's next records must wait for its retry.
                    unstarted = [batch for batch, _ in chunk.take_calls()]
                    break
        finally:
            active.discard(chunk)
        results = chunk.take_results()
        if results or unstarted:
            service = (time.perf_counter() - started) / max(1, ran)
            done(WorkDoneMany(results, service, unstarted))
        return not stopped

    def _run_records(
        self, handler: Handler, done: Callable[[RunnerReport], None], run: Run
    ) -> bool:
        """Call the handler for each record of ``run`` in turn until one fails, the rest is
        taken back, or the runner stops (then returns False). The hot path of short calls: no
        per-call bookkeeping but ``run.done``."""
        started = run.started = time.perf_counter()
        popleft = run.pending.popleft
        of_one = PollContext.of_one
        slow_after = run.timed
        samples: list[tuple[int, float]] = []
        ok = 0
        error: BaseException | None = None
        stopped = False
        outputs = run.outputs
        keep = outputs.append if outputs is not None else None
        while True:
            if not self._open:
                stopped = True
                break
            try:
                message = popleft()
            except IndexError:
                break
            context = of_one(RecordContext(message))
            if slow_after is not None:
                t0 = run.call_started = time.perf_counter()
            # The outcome rule of _call, inlined: this loop runs once per record.
            try:
                value = handler(context)
            except Exception as exc:
                error = exc
            except BaseException as exc:
                log.error(
                    "handler raised %r for %r; treating it as a failure of the call", exc, context
                )
                error = exc
            else:
                if value is not None and (wrong := not_a_result(value)) is not None:
                    error = wrong
                else:
                    if keep is not None:
                        # poll_and_produce: what the call returned goes to the producer,
                        # also for a record the call failed with PollContext.fail (checked
                        # here: a wrong return value fails its record like a raise).
                        if type(value) is ProducerRecord or value is None:
                            keep(value)
                        else:
                            try:
                                keep(outputs_of(value))
                            except TypeError as exc:
                                error = exc
                    if error is None and context._failed:  # has_failures, without a call
                        error = context.outcomes(None)[0]
            if slow_after is not None:
                took = time.perf_counter() - t0
                if not ok or took > slow_after or error is not None:
                    samples.append((ok, took))
            if error is not None:
                break
            ok += 1
            run.done = ok
        calls = ok + (error is not None)
        service = (time.perf_counter() - started) / calls if calls else 0.0
        done(RunDone(run, ok, error, self._clock.monotonic(), service, tuple(samples)))
        return not stopped

    def _run_batches(
        self, handler: Handler, done: Callable[[RunnerReport], None], run: Run
    ) -> bool:
        """:meth:`_run_records` for a batched run: one handler call per batch of ``run.pending``
        until a batch fails (a raise, or PollContext.fail of any of its records: the report
        carries the outcome of each of its records), the rest is taken back, or the runner
        stops (then returns False). ``run.done`` counts records; the service it reports is the
        mean time per call, as for calls of the lanes."""
        started = run.started = time.perf_counter()
        popleft = run.pending.popleft
        slow_after = run.timed
        samples: list[tuple[int, float]] = []
        ok = calls = 0
        error: BaseException | None = None
        errors: tuple[BaseException | None, ...] | None = None
        stopped = False
        while True:
            if not self._open:
                stopped = True
                break
            try:
                batch = popleft()
            except IndexError:
                break
            context = PollContext([RecordContext(message) for message in batch])
            calls += 1
            if slow_after is not None:
                t0 = run.call_started = time.perf_counter()
            try:
                value = handler(context)
            except Exception as exc:
                error = exc
            except BaseException as exc:
                log.error(
                    "handler raised %r for %r; treating it as a failure of the call", exc, context
                )
                error = exc
            else:
                if value is not None and (wrong := not_a_result(value)) is not None:
                    error = wrong
            if slow_after is not None:
                took = time.perf_counter() - t0
                if not ok or took > slow_after or error is not None or context._failed:
                    samples.append((ok, took))
            if error is not None or context._failed:
                errors = context.outcomes(error)
                error = next(e for e in errors if e is not None)
                break
            ok += len(batch)
            run.done = ok
        service = (time.perf_counter() - started) / calls if calls else 0.0
        done(RunDone(run, ok, error, self._clock.monotonic(), service, tuple(samples), errors))
        return not stopped

    def _call(self, handler: Handler, batch: int, context: PollContext) -> CallResult | None:
        """One handler call with its hooks; None when the runner was stopped before it began."""
        gate = self._gate
        with gate:
            if not self._open:
                return None
        on_call_start = self._on_call_start
        if on_call_start is not None:
            on_call_start(batch, context)
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
        on_call_end = self._on_call_end
        if on_call_end is not None:
            on_call_end(batch, context, error)
        partial = error is None and context.has_failures
        return batch, context.outcomes(error), value, self._clock.monotonic(), partial

    def __repr__(self) -> str:
        alive = sum(t.is_alive() for t in self._threads)
        state = "open" if self._open else "stopped"
        return (
            f"<ThreadRunner {state} workers={alive}/{self.capacity} queued~{self._tasks.qsize()}>"
        )
