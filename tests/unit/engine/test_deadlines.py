"""Given Options.processing_timeout, then a call past its deadline is abandoned and its records
retried (thread: the late result ignored; asyncio: the call cancelled), and extend_deadline
keeps a call alive. On the fakes with an injected clock: deadlines are exact."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import timedelta

import pytest

from parallel_consumer import (
    ConfigurationError,
    DeadlineExceeded,
    Options,
    PollContext,
    RecordContext,
)


def test_a_thread_call_past_its_deadline_is_retried_and_its_late_result_ignored(
    harness, cluster, clock, wait_until, caplog
):
    # Given one record whose first call hangs until released, and a 10 s deadline
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"a")
    release = threading.Event()
    calls: list[RecordContext] = []

    def handle(ctx: PollContext) -> str:
        calls.append(ctx.record)
        if ctx.attempts == 0:
            release.wait(30)
            return "late"
        return "retry"

    pc = harness.make(Options(processing_timeout=10, retry_delay=0, max_concurrency=2), clock=clock)
    pc.poll(handle)
    wait_until(lambda: len(calls) == 1)
    # When 9.9 s pass, then nothing happened yet
    clock.advance(9.9)
    assert pc.statistics().deadline_exceeded == 0
    # When the deadline passes
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        clock.advance(0.1)
        wait_until(lambda: len(calls) == 2, what="the retry")
    # Then the record ran again (on the second worker) with DeadlineExceeded as its failure,
    # and succeeded
    assert calls[1].attempts == 1
    assert isinstance(calls[1].last_failure, DeadlineExceeded)
    wait_until(lambda: pc.statistics().records_succeeded == 1)
    stats = pc.statistics()
    assert stats.deadline_exceeded == 1
    assert stats.overrunning_calls == 1  # the first call still holds its thread
    assert any("t[0]@0" in r.getMessage() and "abandoned" in r.getMessage() for r in caplog.records)
    # When the hung call finally returns, then its result is ignored: nothing counts twice
    release.set()
    wait_until(lambda: pc.statistics().overrunning_calls == 0)
    stats = pc.statistics()
    assert stats.records_succeeded == 1
    assert stats.records_failed == 1
    pc.close()
    assert cluster.committed("g", "t", 0) == (1, None)


def test_a_thread_still_running_past_its_deadline_holds_its_worker(
    harness, cluster, clock, wait_until
):
    # Given one worker thread and a first call that hangs past its deadline
    cluster.create_topic("t")
    cluster.produce("t", b"hang", key=b"a")
    cluster.produce("t", b"other", key=b"b")
    release = threading.Event()
    calls: list[bytes] = []

    def handle(ctx: PollContext) -> None:
        calls.append(ctx.value or b"")
        if ctx.value == b"hang" and ctx.attempts == 0:
            release.wait(30)

    pc = harness.make(Options(processing_timeout=5, retry_delay=0, max_concurrency=1), clock=clock)
    pc.poll(handle)
    wait_until(lambda: calls == [b"hang"])
    # When the deadline passes
    clock.advance(5)
    wait_until(lambda: pc.statistics().overrunning_calls == 1)
    # Then no other call starts while the only worker is still busy with the abandoned one
    assert pc.statistics().in_flight == 0
    assert calls == [b"hang"]
    # When it returns, then the worker is free again and the rest runs
    release.set()
    wait_until(lambda: pc.statistics().records_succeeded == 2)
    assert sorted(calls[1:]) == [b"hang", b"other"]


def test_extend_deadline_keeps_a_call_alive(harness, cluster, clock, wait_until):
    # Given a 10 s deadline and a handler that asks for 30 s more, then waits
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"a")
    extended = threading.Event()
    release = threading.Event()
    calls = 0

    def handle(ctx: PollContext) -> None:
        nonlocal calls
        calls += 1
        ctx.extend_deadline(timedelta(seconds=30))
        extended.set()
        release.wait(30)

    pc = harness.make(Options(processing_timeout=10, retry_delay=0), clock=clock)
    pc.poll(handle)
    wait_until(extended.is_set)
    pc.statistics()  # the controller has seen the keep-alive (its inbox is in order)
    # When 29 s pass, then the call is still alive
    clock.advance(29)
    assert pc.statistics().deadline_exceeded == 0
    # When it returns, then it counts: one call, no retry
    release.set()
    wait_until(lambda: pc.statistics().records_succeeded == 1)
    assert calls == 1
    assert pc.statistics().deadline_exceeded == 0


def test_extend_deadline_does_not_save_a_call_past_the_extended_deadline(
    harness, cluster, clock, wait_until
):
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"a")
    extended = threading.Event()
    release = threading.Event()
    attempts: list[int] = []

    def handle(ctx: PollContext) -> None:
        attempts.append(ctx.attempts)
        if ctx.attempts == 0:
            ctx.extend_deadline(20)
            extended.set()
            release.wait(30)

    pc = harness.make(Options(processing_timeout=10, retry_delay=0, max_concurrency=2), clock=clock)
    pc.poll(handle)
    wait_until(extended.is_set)
    pc.statistics()
    clock.advance(19.9)
    assert pc.statistics().deadline_exceeded == 0
    clock.advance(0.1)
    wait_until(lambda: attempts == [0, 1])
    release.set()
    wait_until(lambda: pc.statistics().overrunning_calls == 0)
    assert pc.statistics().records_succeeded == 1


def test_an_async_call_past_its_deadline_is_cancelled_and_retried(
    harness, cluster, clock, wait_until
):
    # Given an async handler whose first call waits forever
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"a")
    cancelled = threading.Event()
    attempts: list[int] = []

    async def handle(ctx: PollContext) -> None:
        attempts.append(ctx.attempts)
        if ctx.attempts == 0:
            ctx.extend_deadline(1)  # works from the event loop too (it only posts)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

    pc = harness.make(Options(processing_timeout=10, retry_delay=0), clock=clock)
    pc.poll(handle)
    wait_until(lambda: attempts == [0])
    # When the deadline passes
    clock.advance(10)
    # Then the call is cancelled, and the record retried and done
    wait_until(cancelled.is_set, what="the cancellation")
    wait_until(lambda: pc.statistics().records_succeeded == 1)
    assert attempts == [0, 1]
    wait_until(lambda: pc.statistics().overrunning_calls == 0)
    assert pc.statistics().deadline_exceeded == 1


def test_no_deadline_by_default_and_extend_deadline_is_then_a_no_op(
    harness, cluster, clock, wait_until
):
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"a")
    release = threading.Event()

    def handle(ctx: PollContext) -> None:
        ctx.extend_deadline(1)
        release.wait(30)

    pc = harness.make(Options(), clock=clock)
    pc.poll(handle)
    wait_until(lambda: pc.statistics().in_flight == 1)
    clock.advance(10_000)
    assert pc.statistics().deadline_exceeded == 0
    release.set()
    wait_until(lambda: pc.statistics().records_succeeded == 1)


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), "5", True])
def test_extend_deadline_rejects_nonsense(seconds):
    context = PollContext([], keep_alive=lambda s: None)
    with pytest.raises(ValueError, match="extend_deadline"):
        context.extend_deadline(seconds)


@pytest.mark.parametrize("name", ["processing_timeout", "stall_threshold"])
@pytest.mark.parametrize("value", [0, -1, float("nan"), "10"])
def test_bad_timeouts_are_configuration_errors_naming_the_setting(name, value):
    with pytest.raises(ConfigurationError, match=rf"Options\.{name} .*None for no"):
        Options(**{name: value})


def test_timeouts_accept_timedelta_and_none():
    options = Options(processing_timeout=timedelta(minutes=2), stall_threshold=None)
    assert options.processing_timeout == 120.0
    assert options.stall_threshold is None


def test_on_stall_accepts_names_and_rejects_others():
    assert Options(on_stall="stop").on_stall.name == "STOP"
    with pytest.raises(ConfigurationError, match=r"Options\.on_stall must be one of"):
        Options(on_stall="explode")
