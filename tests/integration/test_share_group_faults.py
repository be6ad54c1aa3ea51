"""Share groups (KIP-932) on a real broker under pressure: a small credit against large producer
batches, a record that outlives its acquisition lock (docs/share-groups.md)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from engine_support import wait_until
from share_support import share_config

from parallel_consumer import Options, ParallelConsumer, PollContext
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_requires("share_groups")]

PRODUCE_TIMEOUT = 120.0
#: The shortest acquisition lock a group may have (group.share.min.record.lock.duration.ms).
SHORTEST_LOCK = 15.0


def _share(**options: Any) -> Options:
    return Options(group_protocol="share", ordering="unordered", **options)


def _group() -> str:
    return f"pc-share-{uuid.uuid4().hex[:8]}"


def test_records_finished_beside_a_record_that_outlives_its_lock_are_not_delivered_again(
    kafka: KafkaBroker, topic: TopicFactory
) -> None:
    # Given 100 records in one producer batch (one poll of one client takes them all), the
    # first of which runs past the group's acquisition lock
    source = topic(1)
    lock_ms = str(int(SHORTEST_LOCK * 1000))
    config = share_config(
        kafka.bootstrap_servers, _group(), **{"share.record.lock.duration.ms": lock_ms}
    )
    produce_records(
        kafka.bootstrap_servers,
        source,
        100,
        partitions=[0],
        producer_config={"linger.ms": 200},
        timeout=PRODUCE_TIMEOUT,
    )
    seen: Counter[int] = Counter()
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 0 and ctx.attempts == 0:
            time.sleep(SHORTEST_LOCK + 3)
        with lock:
            seen[ctx.offset] += 1

    pc = ParallelConsumer(config, _share(max_concurrency=8))
    try:
        pc.subscribe(source)
        pc.poll(handle)
        wait_until(lambda: len(seen) == 99, timeout=60, what="the 99 quick records processed")
        # When the slow one finishes, past its lock
        wait_until(lambda: seen[0] >= 1, timeout=60, what="the slow record done")
        time.sleep(2.0)
        # Then the 99 others were accepted in time: none came back (only the slow one may)
        assert {o: n for o, n in seen.items() if o and n > 1} == {}
    finally:
        pc.close()


def test_records_beyond_a_small_credit_come_to_the_handler_on_their_first_delivery(
    kafka: KafkaBroker, topic: TopicFactory
) -> None:
    # Given 2,000 records written as large producer batches (a share fetch hands a member
    # whole batches, whatever max.poll.records says)
    source = topic(1)
    config = share_config(kafka.bootstrap_servers, _group())
    produce_records(
        kafka.bootstrap_servers,
        source,
        2_000,
        partitions=[0],
        producer_config={"linger.ms": 200, "batch.num.messages": 10_000},
        timeout=PRODUCE_TIMEOUT,
    )
    attempts: dict[int, list[int]] = {}
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        time.sleep(0.001)
        with lock:
            attempts.setdefault(ctx.offset, []).append(ctx.attempts)

    # When one instance with credit for 20 records reads them
    pc = ParallelConsumer(
        config, _share(max_buffered_records=20, fetch_batch_size=10, max_concurrency=8)
    )
    try:
        pc.subscribe(source)
        pc.poll(handle)
        wait_until(lambda: len(attempts) == 2_000, timeout=60, what="every record processed")
    finally:
        pc.close()
    # Then each ran once, on its first delivery: what the credit could not take waited for it
    # instead of going back to the broker (each release raises the delivery count, which is
    # ctx.attempts and counts against max_retries and share.delivery.count.limit)
    assert {o: a for o, a in attempts.items() if a != [0]} == {}


def test_a_paused_instance_lets_other_members_take_the_records_it_had_not_started(
    kafka: KafkaBroker, topic: TopicFactory
) -> None:
    # Given an instance that took 300 records and works through them one at a time
    source = topic(1)
    config = share_config(
        kafka.bootstrap_servers, _group(), **{"share.record.lock.duration.ms": "60000"}
    )
    produce_records(
        kafka.bootstrap_servers,
        source,
        300,
        partitions=[0],
        producer_config={"linger.ms": 200},
        timeout=PRODUCE_TIMEOUT,
    )
    done: Counter[int] = Counter()
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        time.sleep(0.05)
        with lock:
            done[ctx.offset] += 1

    slow = ParallelConsumer(config, _share(max_concurrency=1))
    other = ParallelConsumer(config, _share(max_concurrency=16))
    try:
        slow.subscribe(source)
        slow.poll(handle)
        wait_until(lambda: len(done) >= 5, timeout=60, what="the first records processed")
        # And another member of the group, idle: the first one holds every record
        other.subscribe(source)
        other.poll(handle)
        time.sleep(3.0)  # (joined: heartbeats every 0.5 s)
        # When the first one is paused
        slow.pause()
        # Then the other member processes the rest long before the records' lock (60 s) ends
        # (without the release they would come back only then)
        wait_until(
            lambda: len(done) == 300,
            timeout=25,
            what="every record processed",
            show=lambda: (len(done), slow.statistics().poller, other.statistics().poller),
        )
        assert sum(done.values()) == 300, {o: n for o, n in done.items() if n > 1}
    finally:
        slow.close()
        other.close()
