"""The runner contract (``runners/base.py``) and the docs' promises, on the asyncio and process
runners: async handlers are recognised and awaited, a handler's SystemExit or GeneratorExit stays
contained, close() leaves no loop or call running, values that cannot cross the process pipe fail
only their own call, and worker processes that cannot load or start are handled.

Each test failed on an earlier version of the runners and now guards the fix. Handlers the process
runner uses are module-level functions: worker processes are spawned and import them by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Message

from parallel_consumer import Options, ParallelConsumer, PollContext
from parallel_consumer._clock import SystemClock
from parallel_consumer._events import WorkDone, WorkDoneMany
from parallel_consumer.context import RecordContext
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.runners import AsyncioRunner, ProcessRunner, ThreadRunner
from parallel_consumer.testing.fakes import FakeCluster

# -- process-runner handlers (module level: the worker processes import them by name) --------


class Pair(tuple):  # type: ignore[type-arg]
    """A value type that pickles, but whose unpickling fails (``__new__`` wants two arguments
    and ``tuple.__getnewargs__`` gives one): the classic custom-constructor pickling trap."""

    def __new__(cls, a: int, b: int) -> Pair:
        return super().__new__(cls, (a, b))


def worker_handler(ctx: PollContext) -> object:
    if ctx.value == b"pair":
        return Pair(ctx.offset, 0)
    if ctx.value == b"slow":
        time.sleep(0.3)
    if ctx.value == b"endless":
        time.sleep(60)
    if ctx.value == b"hold-gil":
        # CPU-bound C code that keeps the GIL (a regex backtracking here; a C parser or
        # model elsewhere): about 3.5 s on a laptop
        re.match(r"(a|aa)+$", "a" * 36 + "b")
    return ctx.offset


class Reloadable:
    """A picklable handler whose loading fails once ``marker`` exists: what a worker started
    after a deploy removed or broke the handler's module would meet."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (load_reloadable, (self.marker,))

    def __call__(self, ctx: PollContext) -> object:
        if ctx.value == b"crash":
            os._exit(1)
        return ctx.offset


def load_reloadable(marker: str) -> Reloadable:
    if os.path.exists(marker):
        raise ImportError(f"cannot import the handler any more ({marker} exists)")
    return Reloadable(marker)


# -- helpers --------------------------------------------------------------------------------------


def context(offset: int, value: object = b"v", key: bytes = b"k") -> PollContext:
    message = Message(topic="t", partition=0, offset=offset, key=key, value=value)
    return PollContext([RecordContext(message)])


class Results:
    """The ``done`` callback of a runner under test (a ``WorkDoneMany`` holds several calls'
    results: each counts as its own report)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[WorkDone] = queue.SimpleQueue()

    def __call__(self, event: WorkDone | WorkDoneMany) -> None:
        if isinstance(event, WorkDoneMany):
            for call in event.calls:
                self._queue.put(WorkDone(*call))
        else:
            self._queue.put(event)

    def take(self, count: int, timeout: float) -> dict[int, WorkDone]:
        """Up to ``count`` reports, waiting at most ``timeout`` in all."""
        deadline = time.monotonic() + timeout
        out: dict[int, WorkDone] = {}
        while len(out) < count:
            try:
                event = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            assert event.batch not in out, f"call {event.batch} reported twice"
            out[event.batch] = event
        return out


def wait_until(condition: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def consumer(cluster: FakeCluster, options: Options) -> ParallelConsumer:
    pc = ParallelConsumer(
        {"bootstrap.servers": "fake:9092", "group.id": "g"},
        options,
        consumer_factory=cluster.consumer,
    )
    pc.subscribe("t")
    return pc


def threads_named(suffix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith(suffix) and t.is_alive()]


# -- async handlers behind a decorator are awaited (they were run on the thread runner) ------------


def logged(function: Callable[[PollContext], Any]) -> Callable[[PollContext], Any]:
    """A typical synchronous decorator (logging, metrics, tracing) around any handler."""

    @functools.wraps(function)
    def wrapper(ctx: PollContext) -> Any:
        return function(ctx)

    return wrapper


class AsyncHandler:
    """A handler object with an ``async def __call__`` taking an extra argument."""

    def __init__(self, ran: list[int]) -> None:
        self.ran = ran

    async def __call__(self, ctx: PollContext, tag: str) -> None:
        await asyncio.sleep(0)
        self.ran.append(ctx.offset)


def decorated_handler(ran: list[int]) -> Callable[[PollContext], Any]:
    @logged
    async def handle(ctx: PollContext) -> None:
        await asyncio.sleep(0)
        ran.append(ctx.offset)

    return handle


def partial_of_async_object(ran: list[int]) -> Callable[[PollContext], Any]:
    return functools.partial(AsyncHandler(ran), tag="x")


def async_generator_handler(ran: list[int]) -> Callable[[PollContext], Any]:
    async def handle(ctx: PollContext) -> Any:  # an async def with a stray ``yield``
        ran.append(ctx.offset)
        yield

    return handle


@pytest.mark.parametrize(
    "make_handler",
    [decorated_handler, partial_of_async_object],
    ids=["sync-decorator", "partial-of-async-callable"],
)
def test_a_wrapped_async_handler_commits_only_records_whose_body_ran(make_handler):
    # Given 5 records and an async handler behind a synchronous wrapper
    cluster = FakeCluster()
    cluster.create_topic("t")
    for i in range(5):
        cluster.produce("t", b"%d" % i, key=b"k")
    ran: list[int] = []
    handle = make_handler(ran)
    pc = consumer(cluster, Options(commit_interval=0.05))
    # When it is registered with the runner left unset (the handler "decides")
    pc.poll(handle)
    try:
        wait_until(lambda: pc.statistics().records_succeeded >= 5 or len(ran) >= 5, timeout=10)
    finally:
        pc.close()
    # Then a record is committed only once its handler body ran (at-least-once)
    committed = cluster.committed("g", "t", 0)
    done = 0 if committed is None else committed[0]
    assert set(range(done)) <= set(ran), f"committed up to {done}, handler bodies ran for {ran}"


def test_an_async_generator_handler_is_refused_at_poll():
    # Given an async def with a stray ``yield``: calling it runs nothing until it is iterated,
    # so no runner can process records with it
    cluster = FakeCluster()
    cluster.create_topic("t")
    cluster.produce("t", b"0", key=b"k")
    ran: list[int] = []
    pc = consumer(cluster, Options(commit_interval=0.05))
    try:
        # When it is registered
        # Then it is refused before anything runs (and so nothing commits)
        with pytest.raises(ConfigurationError, match="async generator"):
            pc.poll(async_generator_handler(ran))
    finally:
        pc.close()
    assert cluster.committed("g", "t", 0) is None
    assert ran == []


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_a_call_returning_a_coroutine_or_async_generator_fails(runner):
    # Given handlers whose async nature cannot be seen: a lambda around an async def, and one
    # around an async generator function
    async def coroutine_function(ctx: PollContext) -> None:
        await asyncio.sleep(0)

    async def generator_function(ctx: PollContext) -> Any:
        yield

    handlers = {
        "threads": lambda ctx: coroutine_function(ctx),
        "asyncio": lambda ctx: generator_function(ctx),
    }
    results = Results()
    run: AsyncioRunner | ThreadRunner = (
        AsyncioRunner(2, SystemClock(), name="contract")
        if runner == "asyncio"
        else ThreadRunner(2, SystemClock(), name="contract")
    )
    run.start(handlers[runner], results)
    try:
        # When it is called
        run.submit(0, context(0))
        # Then the call fails (its body never ran), with an error that says why
        reported = results.take(1, timeout=5.0)
        error = reported[0].errors[0]
        assert isinstance(error, TypeError)
        assert "never ran" in str(error)
    finally:
        run.stop(1.0)


# -- SystemExit / KeyboardInterrupt in a task a handler awaits (it killed the event loop) ----------


async def exit_now() -> None:
    raise SystemExit(3)


@pytest.mark.parametrize("how", ["wait_for", "gather"])
def test_system_exit_in_an_awaited_task_stops_every_other_call(how):
    # Given 10 records of distinct keys; the first attempt at record 0 awaits a helper that
    # calls sys.exit() (through wait_for / gather, which wrap it in a task)
    cluster = FakeCluster()
    cluster.create_topic("t")
    for i in range(10):
        cluster.produce("t", b"%d" % i, key=b"k%d" % i)
    finished: list[int] = []

    async def handle(ctx: PollContext) -> None:
        if ctx.offset == 0 and ctx.attempts == 0:
            await asyncio.sleep(0.05)
            if how == "wait_for":
                await asyncio.wait_for(exit_now(), 5)
            else:
                await asyncio.gather(exit_now())
        await asyncio.sleep(0.2)
        finished.append(ctx.offset)

    pc = consumer(cluster, Options(retry_delay=0.01, commit_interval=0.05))
    pc.poll(handle)
    try:
        # When it runs: then, as for a SystemExit raised by the handler itself, that call
        # fails and is retried, and every other call is untouched
        wait_until(lambda: len(set(finished)) == 10 or pc.failure is not None, timeout=10)
        assert pc.failure is None, f"the consumer failed: {pc.failure!r}"
        assert sorted(set(finished)) == list(range(10))
    finally:
        # (a failure is what the assertions above report)
        with contextlib.suppress(Exception):
            pc.close(drain=False, timeout=1.0)


# -- GeneratorExit raised by an async handler: the call still reports ------------------------------


@pytest.fixture
def aio_runners() -> Iterator[list[AsyncioRunner]]:
    started: list[AsyncioRunner] = []
    yield started
    for runner in started:
        runner.stop(0.0)


def test_a_handler_raising_generator_exit_still_reports_its_call(aio_runners):
    # Given an asyncio runner whose handler raises GeneratorExit for record 0
    async def handle(ctx: PollContext) -> int:
        await asyncio.sleep(0)
        if ctx.offset == 0:
            raise GeneratorExit("from the handler")
        return ctx.offset

    results = Results()
    runner = AsyncioRunner(10, SystemClock(), name="contract")
    runner.start(handle, results)  # type: ignore[arg-type]
    aio_runners.append(runner)
    # When two calls run
    runner.submit(0, context(0))
    runner.submit(1, context(1))
    # Then each reports exactly one outcome (the contract of runners/base.py): call 0 failed
    reported = results.take(2, timeout=3.0)
    assert sorted(reported) == [0, 1]
    assert isinstance(reported[0].errors[0], GeneratorExit)


# -- close() stops the event loop, even behind an asyncio.to_thread call ---------------------------


def test_close_stops_the_event_loop_behind_a_to_thread_call():
    # Given an async handler that moves its blocking part to a thread, as the docs advise
    cluster = FakeCluster()
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"k")
    release = threading.Event()
    entered = threading.Event()

    def blocking_io() -> None:
        entered.set()
        release.wait(20)

    async def handle(ctx: PollContext) -> None:
        await asyncio.to_thread(blocking_io)

    pc = consumer(cluster, Options(name="leak"))
    pc.poll(handle)
    try:
        assert entered.wait(10)
        # When the consumer closes, giving in-flight calls 0.2 s
        pc.close(drain=False, timeout=0.2)
        # Then no event loop of the consumer is left running once close() returned
        assert threads_named("-aio-loop") == [], "the event loop thread outlived close()"
    finally:
        release.set()
        wait_until(lambda: not threads_named("-aio-loop"), timeout=10)


# -- a value that does not survive the pipe fails its own call, not the pool thread ----------------


@pytest.fixture
def process_runner() -> Iterator[tuple[ProcessRunner, Results]]:
    results = Results()
    runner = ProcessRunner(1, SystemClock(), name="contract")
    runner.start(worker_handler, results)
    yield runner, results
    runner.stop(1.0)


def test_a_result_that_cannot_be_unpickled_fails_only_its_own_call(process_runner):
    runner, results = process_runner
    # Given a call whose handler returns a value that cannot be rebuilt in the parent
    runner.submit(0, context(0, b"slow"))
    runner.submit(1, context(1, b"pair"))
    # When more calls come after it
    for batch in (2, 3):
        runner.submit(batch, context(batch, b"ok"))
    # Then every call reports once: the bad value fails its own call, the others succeed
    reported = results.take(4, timeout=8.0)
    assert sorted(reported) == [0, 1, 2, 3]
    assert reported[1].errors[0] is not None
    assert [reported[b].errors for b in (0, 2, 3)] == [(None,)] * 3


@pytest.mark.parametrize(
    "bad_value",
    [threading.Lock(), Pair(1, 2)],
    ids=["unpicklable-record", "record-not-unpicklable-in-worker"],
)
def test_a_record_that_cannot_cross_to_the_worker_fails_only_its_own_call(
    process_runner, bad_value
):
    runner, results = process_runner
    # Given a call whose record cannot travel to the worker process, then good calls
    runner.submit(0, context(0, bad_value))
    for batch in (1, 2):
        runner.submit(batch, context(batch, b"ok"))
    # Then every call reports once: the bad one fails, the others succeed
    reported = results.take(3, timeout=8.0)
    assert sorted(reported) == [0, 1, 2]
    assert reported[0].errors[0] is not None
    assert [reported[b].errors for b in (1, 2)] == [(None,)] * 2


# -- no handler call starts after close() returned (a loop blocked by a sync call) -----------------


def test_no_handler_call_starts_after_close_returned_when_the_loop_was_blocked():
    # Given 5 calls started together; the first blocks the event loop with a sync call
    cluster = FakeCluster()
    cluster.create_topic("t")
    for i in range(5):
        cluster.produce("t", b"%d" % i, key=b"k%d" % i)
    entered = threading.Event()
    started: list[tuple[int, float]] = []

    async def handle(ctx: PollContext) -> None:
        if ctx.offset == 0:
            entered.set()
            time.sleep(7.0)  # the mistake the docs warn about: a blocking call on the loop
            return
        started.append((ctx.offset, time.monotonic()))
        await asyncio.sleep(30)

    pc = consumer(cluster, Options(ordering="unordered"))
    pc.poll(handle)
    assert entered.wait(10)
    # When the consumer closes meanwhile, giving calls 0.1 s
    pc.close(drain=False, timeout=0.1)
    closed_at = time.monotonic()
    try:
        # Then no handler call begins once close() has returned
        wait_until(lambda: not threads_named("-aio-loop"), timeout=10)
        late = [(offset, round(at - closed_at, 2)) for offset, at in started if at > closed_at]
        assert late == [], f"handler calls started after close() returned: {late}"
    finally:
        wait_until(lambda: not threads_named("-aio-loop"), timeout=10)


# -- a replacement worker that cannot load the handler is not respawned forever --------------------


def test_a_replacement_that_cannot_load_the_handler_is_not_respawned_forever(tmp_path):
    # Given a one-process runner whose handler loaded fine at start
    marker = tmp_path / "module-gone"
    results = Results()
    runner = ProcessRunner(1, SystemClock(), name="contract")
    runner.start(Reloadable(str(marker)), results)
    try:
        # When the handler can no longer be loaded (a deploy changed the code) and the worker
        # then crashes
        marker.touch()
        runner.submit(0, context(0, b"crash"))
        assert sorted(results.take(1, timeout=10.0)) == [0]
        # Then it does not keep spawning replacements that fail the same way (one or two
        # attempts are fine; the wait ends early only if there are more)
        wait_until(lambda: runner.restarts > 2, timeout=15.0)
        assert runner.restarts <= 2, f"{runner.restarts} replacements spawned"
    finally:
        runner.stop(1.0)


def test_a_replacement_that_cannot_be_spawned_is_tried_again_later(tmp_path, monkeypatch):
    # Given a one-process runner that started fine
    results = Results()
    runner = ProcessRunner(1, SystemClock(), name="contract")
    runner.start(Reloadable(str(tmp_path / "absent")), results)
    try:
        # When its worker crashes and no process can be started any more (EMFILE)
        def no_spawn(self: ProcessRunner, index: int) -> Any:
            raise OSError(24, "Too many open files")

        monkeypatch.setattr(ProcessRunner, "_spawn", no_spawn)
        runner.submit(0, context(0, b"crash"))
        assert sorted(results.take(1, timeout=10.0)) == [0]
        # Then the pool thread lives on (one try now, the next one later) and stops cleanly
        assert wait_until(lambda: runner.restarts == 1, timeout=5.0)
        assert runner._thread is not None
        assert runner._thread.is_alive()
    finally:
        runner.stop(1.0)


# -- a worker that cannot be spawned: a ConfigurationError, nothing left running -------------------


def test_a_failed_spawn_is_a_configuration_error_and_leaves_nothing_running(
    monkeypatch,
):
    import multiprocessing

    # Given a machine where only two worker processes can be started (too many open files)
    spawn = ProcessRunner._spawn

    def spawn_two(self: ProcessRunner, index: int) -> Any:
        if index >= 2:
            raise OSError(24, "Too many open files")
        return spawn(self, index)

    monkeypatch.setattr(ProcessRunner, "_spawn", spawn_two)
    before = set(multiprocessing.active_children())
    runner = ProcessRunner(3, SystemClock(), name="contract")
    try:
        # When the runner starts with processes=3
        raised: BaseException | None = None
        try:
            runner.start(worker_handler, Results())
        except Exception as exc:
            raised = exc
        runner.stop(1.0)
        # Then it is a ConfigurationError (the contract of Runner.start), and nothing is left
        # running
        left = [p for p in multiprocessing.active_children() if p not in before]
        assert (type(raised).__name__, left) == ("ConfigurationError", [])
    finally:
        for process in set(multiprocessing.active_children()) - before:
            process.terminate()
            process.join(5)


# -- calls a worker ran when stop() terminated it report CallCancelled, not WorkerCrashed ----------


def test_calls_terminated_at_stop_report_call_cancelled(process_runner):
    from parallel_consumer.runners import CallCancelled

    runner, results = process_runner
    # Given a call that is still running
    runner.submit(0, context(0, b"endless"))
    assert wait_until(lambda: any(w.outstanding for w in runner._workers), timeout=10)
    time.sleep(0.5)  # shipped, and running in the worker
    # When the runner stops without waiting
    assert runner.stop(0.0) is False
    # Then the call reports CallCancelled, as documented
    reported = results.take(1, timeout=5.0)
    assert [type(e).__name__ for e in reported[0].errors] == [CallCancelled.__name__]


# -- a finished call's result does not wait in the worker for the whole next call ------------------


def test_a_finished_result_is_not_held_back_by_the_next_call(process_runner):
    runner, results = process_runner
    # Given a call of 0.3 s and, queued behind it in the same worker, a call that runs long
    runner.submit(0, context(0, b"slow"))
    runner.submit(1, context(1, b"endless"))
    # When the first call finishes
    # Then its result arrives promptly (cpu-bound.md: "at most 5 ms late"), not once the next
    # call ends
    reported = results.take(1, timeout=5.0)
    assert sorted(reported) == [0]
    assert reported[0].errors == (None,)


# -- the pipe and held-back results through the engine: what a user sees ---------------------------


def test_one_bad_return_value_neither_stalls_nor_silently_stops_the_consumer():
    # Given 10 records; the handler returns a value that cannot be unpickled for record 0
    cluster = FakeCluster()
    cluster.create_topic("t")
    for i in range(10):
        cluster.produce("t", b"pair" if i == 0 else b"ok", key=b"k%d" % i)
    pc = consumer(
        cluster,
        Options(runner="process", processes=1, ordering="unordered", retry_delay=0.05),
    )
    pc.poll(worker_handler)
    try:
        # When it runs: then the other 9 records complete, or the consumer fails loudly
        wait_until(
            lambda: pc.statistics().records_succeeded >= 9 or pc.failure is not None,
            timeout=10,
        )
        stats = pc.statistics()
        assert stats.records_succeeded >= 9 or pc.failure is not None, (
            f"{pc.lifecycle.name}, failure={pc.failure!r}, succeeded={stats.records_succeeded}, "
            f"in_flight={stats.in_flight}, waiting={stats.waiting}"
        )
    finally:
        with contextlib.suppress(Exception):
            pc.close(drain=False, timeout=0.5)


def test_a_record_finished_behind_a_long_call_is_committed_at_close():
    # Given record 0 (0.3 s) and record 1 (runs long), both shipped to the only worker
    cluster = FakeCluster()
    cluster.create_topic("t")
    cluster.produce("t", b"slow", key=b"a")
    cluster.produce("t", b"endless", key=b"b")
    pc = consumer(
        cluster, Options(runner="process", processes=1, ordering="unordered", commit_interval=60)
    )
    pc.poll(worker_handler)
    try:
        wait_until(lambda: pc.statistics().in_flight == 2, timeout=10)
        # record 0's handler finishes (waited for, not given a fixed second: the worker
        # process may start the call late on a loaded machine; held back behind record 1, as
        # it was before the fix, its result never comes and the checks below fail)
        wait_until(lambda: pc.statistics().records_succeeded == 1, timeout=10)
    finally:
        # When the consumer closes, giving the long call 1 s
        pc.close(drain=False, timeout=1.0)
    # Then record 0, whose handler finished, is committed
    committed = cluster.committed("g", "t", 0)
    assert committed is not None, "nothing committed"
    assert committed[0] >= 1, f"committed: {committed}"
    assert pc.statistics().records_succeeded == 1


# -- one worker in GIL-holding code does not block the pool thread and so every worker -------------


def test_a_worker_holding_the_gil_does_not_stall_the_other_workers():
    arrivals: dict[int, float] = {}

    def done(event: WorkDone) -> None:
        arrivals[event.batch] = time.monotonic()

    runner = ProcessRunner(2, SystemClock(), name="contract")
    runner.start(worker_handler, done)
    try:
        # Given one worker busy in C code that keeps the GIL for about 2 s
        runner.submit(0, context(0, b"hold-gil"))
        time.sleep(0.5)
        # When quick calls with 256 KiB records arrive (some go to each worker)
        for batch in range(1, 15):
            runner.submit(batch, context(batch, b"x" * (256 * 1024)))
        wait_until(lambda: len(arrivals) == 15, timeout=60)
        # Then the other worker's quick calls report well before the long call ends
        assert len(arrivals) == 15
        first_other = min(at for batch, at in arrivals.items() if batch != 0)
        assert first_other < arrivals[0] - 0.5, (
            f"first quick call reported {first_other - arrivals[0]:+.2f}s after the long one"
        )
    finally:
        runner.stop(1.0)


def test_a_decorated_async_handler_is_refused_by_the_asyncio_runner():
    cluster = FakeCluster()
    cluster.create_topic("t")
    cluster.produce("t", b"0", key=b"k")
    ran: list[int] = []
    pc = consumer(cluster, Options(runner="asyncio"))
    try:
        # When a decorated async def handler is registered with runner="asyncio"
        pc.poll(decorated_handler(ran))
        # Then it runs on the event loop
        assert wait_until(lambda: ran == [0], timeout=10), f"ran: {ran}"
    finally:
        pc.close()
