"""Failure handling on a real broker: dead letters with their headers, a dead-letter topic that
goes away, per-record batch failures in every runner, and dead letters inside transactions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from dead_letter_support import read_with_headers
from engine_support import Engines, committed, wait_until

from parallel_consumer import (
    CommitMode,
    Lifecycle,
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    ProducerRecord,
    Statistics,
)
from parallel_consumer import dead_letter as dl
from parallel_consumer.testing import create_topic, produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka


@pytest.fixture
def engines() -> Iterator[Engines]:
    started = Engines()
    yield started
    started.close_all()


def offsets(config: dict[str, Any], topic: str, partitions: list[int]) -> dict[int, int]:
    """The group's committed offsets (-1 while the coordinator cannot answer yet)."""
    try:
        return {p: o for p, (o, _) in committed(config, topic, partitions).items()}
    except KafkaException:
        return dict.fromkeys(partitions, -1)


def test_a_poison_record_is_dead_lettered_after_four_attempts_and_its_key_continues(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given 30 records over keys a, b, c in one partition; a's 4th record (offset 9) is poison
    source = topic(1)
    keys = ["a", "b", "c"]
    produce_records(kafka.bootstrap_servers, source, 30, keys=keys)
    calls: list[tuple[bytes, int, int]] = []
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        with lock:
            calls.append((ctx.key, ctx.offset, ctx.attempts))
        if ctx.offset == 9:
            raise ValueError(f"poison at {ctx.offset}")

    # When a KEY-ordered consumer with max_retries=3 runs them
    options = Options(max_retries=3, retry_delay=0.05, commit_interval=0.2)
    pc = engines.start(consumer_config, options, source, handle)

    # Then every other record is handled, and the committed offset reaches the end
    wait_until(
        lambda: offsets(consumer_config, source, [0])[0] == 30,
        timeout=60,
        what="the committed offset to pass the poison record",
    )
    pc.close()
    attempts = [a for _, o, a in calls if o == 9]
    assert attempts == [0, 1, 2, 3]
    # Key a continued after the poison record, in offset order, and only after it was given up
    a_offsets = [o for k, o, a in calls if k == b"a" and a == 0]
    assert a_offsets == list(range(0, 30, 3))
    last_poison = max(i for i, (_, o, _) in enumerate(calls) if o == 9)
    first_after = next(i for i, (k, o, _) in enumerate(calls) if k == b"a" and o == 12)
    assert first_after > last_poison
    # And the dead letter is in <source>.dlq with the original key, value and the headers
    [letter] = read_with_headers(kafka.bootstrap_servers, dl.default_topic(source))
    assert (letter.key, letter.value) == (b"a", b"value-9")
    info = dl.read_dead_letter(letter.headers)
    assert info is not None
    assert (info.topic, info.partition, info.offset, info.attempts) == (source, 0, 9, 4)
    assert (info.error_type, info.error_message) == ("builtins.ValueError", "poison at 9")
    assert info.reason == dl.Reason.RETRIES_EXHAUSTED
    assert info.group == consumer_config["group.id"]
    assert info.timestamp is not None
    assert info.first_failure_at is not None
    assert info.last_failure_at is not None
    assert info.first_failure_at <= info.last_failure_at
    stats = pc.statistics()
    assert (stats.records_dead_lettered, stats.retries_exhausted, stats.records_failed) == (1, 1, 4)


def _statistics_every_half_second(pc: ParallelConsumer) -> Statistics:
    # Not a tight loop: each call wakes the controller, which could hide a stall.
    threading.Event().wait(0.5)
    return pc.statistics()


def test_a_dead_letter_topic_that_goes_away_holds_the_record_until_it_is_back(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given a consumer whose dead-letter topic exists at start and is then deleted (the broker
    # does not auto-create topics), with a short delivery timeout
    source = topic(1)
    dlq = topic(1)
    calls: list[tuple[bytes, int]] = []

    def handle(ctx: PollContext) -> None:
        calls.append((ctx.value, ctx.attempts))
        if ctx.value == b"poison":
            raise ValueError("poison")

    pc = ParallelConsumer(
        consumer_config,
        Options(max_retries=0, dead_letter_topic=dlq, commit_interval=0.2),
        producer_config={"message.timeout.ms": 2000},
    )
    engines._instances.append(pc)
    pc.subscribe(source)
    pc.poll(handle)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.delete_topics([dlq], operation_timeout=30)[dlq].result(30)
    wait_until(
        lambda: dlq not in admin.list_topics(timeout=10).topics,
        timeout=30,
        what="the dead-letter topic to be gone",
    )

    # When a record before, the poison record and one after it (same key) arrive
    produce_records(
        kafka.bootstrap_servers, source, 3, keys=["k"], values=["before", "poison", "after"]
    )

    # Then the dead-letter write fails (and is tried again), nothing commits past the poison
    # record, and the record after it waits
    stats = _statistics_every_half_second(pc)
    for _ in range(60):
        if stats.dead_letter_failures >= 1:
            break
        stats = _statistics_every_half_second(pc)
    assert stats.dead_letter_failures >= 1, stats
    assert stats.records_dead_lettered == 0
    assert offsets(consumer_config, source, [0])[0] <= 1
    assert (b"after", 0) not in calls

    # When the topic exists again, then the dead letter is written and everything goes on
    create_topic(kafka.bootstrap_servers, dlq, partitions=1)
    wait_until(
        lambda: offsets(consumer_config, source, [0])[0] == 3,
        timeout=60,
        what="the committed offset to reach the end once the dead-letter topic is back",
    )
    pc.close()
    assert [c for c in calls if c[0] != b"poison"] == [(b"before", 0), (b"after", 0)]
    letters = read_with_headers(kafka.bootstrap_servers, dlq)
    assert [s.value for s in letters] == [b"poison"]
    stats = pc.statistics()
    assert stats.records_dead_lettered == 1
    assert stats.lifecycle is Lifecycle.CLOSED


def thread_handler(ctx: PollContext) -> list[ProducerRecord]:
    """One output per record not failed, naming its offset and attempt; the records whose value
    ends in ``-bad`` fail on their first attempt (module level: the process runner pickles it)."""
    outputs = []
    for record in ctx:
        if record.value.endswith(b"-bad") and record.attempts == 0:
            ctx.fail(record, ValueError("bad on first attempt"))
        else:
            target = record.headers and dict(record.headers).get("sink")
            assert target is not None
            outputs.append(
                ProducerRecord(
                    target.decode(), f"{record.offset}:{record.attempts}", key=record.key
                )
            )
    return outputs


async def async_handler(ctx: PollContext) -> list[ProducerRecord]:
    return thread_handler(ctx)


@pytest.mark.parametrize("runner", ["threads", "asyncio", "process"])
def test_a_batch_retries_only_the_records_failed_with_ctx_fail(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    runner: str,
) -> None:
    # Given 40 records in 2 partitions, every 8th failing its first attempt
    source, sink = topic(2), topic(1)
    values = [f"v{i}-bad" if i % 8 == 3 else f"v{i}" for i in range(40)]
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i, value in enumerate(values):
        producer.produce(
            source,
            value.encode(),
            key=f"k{i % 5}",
            partition=i % 2,
            headers=[("sink", sink.encode())],
        )
    assert producer.flush(30) == 0

    # When a poll_and_produce handler takes batches of 10 in the given runner
    options = Options(
        runner=runner,
        batch_size=10,
        max_concurrency=2,
        retry_delay=0.05,
        commit_interval=0.2,
        ordering=ProcessingOrder.UNORDERED,
        **({"processes": 2} if runner == "process" else {}),
    )
    pc = ParallelConsumer(consumer_config, options)
    engines._instances.append(pc)
    pc.subscribe(source)
    pc.poll_and_produce(async_handler if runner == "asyncio" else thread_handler)
    wait_until(
        lambda: offsets(consumer_config, source, [0, 1]) == {0: 20, 1: 20},
        timeout=90,
        what="every record committed",
    )
    pc.close()

    # Then each good record has one output from its first attempt, and each bad one exactly
    # one from its second: the batch's other records were not run again
    outputs = [s.value.decode() for s in read_with_headers(kafka.bootstrap_servers, sink)]
    attempts = [int(o.split(":")[1]) for o in outputs]
    assert len(outputs) == 40
    assert attempts.count(1) == 5
    assert attempts.count(0) == 35
    stats = pc.statistics()
    assert stats.records_failed == 5


@pytest.mark.kafka_requires("transactions", "accurate_high_watermark")
def test_transactional_dead_letters_commit_with_the_offsets(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given 200 records over 2 partitions, every 20th unprocessable
    source, sink = topic(2), topic(2)
    values = [f"bad-{i}" if i % 20 == 7 else f"ok-{i}" for i in range(200)]
    produce_records(
        kafka.bootstrap_servers, source, 200, keys=[f"k{i}" for i in range(9)], values=values
    )

    def handle(ctx: PollContext) -> ProducerRecord:
        if ctx.value.startswith(b"bad"):
            raise ValueError("unprocessable")
        return ProducerRecord(sink, ctx.value, key=ctx.key)

    # When a transactional pipeline with max_retries=1 runs them
    pc = ParallelConsumer(
        consumer_config,
        Options(
            commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER, max_retries=1, retry_delay=0.01
        ),
        producer_config={"transactional.id": f"{consumer_config['group.id']}-tx"},
    )
    engines._instances.append(pc)
    pc.subscribe(source)
    pc.poll_and_produce(handle)
    wait_until(
        lambda: sum(offsets(consumer_config, source, [0, 1]).values()) == 200,
        timeout=90,
        what="every input committed",
    )
    pc.close()

    # Then a read_committed reader sees each dead letter exactly once, and each output once
    letters = read_with_headers(kafka.bootstrap_servers, dl.default_topic(source))
    assert sorted(s.value for s in letters) == sorted(
        v.encode() for v in values if v.startswith("bad")
    )
    outputs = read_with_headers(kafka.bootstrap_servers, sink)
    assert sorted(s.value for s in outputs) == sorted(
        v.encode() for v in values if v.startswith("ok")
    )
    for letter in letters:
        info = dl.read_dead_letter(letter.headers)
        assert info is not None
        assert (info.attempts, info.reason) == (2, dl.Reason.RETRIES_EXHAUSTED)
