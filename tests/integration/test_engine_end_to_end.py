"""The engine end to end on a real broker: every record processed, in order, committed to the end.

Timing is printed (run with ``-s``), never asserted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from engine_support import (
    Engines,
    Recorder,
    committed,
    committed_in_engine,
    end_offsets,
    holds_for,
    wait_until,
)

from parallel_consumer import CommitMode, Lifecycle, Options, PollContext, ProcessingOrder
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka

RECORDS = 10_000
PARTITIONS = (0, 1, 2)


@pytest.fixture
def engines() -> Iterator[Engines]:
    started = Engines()
    yield started
    started.close_all()


@pytest.mark.kafka_requires("accurate_high_watermark")  # commits are checked against it
@pytest.mark.parametrize(
    "commit_mode",
    # The transactional mode runs poll_and_produce handlers: tests/integration/test_produce.py.
    [CommitMode.PERIODIC_CONSUMER_ASYNC, CommitMode.PERIODIC_CONSUMER_SYNC],
    ids=lambda m: m.name.lower(),
)
@pytest.mark.parametrize("ordering", list(ProcessingOrder), ids=lambda o: o.name.lower())
def test_every_record_is_processed_in_order_and_committed_to_the_end(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    ordering: ProcessingOrder,
    commit_mode: CommitMode,
) -> None:
    # Given 10,000 records with 200 random keys over 3 partitions
    seed = random.randrange(2**32)
    print(f"\nseed {seed}")
    rng = random.Random(seed)
    name = topic(len(PARTITIONS))
    keys = [f"key-{rng.randrange(200)}" for _ in range(RECORDS)]
    produced = produce_records(kafka.bootstrap_servers, name, RECORDS, keys=keys)
    recorder = Recorder(ordering)

    def handle(ctx: PollContext) -> None:
        with recorder.call(ctx):
            time.sleep(random.random() * 0.002)  # simulated work of 0-2 ms

    # When one ParallelConsumer with 32 workers processes them, committing every 0.5 s
    started = time.monotonic()
    pc = engines.start(
        consumer_config,
        Options(
            ordering=ordering, commit_mode=commit_mode, max_concurrency=32, commit_interval=0.5
        ),
        name,
        handle,
    )
    wait_until(lambda: len(recorder.seen) >= RECORDS, timeout=60, what=f"{RECORDS} records")
    processed = time.monotonic() - started
    pc.close()
    print(
        f"{ordering.name}/{commit_mode.name}: {RECORDS} records in {processed:.2f} s "
        f"(close after {time.monotonic() - started:.2f} s), {recorder.duplicates} duplicates"
    )

    # Then every record was processed, each lane in offset order and never two at once
    assert recorder.seen == {(r.partition, r.offset) for r in produced}
    assert recorder.overlaps == []
    assert recorder.out_of_order() == []
    stats = pc.statistics()
    assert stats.records_failed == 0
    assert stats.commits_acknowledged >= 1
    # And the group's committed offsets are the ends of the partitions, without an offset map
    ends = end_offsets(kafka.bootstrap_servers, name, PARTITIONS)
    assert committed(consumer_config, name, PARTITIONS) == {p: (ends[p], "") for p in PARTITIONS}


def test_paused_consumer_takes_no_new_records_until_resumed(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given a running consumer that has processed the first 20 records of a topic
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 20)
    recorder = Recorder()

    def handle(ctx: PollContext) -> None:
        with recorder.call(ctx):
            pass

    pc = engines.start(consumer_config, Options(commit_interval=0.5), name, handle)
    wait_until(lambda: len(recorder.seen) == 20, timeout=30, what="the first 20 records")

    # When it is paused and 20 more records arrive
    pc.pause()
    assert pc.lifecycle is Lifecycle.PAUSED
    wait_until(
        lambda: pc.statistics().paused_partitions == 1, timeout=10, what="the partition paused"
    )
    produce_records(kafka.bootstrap_servers, name, 20)

    # Then none of them is processed (observed for 1 s)
    holds_for(lambda: len(recorder.calls) == 20, seconds=1.0, what="no new handler calls")
    assert pc.statistics().lifecycle is Lifecycle.PAUSED

    # When it is resumed, then the new records are processed and committed
    pc.resume()
    assert pc.lifecycle is Lifecycle.RUNNING
    wait_until(lambda: len(recorder.seen) == 40, timeout=30, what="the next 20 records")
    wait_until(
        lambda: committed_in_engine(pc.statistics(), {0: 40}),
        timeout=10,
        what="offset 40 committed",
    )
    pc.close()
    assert recorder.offsets() == set(range(40))
    assert committed(consumer_config, name, [0]) == {0: (40, "")}
