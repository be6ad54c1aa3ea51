"""Given failing handlers, then records retry after the right delay and the engine keeps going."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from parallel_consumer import Options, PollContext, RecordContext, Retry


def test_failed_record_retries_after_retry_delay_on_the_injected_clock(
    harness, cluster, clock, wait_until
):
    # Given one record whose first attempt fails
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"a")
    attempts: list[int] = []

    def handle(ctx: PollContext) -> None:
        attempts.append(ctx.attempts)
        if ctx.attempts == 0:
            raise RuntimeError("first attempt fails")

    pc = harness.make(Options(retry_delay=30), clock=clock)
    pc.poll(handle)
    wait_until(lambda: attempts == [0])
    wait_until(lambda: pc.statistics().retry_waiting == 1)
    # When 29 s pass, then it has not been retried
    clock.advance(29)
    assert pc.statistics().retry_waiting == 1
    assert attempts == [0]
    # When the 30th second passes, then it is retried and succeeds
    clock.advance(1.5)
    wait_until(lambda: attempts == [0, 1])
    wait_until(lambda: pc.statistics().records_succeeded == 1)
    stats = pc.statistics()
    assert stats.records_failed == 1


def test_retry_signal_delay_and_failure_history(harness, cluster, clock, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"a")
    seen: list[RecordContext] = []

    def handle(ctx: PollContext) -> None:
        seen.append(ctx.record)
        if ctx.attempts < 2:
            raise Retry("not yet", delay=timedelta(seconds=5))

    pc = harness.make(Options(retry_delay=1000), clock=clock)
    pc.poll(handle)
    for expected in (1, 2, 3):
        wait_until(lambda n=expected: len(seen) == n)
        clock.advance(5)
    wait_until(lambda: pc.statistics().records_succeeded == 1)
    assert [r.attempts for r in seen] == [0, 1, 2]
    assert seen[0].last_failure is None
    assert isinstance(seen[2].last_failure, Retry)
    assert seen[2].last_failure_at is not None


def test_retry_delay_provider_sees_attempt_count(harness, cluster, clock, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"a")
    provider_calls: list[int] = []
    calls: list[int] = []

    def provider(record: RecordContext) -> float:
        provider_calls.append(record.attempts)
        return 10.0 * record.attempts

    def handle(ctx: PollContext) -> None:
        calls.append(ctx.attempts)
        if ctx.attempts < 2:
            raise ValueError("boom")

    pc = harness.make(Options(retry_delay_provider=provider), clock=clock)
    pc.poll(handle)
    wait_until(lambda: calls == [0])
    wait_until(lambda: provider_calls == [1])
    clock.advance(9.9)
    assert calls == [0]
    clock.advance(0.2)
    wait_until(lambda: calls == [0, 1])
    wait_until(lambda: provider_calls == [1, 2])
    clock.advance(19.9)
    assert calls == [0, 1]
    clock.advance(0.2)
    wait_until(lambda: calls == [0, 1, 2])


def test_poison_record_blocks_only_its_own_key(harness, cluster, clock, wait_until):
    # Given key "bad" always fails, and 100 records of other keys behind it
    cluster.create_topic("t")
    cluster.produce("t", b"poison", key=b"bad")
    cluster.produce("t", b"after-poison", key=b"bad")
    for i in range(100):
        cluster.produce("t", b"%d" % i, key=b"good-%d" % (i % 5))
    done: list[bytes] = []
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        if ctx.value == b"poison":
            raise RuntimeError("always fails")
        with lock:
            done.append(ctx.value or b"")

    pc = harness.make(Options(ordering="key", retry_delay=0.0), clock=clock)
    pc.poll(handle)
    # Then every other key finishes, and the poisoned key's next record never runs
    wait_until(lambda: len(done) == 100)
    wait_until(lambda: pc.statistics().records_failed >= 5)
    assert b"after-poison" not in done
    stats = pc.statistics()
    assert stats.records_succeeded == 100
    assert stats.lifecycle.name == "RUNNING"


def test_handler_exceptions_never_stop_the_engine(harness, cluster, wait_until):
    cluster.create_topic("t", 2)
    for i in range(50):
        cluster.produce("t", b"%d" % i, key=b"%d" % i, partition=i % 2)
    failed_once: set[bytes] = set()
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        with lock:
            first = ctx.value not in failed_once
            failed_once.add(ctx.value or b"")
        if first:
            raise KeyError("every record fails once")

    pc = harness.make(Options(ordering="unordered", retry_delay=0))
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded == 50)
    assert pc.statistics().records_failed == 50
    assert pc.failure is None


def test_unordered_failed_batch_is_retried_in_offset_order(harness, cluster, clock, wait_until):
    cluster.create_topic("t")
    for i in range(4):
        cluster.produce("t", b"%d" % i)
    batches: list[list[int]] = []

    def handle(ctx: PollContext) -> None:
        batches.append([r.offset for r in ctx.records])
        if len(batches) == 1:
            raise RuntimeError("the first batch fails")

    pc = harness.make(
        Options(ordering="unordered", batch_size=4, max_concurrency=1, retry_delay=1), clock=clock
    )
    pc.poll(handle)
    wait_until(lambda: len(batches) == 1 and pc.statistics().retry_waiting == 4)
    clock.advance(1.5)
    wait_until(lambda: pc.statistics().records_succeeded == 4)
    assert batches == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_a_handler_raising_system_exit_counts_as_a_failure(harness, cluster, clock, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    calls: list[int] = []

    def handle(ctx: PollContext) -> None:
        calls.append(ctx.attempts)
        if ctx.attempts == 0:
            raise SystemExit(3)

    pc = harness.make(Options(max_concurrency=1, retry_delay=1), clock=clock)
    pc.poll(handle)
    wait_until(lambda: pc.statistics().retry_waiting == 1)
    clock.advance(1.5)
    wait_until(lambda: pc.statistics().records_succeeded == 1)
    assert calls == [0, 1]


def test_routine_retries_are_logged_quietly_and_a_record_that_keeps_failing_warns(
    harness, cluster, wait_until, caplog
):
    # Given a record that fails three times, then succeeds
    caplog.set_level(logging.INFO, logger="parallel_consumer")
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"a")
    attempts: list[int] = []

    def handle(ctx: PollContext) -> None:
        attempts.append(ctx.attempts)
        if ctx.attempts < 3:
            raise ConnectionError("down")

    pc = harness.make(Options(retry_delay=0))
    pc.poll(handle)
    wait_until(lambda: attempts == [0, 1, 2, 3])
    pc.close()
    # Then its first two failures are INFO and the third a WARNING
    levels = [r.levelname for r in caplog.records if "failed (attempt" in r.getMessage()]
    assert levels == ["INFO", "INFO", "WARNING"]
