"""The asyncio and process runners end to end on a real broker: every record processed, in key
order, committed to the end of each partition. Timing is printed (run with ``-s``), never
asserted."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_support import Engines, Recorder, committed, end_offsets, wait_until

from parallel_consumer import Options, PollContext, ProcessingOrder
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka

PARTITIONS = (0, 1, 2)


@pytest.fixture
def engines() -> Iterator[Engines]:
    started = Engines()
    yield started
    started.close_all()


def log_in_worker(ctx: PollContext) -> int:
    """Runs in a worker process: appends ``partition key offset pid`` to the file named in the
    record's value (``<path>|<n>``)."""
    path, _ = ctx.value.decode().split("|")  # type: ignore[union-attr]
    line = f"{ctx.partition} {ctx.key.decode()} {ctx.offset} {os.getpid()}\n"  # type: ignore[union-attr]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return os.getpid()


@pytest.mark.kafka_requires("accurate_high_watermark")
def test_async_handler_processes_every_record_in_key_order_and_commits(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given 5,000 records over 200 keys and 3 partitions
    records = 5000
    rng = random.Random()
    name = topic(len(PARTITIONS))
    keys = [f"key-{rng.randrange(200)}" for _ in range(records)]
    produced = produce_records(kafka.bootstrap_servers, name, records, keys=keys)
    recorder = Recorder(ProcessingOrder.KEY)

    async def handle(ctx: PollContext) -> None:
        with recorder.call(ctx):
            await asyncio.sleep(rng.random() * 0.005)

    # When an async def handler with 1,000 calls in flight processes them
    started = time.monotonic()
    pc = engines.start(
        consumer_config, Options(max_concurrency=1000, commit_interval=0.5), name, handle
    )
    wait_until(lambda: len(recorder.seen) >= records, timeout=60, what=f"{records} records")
    print(f"\nasync: {records} records in {time.monotonic() - started:.2f} s")
    pc.close()
    # Then every record was processed, each key in offset order and never two at once
    assert recorder.seen == {(r.partition, r.offset) for r in produced}
    assert recorder.overlaps == []
    assert recorder.out_of_order() == []
    assert pc.statistics().records_failed == 0
    ends = end_offsets(kafka.bootstrap_servers, name, PARTITIONS)
    assert committed(consumer_config, name, PARTITIONS) == {p: (ends[p], "") for p in PARTITIONS}


@pytest.mark.kafka_requires("accurate_high_watermark")
def test_process_runner_processes_every_record_in_key_order_and_commits(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    tmp_path: Path,
) -> None:
    # Given 2,000 records over 50 keys and 3 partitions, each naming the log file
    records = 2000
    name = topic(len(PARTITIONS))
    log = tmp_path / "calls.log"
    produce_records(
        kafka.bootstrap_servers,
        name,
        records,
        keys=[f"k{i % 50}" for i in range(records)],
        values=[f"{log}|{i}" for i in range(records)],
    )
    # When two worker processes run them
    started = time.monotonic()
    pc = engines.start(
        consumer_config,
        Options(runner="process", processes=2, commit_interval=0.5),
        name,
        log_in_worker,
    )
    wait_until(
        lambda: pc.statistics().records_succeeded >= records,
        timeout=60,
        what=f"{records} records",
        show=pc.statistics,
    )
    print(f"\nprocess: {records} records in {time.monotonic() - started:.2f} s")
    pc.close()
    # Then each record ran once, in a worker process, each key's records in offset order
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == records
    by_key: dict[tuple[str, str], list[int]] = defaultdict(list)
    for partition, key, offset, _ in lines:
        by_key[(partition, key)].append(int(offset))
    assert all(offsets == sorted(offsets) for offsets in by_key.values())
    assert os.getpid() not in {int(pid) for *_, pid in lines}
    ends = end_offsets(kafka.bootstrap_servers, name, PARTITIONS)
    assert committed(consumer_config, name, PARTITIONS) == {p: (ends[p], "") for p in PARTITIONS}
