"""Deadlines, keep-alive and stall detection end to end on a real broker.

Progress is watched through the handler's calls, the stall hook and the broker's committed
offsets, never by polling ``statistics()`` in a loop (that wakes the controller). Handlers that
"work" for a while do so with a bounded wait of their own: that is the behaviour under test
(a slow call), not the test waiting for time to pass.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from dead_letter_support import read_with_headers
from engine_support import Engines, committed, wait_until

from parallel_consumer import (
    DeadlineExceeded,
    NoHooks,
    Options,
    ParallelConsumer,
    PartitionStall,
    PartitionStalled,
    PollContext,
    RecordContext,
    dead_letter,
)
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka


@pytest.fixture
def engines() -> Iterator[Engines]:
    started = Engines()
    yield started
    started.close_all()


class StallHooks(NoHooks):
    def __init__(self) -> None:
        self.stalls: list[PartitionStall] = []
        self.reported = threading.Event()

    def on_partition_stall(self, stall: PartitionStall) -> None:
        self.stalls.append(stall)
        self.reported.set()


def committed_at(config: dict[str, Any], name: str, partition: int) -> int | None:
    """The group's committed offset of one partition, or None while the broker cannot say yet
    (its group coordinator may still be loading when a test runs first on a fresh broker)."""
    try:
        return committed(config, name, [partition])[partition][0]
    except KafkaException:
        return None


def _start(
    engines: Engines,
    config: dict[str, Any],
    options: Options,
    name: str,
    handler: Any,
    hooks: NoHooks | None = None,
) -> ParallelConsumer:
    pc = ParallelConsumer(dict(config), options, hooks=hooks)
    engines._instances.append(pc)
    pc.subscribe(name)
    pc.poll(handler)
    return pc


def test_a_hung_thread_call_is_abandoned_retried_and_its_late_result_ignored(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given 20 records, the first of which hangs on its first attempt, and a 2 s deadline
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 20, keys=[f"k{i % 4}" for i in range(20)])
    gate = engines.gate()
    calls: list[RecordContext] = []
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        with lock:
            calls.append(ctx.record)
        if ctx.offset == 0 and ctx.attempts == 0:
            gate.wait(60)

    # When they are processed
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        pc = engines.start(
            consumer_config,
            Options(processing_timeout=2.0, retry_delay=0, commit_interval=0.2),
            name,
            handle,
        )
        wait_until(
            lambda: committed_at(consumer_config, name, 0) == 20,
            timeout=60,
            what="every record committed",
        )
    # Then offset 0 ran again after its deadline, failed with DeadlineExceeded, and every
    # record is committed while the first call still hangs on its thread
    retries = [c for c in calls if c.offset == 0 and c.attempts == 1]
    assert len(retries) == 1
    assert isinstance(retries[0].last_failure, DeadlineExceeded)
    stats = pc.statistics()
    assert (stats.deadline_exceeded, stats.overrunning_calls) == (1, 1)
    assert any(
        f"{name}[0]@0" in r.getMessage() and "abandoned" in r.getMessage() for r in caplog.records
    )
    report = pc.health()
    assert report.overrunning_calls == 1
    assert report.deadline_exceeded == 1
    # When the hung call ends, then its result is ignored
    gate.set()
    pc.close()
    stats = pc.statistics()
    assert stats.records_succeeded == 20
    assert stats.overrunning_calls == 0


def test_an_async_call_past_its_deadline_is_cancelled_and_retried(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 10, keys=[f"k{i}" for i in range(10)])
    cancelled = threading.Event()
    attempts: list[tuple[int, int]] = []

    async def handle(ctx: PollContext) -> None:
        attempts.append((ctx.offset, ctx.attempts))
        if ctx.offset == 3 and ctx.attempts == 0:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

    pc = engines.start(
        consumer_config,
        Options(processing_timeout=2.0, retry_delay=0, commit_interval=0.2),
        name,
        handle,
    )
    wait_until(
        lambda: committed_at(consumer_config, name, 0) == 10,
        timeout=60,
        what="every record committed",
    )
    assert cancelled.is_set()
    assert (3, 1) in attempts
    assert pc.statistics().deadline_exceeded == 1
    pc.close()


def test_extend_deadline_keeps_a_slow_call_alive(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given a 1 s deadline and a handler that works 2.5 s, keeping itself alive as it goes
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 3, keys=["a", "b", "c"])
    attempts: list[tuple[int, int]] = []
    work = threading.Event()  # never set: the handler's own bounded pauses

    def handle(ctx: PollContext) -> None:
        attempts.append((ctx.offset, ctx.attempts))
        for _ in range(10):
            ctx.extend_deadline(1.0)
            work.wait(0.25)

    pc = engines.start(
        consumer_config,
        Options(processing_timeout=1.0, retry_delay=0, commit_interval=0.2),
        name,
        handle,
    )
    wait_until(
        lambda: committed_at(consumer_config, name, 0) == 3,
        timeout=60,
        what="every record committed",
    )
    # Then each record ran once, and no deadline passed
    assert sorted(attempts) == [(0, 0), (1, 0), (2, 0)]
    assert pc.statistics().deadline_exceeded == 0
    pc.close()


def hang_or_extend(ctx: PollContext) -> None:
    """Runs in a worker process: logs ``offset attempts pid failure`` to the file named in the
    value (``<path>|<kind>``); ``hang`` hangs on its first attempt, ``slow`` works 4 s (twice
    the deadline) and keeps its call alive over the worker's pipe."""
    path, kind = ctx.value.decode().split("|")  # type: ignore[union-attr]
    failure = type(ctx.last_failure).__name__ if ctx.last_failure else "-"
    with open(path, "a") as log:
        log.write(f"{ctx.offset} {ctx.attempts} {os.getpid()} {failure}\n")
    if kind == "hang" and ctx.attempts == 0:
        time.sleep(600)
    if kind == "slow":
        for _ in range(16):
            ctx.extend_deadline(2.0)
            time.sleep(0.25)


def test_the_process_runner_replaces_a_worker_hung_past_its_deadline(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    tmp_path: Path,
) -> None:
    # Given one worker process, a record that hangs and one that keeps itself alive
    name = topic(1)
    path = tmp_path / "calls.log"
    produce_records(
        kafka.bootstrap_servers,
        name,
        2,
        keys=["a", "b"],
        values=[f"{path}|hang".encode(), f"{path}|slow".encode()],
    )
    pc = engines.start(
        consumer_config,
        Options(
            runner="process",
            processes=1,
            processing_timeout=2.0,
            retry_delay=0,
            commit_interval=0.2,
        ),
        name,
        hang_or_extend,
    )
    wait_until(
        lambda: committed_at(consumer_config, name, 0) == 2,
        timeout=90,
        what="both records committed",
    )
    pc.close()
    # Then the hung call's worker was replaced and the record retried in the new one, and the
    # slow record ran once
    calls = [line.split() for line in path.read_text().splitlines()]
    hang = [c for c in calls if c[0] == "0"]
    slow = [c for c in calls if c[0] == "1"]
    assert [c[1] for c in hang] == ["0", "1"]
    assert hang[0][2] != hang[1][2]  # another process
    assert hang[1][3] == "DeadlineExceeded"
    assert [c[1] for c in slow] == ["0"]
    assert pc.statistics().deadline_exceeded == 1


def test_health_reports_a_blocked_partition_and_warns_once(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given two partitions; partition 0's first record blocks, everything else flows
    name = topic(2)
    produce_records(
        kafka.bootstrap_servers,
        name,
        40,
        keys=[f"k{i}" for i in range(40)],
        partitions=[i % 2 for i in range(40)],
    )
    gate = engines.gate()
    done = threading.Event()
    hooks = StallHooks()

    def handle(ctx: PollContext) -> None:
        if ctx.partition == 0 and ctx.offset == 0:
            gate.wait(60)
            done.set()

    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        pc = _start(
            engines,
            consumer_config,
            Options(stall_threshold=2.0, commit_interval=0.2),
            name,
            handle,
            hooks,
        )
        # When the record has held partition 0 past the threshold
        assert hooks.reported.wait(30), "no stall reported"
        # Then health() says partition 0 is stalled on offset 0, and only it
        report = pc.health()
        assert not report.healthy
        assert report.stalled_partitions == ((name, 0),)
        p0 = next(p for p in report.partitions if p.partition == 0)
        assert p0.oldest_incomplete_offset == 0
        assert p0.in_flight == 1
        assert p0.oldest_incomplete_age is not None
        assert p0.oldest_incomplete_age >= 2.0
        wait_until(
            lambda: committed_at(consumer_config, name, 1) == 20,
            timeout=60,
            what="partition 1 committed to its end",
        )
        # When the record finishes, then the partition commits to its end and all is well
        gate.set()
        wait_until(
            lambda: committed_at(consumer_config, name, 0) == 20,
            timeout=60,
            what="partition 0 committed to its end",
        )
    assert pc.health().healthy
    assert len(hooks.stalls) == 1
    assert [r for r in caplog.records if "stalled" in r.getMessage()] != []
    assert len([r for r in caplog.records if f"{name}[0] stalled" in r.getMessage()]) == 1
    pc.close()


def test_on_stall_stop_stops_the_consumer(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 5, keys=["a", "b", "c", "d", "e"])
    gate = engines.gate()

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 2:
            gate.wait(60)

    pc = engines.start(
        consumer_config,
        Options(stall_threshold=2.0, on_stall="stop", commit_interval=0.2),
        name,
        handle,
    )
    wait_until(lambda: pc.failure is not None, timeout=30, what="the consumer to fail")
    gate.set()
    with pytest.raises(PartitionStalled) as raised:
        pc.wait(30)
    assert (raised.value.partition, raised.value.offset) == (0, 2)
    assert not pc.health().healthy


def test_on_stall_dead_letter_unblocks_the_partition(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given 10 records of one partition whose record at offset 2 hangs in its handler
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 10, keys=[f"k{i}" for i in range(10)])
    gate = engines.gate()
    seen: list[int] = []

    def handle(ctx: PollContext) -> None:
        seen.append(ctx.offset)
        if ctx.offset == 2:
            gate.wait(60)

    # When the partition stalls with on_stall=DEAD_LETTER
    pc = engines.start(
        consumer_config,
        Options(stall_threshold=2.0, on_stall="dead_letter", commit_interval=0.2),
        name,
        handle,
    )

    # Then the record holding it is dead-lettered (reason "stalled"), never run again, and the
    # group's committed offset reaches the end while the hung call still runs
    wait_until(
        lambda: committed_at(consumer_config, name, 0) == 10,
        timeout=60,
        what="the committed offset to pass the stalled record",
    )
    letters = read_with_headers(kafka.bootstrap_servers, dead_letter.default_topic(name))
    assert len(letters) == 1
    info = dead_letter.read_dead_letter(letters[0].headers)
    assert info is not None
    assert (info.offset, info.reason) == (2, dead_letter.Reason.STALLED)
    assert seen.count(2) == 1
    assert sorted(set(seen)) == list(range(10))
    assert pc.statistics().records_dead_lettered == 1
    gate.set()
