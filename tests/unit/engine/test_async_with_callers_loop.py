"""``async with ParallelConsumer(...) as pc``: handlers on the application's loop, through the
whole engine on the fakes; ``await pc.run()`` and ``await pc.close()``, cancellation, failures
and the blocking calls refused on that loop."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from parallel_consumer import (
    ConfigurationError,
    Lifecycle,
    Options,
    PollContext,
    RetriesExhausted,
)


async def _until(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {condition}"
        await asyncio.sleep(0.002)


def _records(cluster, count: int, keys: int = 5) -> None:  # type: ignore[no-untyped-def]
    cluster.create_topic("t")
    for i in range(count):
        cluster.produce("t", b"%d" % i, key=b"%d" % (i % keys))


def test_handlers_run_on_the_callers_loop_and_await_its_loop_bound_objects(harness, cluster):
    # Given records, and a loop-bound object of the application (a future of its loop that a
    # task of its own resolves, as a client's connection pool would answer)
    _records(cluster, 50)
    seen: list[tuple[int, str]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()
        async with harness.make(Options(ordering="key", max_concurrency=20)) as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                assert asyncio.get_running_loop() is loop
                seen.append((ctx.offset, await answer))

            # When the application's task resolves it
            loop.call_later(0.05, answer.set_result, "pong")
            await _until(lambda: pc.statistics().records_succeeded == 50)
            assert threading.current_thread() is threading.main_thread()
        # Then every handler awaited it on this loop, and leaving `async with` closed
        assert pc.lifecycle is Lifecycle.CLOSED

    asyncio.run(main())
    assert sorted(seen) == [(i, "pong") for i in range(50)]
    assert cluster.committed("g", "t", 0) == (50, None)


def test_run_returns_after_a_close_from_another_task(harness, cluster):
    # Given a consumer whose run() is awaited
    _records(cluster, 20)

    async def main() -> None:
        async with harness.make() as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                await asyncio.sleep(0)

            running = asyncio.create_task(pc.run())
            await _until(lambda: pc.statistics().records_succeeded == 20)
            # When another task closes it
            await pc.close()
            # Then run() returns (no error), the consumer closed
            await asyncio.wait_for(running, 5.0)
            assert pc.lifecycle is Lifecycle.CLOSED

    asyncio.run(main())
    assert cluster.committed("g", "t", 0) == (20, None)


def test_cancelling_run_closes_gracefully_then_reraises(harness, cluster):
    # Given calls in flight that take 0.2 s when run() is cancelled
    _records(cluster, 5, keys=5)
    ended: list[int] = []

    async def main() -> None:
        async with harness.make(Options(max_concurrency=10)) as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                await asyncio.sleep(0.2)
                ended.append(ctx.offset)

            running = asyncio.create_task(pc.run(timeout=10.0))
            await asyncio.sleep(0)  # (it starts: a task cancelled before it runs never does)
            await _until(lambda: pc.statistics().in_flight == 5)
            # When the task is cancelled
            running.cancel()
            # Then it re-raises the cancellation once closed, and the calls in flight finished
            with pytest.raises(asyncio.CancelledError):
                await running
            assert pc.lifecycle is Lifecycle.CLOSED
            assert sorted(ended) == [0, 1, 2, 3, 4]

    asyncio.run(main())
    assert cluster.committed("g", "t", 0) == (5, None)


def test_a_second_cancellation_while_closing_closes_fast(harness, cluster):
    # Given a call that never ends, and a close that would wait 30 s for it
    _records(cluster, 1)
    entered: list[int] = []
    cancelled_calls: list[int] = []

    async def main() -> None:
        async with harness.make() as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                entered.append(ctx.offset)
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled_calls.append(ctx.offset)
                    raise

            running = asyncio.create_task(pc.run(timeout=30.0))
            await asyncio.sleep(0)  # (it starts: a task cancelled before it runs never does)
            await _until(lambda: entered == [0])  # (started: not only handed over)
            running.cancel()
            await asyncio.sleep(0.05)
            started = time.monotonic()
            # When it is cancelled again while closing
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            # Then the close did not wait for the call: it was cancelled and not committed
            assert time.monotonic() - started < 10.0
            assert cancelled_calls == [0]

    asyncio.run(main())
    assert cluster.committed("g", "t", 0) is None


def test_a_failing_handler_is_retried_on_the_callers_loop(harness, cluster):
    # Given a handler that fails each record's first attempt
    _records(cluster, 10)
    attempts: dict[int, int] = {}

    async def main() -> None:
        async with harness.make(Options(retry_delay=0.01)) as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                attempts[ctx.offset] = attempts.get(ctx.offset, 0) + 1
                await asyncio.sleep(0)
                if attempts[ctx.offset] == 1:
                    raise RuntimeError("first attempt fails")

            # Then every record succeeds on its second attempt
            await _until(lambda: pc.statistics().records_succeeded == 10)

    asyncio.run(main())
    assert attempts == dict.fromkeys(range(10), 2)
    assert cluster.committed("g", "t", 0) == (10, None)


def test_close_while_calls_are_pending_cancels_them_on_this_loop(harness, cluster):
    # Given calls that wait for ever
    _records(cluster, 3, keys=3)
    started: list[int] = []
    cleaned: list[int] = []

    async def main() -> None:
        async with harness.make() as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                started.append(ctx.offset)
                try:
                    await asyncio.Event().wait()
                finally:
                    cleaned.append(ctx.offset)

            # (started, not only handed over: a call still queued at the close never starts)
            await _until(lambda: len(started) == 3)
            # When the consumer closes with a short timeout
            await pc.close(timeout=0.1)
            # Then the calls were cancelled on this loop, their cleanup ran, no task is left
            assert sorted(cleaned) == [0, 1, 2]
            others = asyncio.all_tasks() - {asyncio.current_task()}
            assert not others

    asyncio.run(main())
    assert cluster.committed("g", "t", 0) is None


def test_blocking_calls_on_the_handlers_loop_are_refused(harness, cluster):
    _records(cluster, 1)

    async def main() -> None:
        async with harness.make() as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                await asyncio.sleep(0)

            inner = harness.instances[-1]
            # Then close(), wait() and run() that would block this loop raise at once
            for blocking in (inner.close, inner.wait, inner.run):
                with pytest.raises(RuntimeError, match="await pc"):
                    blocking()
            # While health() answers
            assert pc.health() is not None

    asyncio.run(main())


def test_async_with_must_come_before_the_handler(harness, cluster):
    _records(cluster, 1)
    pc = harness.make()

    @pc.poll
    async def handle(ctx: PollContext) -> None:
        await asyncio.sleep(0)

    async def main() -> None:
        with pytest.raises(ConfigurationError, match="before registering"):
            async with pc:
                pass

    asyncio.run(main())


def test_a_loop_factory_is_refused_on_the_callers_loop(harness, cluster):
    _records(cluster, 1)

    async def main() -> None:
        async with harness.make(Options(loop_factory=asyncio.new_event_loop)) as pc:

            async def handle(ctx: PollContext) -> None:
                await asyncio.sleep(0)

            with pytest.raises(ConfigurationError, match="loop_factory"):
                pc.poll(handle)

    asyncio.run(main())


def test_run_stops_on_sigterm_when_asked_and_restores_the_previous_handler(harness, cluster):
    # Given run(handle_signals=True) on the main thread, with a handler of the application's
    _records(cluster, 3)
    previous = signal.getsignal(signal.SIGTERM)

    def application_handler(signum, frame):  # type: ignore[no-untyped-def]
        pass

    signal.signal(signal.SIGTERM, application_handler)

    async def main() -> None:
        async with harness.make() as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                await asyncio.sleep(0)

            running = asyncio.create_task(pc.run(handle_signals=True))
            await _until(lambda: pc.statistics().records_succeeded == 3)
            # When SIGTERM arrives
            os.kill(os.getpid(), signal.SIGTERM)
            # Then run() returns after a graceful close
            await asyncio.wait_for(running, 10.0)
            assert pc.lifecycle is Lifecycle.CLOSED

    try:
        asyncio.run(main())
        # And the application's own handler is back
        assert signal.getsignal(signal.SIGTERM) is application_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert cluster.committed("g", "t", 0) == (3, None)


def test_run_raises_the_failure_that_stopped_processing(harness, cluster):
    # Given an async handler that stops the consumer (on_exhausted=STOP after no retries)
    _records(cluster, 1)

    async def main() -> None:
        options = Options(max_retries=0, on_retries_exhausted="stop")
        async with harness.make(options) as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                raise ValueError("boom")

            # Then run() ends with that failure instead of waiting (and so does the close)
            await asyncio.wait_for(pc.run(), 10.0)

    with pytest.raises(RetriesExhausted):
        asyncio.run(main())


def test_an_error_in_the_async_with_body_closes_the_consumer_and_propagates(harness, cluster):
    _records(cluster, 3)
    seen: list[int] = []

    async def main() -> None:
        async with harness.make() as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                seen.append(ctx.offset)

            await _until(lambda: pc.statistics().records_succeeded == 3)
            raise KeyError("the application's own error")

    # Then the application's error comes out, and the consumer committed what it finished
    with pytest.raises(KeyError, match="own error"):
        asyncio.run(main())
    assert harness.instances[-1].lifecycle is Lifecycle.CLOSED
    assert cluster.committed("g", "t", 0) == (3, None)


def test_health_answers_on_the_loop_while_the_consumer_closes(harness, cluster):
    # Given calls in flight that take 0.3 s, and a close that waits for them
    _records(cluster, 5, keys=5)
    answers: list[float] = []

    async def main() -> None:
        async with harness.make() as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                await asyncio.sleep(0.3)

            await _until(lambda: pc.statistics().in_flight == 5)
            closing = asyncio.create_task(pc.close(timeout=5.0))
            # When a route asks for health() on this loop, over and over, while it closes
            while not closing.done():
                started = time.monotonic()
                report = pc.health()
                answers.append(time.monotonic() - started)
                assert report is not None
                await asyncio.sleep(0.01)
            await closing

    asyncio.run(main())
    # Then every answer came at once: the controller never waits for this loop
    assert len(answers) > 5
    assert max(answers) < 1.0
    assert cluster.committed("g", "t", 0) == (5, None)


def test_a_plain_handler_under_async_with_runs_on_threads_and_closes_by_await(harness, cluster):
    # Given a plain (def) handler registered inside `async with`
    _records(cluster, 10)
    threads: set[str] = set()

    async def main() -> None:
        async with harness.make() as pc:

            @pc.poll
            def handle(ctx: PollContext) -> None:
                threads.add(threading.current_thread().name)

            await _until(lambda: pc.statistics().records_succeeded == 10)

    asyncio.run(main())
    # Then it ran on the thread runner's workers, not on the loop, and the close committed
    assert threads
    assert all("worker" in name for name in threads)
    assert cluster.committed("g", "t", 0) == (10, None)


def test_async_with_and_no_handler_closes_at_once(harness, cluster):
    _records(cluster, 1)

    async def main() -> None:
        async with harness.make() as pc:
            assert pc.lifecycle is Lifecycle.NEW
            with pytest.raises(RuntimeError, match="needs a handler"):
                await pc.run()
        assert pc.lifecycle is Lifecycle.CLOSED

    asyncio.run(main())


def test_a_call_past_its_deadline_is_cancelled_on_this_loop_and_retried(harness, cluster):
    # Given a handler whose first attempt hangs, with a 0.2 s processing timeout
    _records(cluster, 1)
    attempts: list[str] = []

    async def main() -> None:
        options = Options(processing_timeout=0.2, retry_delay=0.01)
        async with harness.make(options) as pc:

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                if not attempts:
                    attempts.append("hung")
                    try:
                        await asyncio.Event().wait()
                    except asyncio.CancelledError:
                        attempts.append("cancelled")
                        raise
                attempts.append("ok")

            # Then the hung call is cancelled on this loop and the retry succeeds
            await _until(lambda: pc.statistics().records_succeeded == 1)

    asyncio.run(main())
    assert attempts == ["hung", "cancelled", "ok"]
    assert cluster.committed("g", "t", 0) == (1, None)
