"""The asyncio runner on its own: calls, failures, cancellation and stop, without the engine."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from aio_doubles import Results, context, settled, start
from confluent_kafka import Message

from parallel_consumer._clock import SystemClock
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.runners import AsyncioRunner, CallCancelled


@pytest.fixture
def runners() -> Iterator[list[AsyncioRunner]]:
    started: list[AsyncioRunner] = []
    yield started
    for runner in started:
        runner.stop(0.0)


def test_calls_report_the_awaited_value(runners):
    # Given an async handler that returns a value after awaiting
    async def handle(ctx: PollContext) -> int:
        await asyncio.sleep(0.001)
        return ctx.offset * 10

    results = start(runners, handle)
    # When 50 calls run
    for i in range(50):
        runners[0].submit(i, context(i))
    # Then each reports success and the awaited value
    done = results.take(50)
    assert {b: (e.errors, e.value) for b, e in done.items()} == {
        i: ((None,), i * 10) for i in range(50)
    }


def test_calls_that_end_together_are_reported_in_one_event(runners):
    # Given 300 calls that all wait for the same moment
    gate: list[asyncio.Event] = []
    waiting = threading.Semaphore(0)

    async def handle(ctx: PollContext) -> int:
        if not gate:
            gate.append(asyncio.Event())
        waiting.release()
        await gate[0].wait()
        return ctx.offset

    results = start(runners, handle, capacity=300)
    for i in range(300):
        runners[0].submit(i, context(i))
    for _ in range(300):  # every call is waiting
        assert waiting.acquire(timeout=10)
    # When they end in the same pass of the loop
    loop = runners[0]._loop
    assert loop is not None
    loop.call_soon_threadsafe(gate[0].set)
    # Then each is reported once, with its value, in a few events: not one hop per call
    done = results.take(300)
    assert {b: e.value for b, e in done.items()} == {i: i for i in range(300)}
    assert results.events <= 10


def test_calls_that_end_as_the_loop_stops_are_still_reported(runners):
    # Given two calls waiting on futures
    futures: dict[int, asyncio.Future[str]] = {}

    async def handle(ctx: PollContext) -> str:
        future = asyncio.get_running_loop().create_future()
        futures[ctx.offset] = future
        return await future

    results = start(runners, handle)
    runner = runners[0]
    for i in range(2):
        runner.submit(i, context(i))
    while len(futures) < 2:
        time.sleep(0.01)

    # When one ends just before the loop is halted and one in the same pass as the halt
    def last_pass() -> None:
        futures[0].set_result("a")
        runner._halt()
        futures[1].set_result("b")

    assert runner._loop is not None
    assert runner._thread is not None
    runner._loop.call_soon_threadsafe(last_pass)
    runner._thread.join(5)
    # Then both are reported (no result stays buffered in a stopped loop)
    assert {b: e.value for b, e in results.take(2, timeout=2).items()} == {0: "a", 1: "b"}


def test_runs_on_one_loop_thread_named_after_the_consumer(runners):
    threads: set[str] = set()

    async def handle(ctx: PollContext) -> None:
        threads.add(threading.current_thread().name)

    results = start(runners, handle)
    for i in range(20):
        runners[0].submit(i, context(i))
    results.take(20)
    assert threads == {"test-aio-loop"}


def test_an_exception_in_one_call_leaves_the_others_untouched(runners):
    # Given calls that all wait on one event, and call 3 that raises after it
    release = asyncio.Event()
    started = []

    async def handle(ctx: PollContext) -> int:
        started.append(ctx.offset)
        await release.wait()
        if ctx.offset == 3:
            raise ValueError("boom")
        return ctx.offset

    results = start(runners, handle)
    runner = runners[0]
    for i in range(10):
        runner.submit(i, context(i))
    deadline = time.monotonic() + 5
    while len(started) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runner._loop is not None
    runner._loop.call_soon_threadsafe(release.set)
    # Then only call 3 failed, with its own exception; the others returned their values
    done = results.take(10)
    assert isinstance(done[3].errors[0], ValueError)
    assert {b: e.value for b, e in done.items() if b != 3} == {i: i for i in range(10) if i != 3}
    assert all(e.errors == (None,) for b, e in done.items() if b != 3)


def test_system_exit_in_a_handler_fails_the_call_and_not_the_loop(runners, caplog):
    async def handle(ctx: PollContext) -> str:
        if ctx.offset == 0:
            raise SystemExit(3)
        return "ok"

    results = start(runners, handle)
    runners[0].submit(0, context(0))
    assert isinstance(results.take(1)[0].errors[0], SystemExit)
    runners[0].submit(1, context(1))
    assert results.take(1)[1].value == "ok"


def test_cancel_ends_a_running_call_with_the_given_error(runners):
    # Given two calls awaiting forever
    entered = threading.Event()

    async def handle(ctx: PollContext) -> None:
        entered.set()
        await asyncio.Event().wait()

    results = start(runners, handle)
    runner = runners[0]
    runner.submit(1, context(1))
    runner.submit(2, context(2))
    assert entered.wait(5)
    # When call 1 is cancelled with a deadline error
    runner.cancel(1, TimeoutError("deadline passed"))
    # Then it reports that error, and call 2 runs on
    done = results.take(1)
    assert isinstance(done[1].errors[0], TimeoutError)
    assert str(done[1].errors[0]) == "deadline passed"
    time.sleep(0.05)
    assert results.empty()
    # And cancel without an error reports CallCancelled
    runner.cancel(2)
    assert isinstance(results.take(1)[2].errors[0], CallCancelled)


def test_cancel_of_a_call_not_started_reports_it_without_running_it(runners):
    # Given capacity 1, taken by a call that waits forever, and call 2 queued behind it
    ran = []
    entered = threading.Event()

    async def handle(ctx: PollContext) -> None:
        ran.append(ctx.offset)
        entered.set()
        await asyncio.Event().wait()

    results = start(runners, handle, capacity=1)
    runners[0].submit(1, context(1))
    runners[0].submit(2, context(2))
    # When call 2 is cancelled
    runners[0].cancel(2, TimeoutError("late"))
    # Then it reports the error and never runs (call 1 is waited for, not given a fixed 50 ms:
    # on a loaded machine its task may not have taken its first step by then)
    assert isinstance(results.take(1)[2].errors[0], TimeoutError)
    assert entered.wait(10)
    assert settled(runners[0])
    assert ran == [1]


def test_cancel_queued_takes_back_calls_that_did_not_start(runners):
    gate = threading.Event()
    entered = threading.Event()
    ran = []

    async def handle(ctx: PollContext) -> None:
        ran.append(ctx.offset)
        entered.set()
        await asyncio.to_thread(gate.wait, 10)

    results = start(runners, handle, capacity=1)
    for i in range(1, 4):
        runners[0].submit(i, context(i))
    # (once call 1 is in the handler the loop has taken it from the queue: a fixed 50 ms
    # could pass before the loop thread ran at all, and then all three were still queued)
    assert entered.wait(10)
    assert runners[0].cancel_queued() == [2, 3]
    gate.set()
    assert set(results.take(1)) == {1}
    time.sleep(0.05)
    assert ran == [1]
    assert results.empty()


def test_stop_waits_for_running_calls_within_the_timeout(runners):
    # Given 20 calls that have all entered the handler (a call whose task had not taken its
    # first step when stop() came never starts: waiting for a fixed time instead made this
    # test fail on a loaded machine)
    entered = threading.Semaphore(0)

    async def handle(ctx: PollContext) -> int:
        entered.release()
        await asyncio.sleep(0.1)
        return ctx.offset

    results = start(runners, handle)
    for i in range(20):
        runners[0].submit(i, context(i))
    for _ in range(20):
        assert entered.acquire(timeout=10)
    # When the runner stops with time to spare, then every running call ends on its own
    assert runners[0].stop(5.0) is True
    assert all(e.errors == (None,) for e in results.take(20).values())


def test_stop_cancels_calls_still_running_after_the_timeout(runners):
    # Given 100 calls awaiting forever
    cancelled = []
    entered: list[int] = []
    all_entered = threading.Event()

    async def handle(ctx: PollContext) -> None:
        entered.append(ctx.offset)
        if len(entered) == 100:
            all_entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(ctx.offset)
            raise

    results = start(runners, handle)
    runner = runners[0]
    for i in range(100):
        runner.submit(i, context(i))
    assert all_entered.wait(10)
    # When the runner stops with a short timeout
    started = time.monotonic()
    assert runner.stop(0.1) is False
    # Then every call was cancelled, reported as CallCancelled, and the loop thread ended
    assert time.monotonic() - started < 2.0
    assert sorted(cancelled) == list(range(100))
    done = results.take(100)
    assert all(isinstance(e.errors[0], CallCancelled) for e in done.values())
    assert runner._thread is not None
    assert not runner._thread.is_alive()


def test_a_handler_that_blocks_the_loop_is_reported(runners, caplog):
    # Given an async handler that calls time.sleep (blocking the loop)
    async def handle(ctx: PollContext) -> None:
        time.sleep(1.0)

    results = start(runners, handle)
    # When it runs
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        runners[0].submit(0, context(0))
        results.take(1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(
            "was blocked" in r.getMessage() for r in caplog.records
        ):
            time.sleep(0.05)
    # Then the runner warns that the event loop was blocked, and counts it
    assert any("was blocked" in r.getMessage() for r in caplog.records)
    assert runners[0].blocked_loop_count >= 1


def test_stop_is_bounded_when_a_call_ignores_its_cancellation(runners, caplog):
    # Given a call that keeps running after it is cancelled
    entered = threading.Event()

    async def handle(ctx: PollContext) -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(30)

    start(runners, handle)
    runners[0].submit(0, context(0))
    assert entered.wait(5)
    # When the runner stops at once
    started = time.monotonic()
    assert runners[0].stop(0.0) is False
    # Then it gives up after the cancel grace, says so, and its loop thread has ended
    assert time.monotonic() - started < 4.0
    assert any("did not end" in r.getMessage() for r in caplog.records)
    assert runners[0]._thread is not None
    assert not runners[0]._thread.is_alive()
    assert not any("GeneratorExit" in r.getMessage() for r in caplog.records)


def test_records_failed_with_ctx_fail_are_reported_one_by_one(runners):
    async def handle(ctx: PollContext) -> str:
        await asyncio.sleep(0)
        ctx.fail(ctx[1], ValueError("second"))
        return "value"

    results = start(runners, handle)
    records = [RecordContext(Message(topic="t", partition=0, offset=i)) for i in range(3)]
    runners[0].submit(7, PollContext(records))
    event = results.take(1)[7]
    assert event.value == "value"
    assert event.partial
    assert event.errors[0] is None
    assert isinstance(event.errors[1], ValueError)
    assert event.errors[2] is None


def test_a_call_that_raises_fails_every_record_even_after_ctx_fail(runners):
    async def handle(ctx: PollContext) -> None:
        ctx.fail(ctx[0], ValueError("one"))
        raise KeyError("all")

    results = start(runners, handle)
    records = [RecordContext(Message(topic="t", partition=0, offset=i)) for i in range(2)]
    runners[0].submit(1, PollContext(records))
    event = results.take(1)[1]
    assert not event.partial
    assert [type(e) for e in event.errors] == [KeyError, KeyError]


class _CountingLoop(asyncio.SelectorEventLoop):
    """An event loop a test can recognise: the one its factory made."""


def test_the_loop_comes_from_loop_factory(runners):
    # Given a loop factory that makes loops of its own kind
    made: list[asyncio.AbstractEventLoop] = []

    def factory() -> asyncio.AbstractEventLoop:
        made.append(_CountingLoop())
        return made[-1]

    async def handle(ctx: PollContext) -> object:
        await asyncio.sleep(0)
        return asyncio.get_running_loop()

    results = Results()
    runner = AsyncioRunner(10, SystemClock(), name="test", loop_factory=factory)
    runner.start(handle, results)  # type: ignore[arg-type]
    runners.append(runner)
    # When calls run
    for i in range(3):
        runner.submit(i, context(i))
    # Then they ran on the one loop the factory made
    done = results.take(3)
    assert len(made) == 1
    assert {e.value for e in done.values()} == {made[0]}


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: object(), "not an asyncio event loop"),
        (lambda: 1 / 0, "failed: ZeroDivisionError"),
    ],
    ids=["not-a-loop", "raises"],
)
def test_a_wrong_loop_factory_fails_the_start_clearly(factory, message):
    from parallel_consumer.errors import ConfigurationError

    runner = AsyncioRunner(10, SystemClock(), name="test", loop_factory=factory)
    with pytest.raises(ConfigurationError, match=message):
        runner.start(lambda ctx: None, Results())  # type: ignore[arg-type]


def test_a_loop_factory_that_returns_a_closed_loop_fails_the_start_clearly():
    from parallel_consumer.errors import ConfigurationError

    closed = asyncio.new_event_loop()
    closed.close()
    runner = AsyncioRunner(10, SystemClock(), name="test", loop_factory=lambda: closed)
    with pytest.raises(ConfigurationError, match="running or closed"):
        runner.start(lambda ctx: None, Results())  # type: ignore[arg-type]


def test_uvloop_runs_the_calls(runners):
    uvloop = pytest.importorskip("uvloop", reason="uvloop is the 'uvloop' extra")

    async def handle(ctx: PollContext) -> str:
        await asyncio.sleep(0.001)
        return type(asyncio.get_running_loop()).__module__

    results = Results()
    runner = AsyncioRunner(100, SystemClock(), name="test", loop_factory=uvloop.new_event_loop)
    runner.start(handle, results)  # type: ignore[arg-type]
    runners.append(runner)
    for i in range(200):
        runner.submit(i, context(i))
    done = results.take(200)
    assert {e.errors for e in done.values()} == {(None,)}
    assert {e.value for e in done.values()} == {"uvloop"}


def test_a_task_cancelled_before_its_first_step_is_reported_once_without_running(runners):
    # Given a loop blocked by call 1, with call 2 submitted behind it
    ran = []
    blocked = threading.Event()
    unblock = threading.Event()

    async def handle(ctx: PollContext) -> None:
        ran.append(ctx.offset)
        if ctx.offset == 1:
            blocked.set()
            # blocks the loop until the test has queued what follows behind it (a fixed
            # 0.3 s was not always enough for the test thread on a loaded machine)
            unblock.wait(10)

    results = start(runners, handle)
    runner = runners[0]
    runner.submit(1, context(1))
    assert blocked.wait(5)
    runner.submit(2, context(2))
    # When the cancel of call 2 reaches the loop after its task was created and before the
    # task's first step (its body never runs: only a done callback can report it)
    assert runner._loop is not None
    runner._loop.call_soon_threadsafe(runner._cancel_task, 2, TimeoutError("too late"))
    unblock.set()
    # Then it is reported once, with that error, and the handler never ran for it
    done = results.take(2)
    assert done[1].errors == (None,)
    assert isinstance(done[2].errors[0], TimeoutError)
    assert settled(runner)
    assert results.empty()
    assert ran == [1]


def test_submit_many_starts_the_calls_in_order(runners):
    started = []

    async def handle(ctx: PollContext) -> None:
        started.append(ctx.offset)

    results = start(runners, handle, capacity=1)
    runners[0].submit_many([(i, context(i)) for i in range(1, 51)])
    assert set(results.take(50)) == set(range(1, 51))
    assert started == list(range(1, 51))
