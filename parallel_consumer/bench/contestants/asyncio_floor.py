"""``asyncio``: the async rows' calls on a bare event loop, with no Kafka on the clock.

What is left of an ``async def`` row once the consumer is taken out: the records are read from
the topic before the clock starts, then one event loop (the row's: asyncio's, or uvloop's) runs
the row's calls with its ordering and concurrency, with little Python besides: a task per lane
(each key's, or each partition's, or each record's records one after another), at most ``C``
at once. The clock runs from the first call to the end of the last; nothing is committed.

Its wall is the floor of a design that gives every call (every lane) a task of its own, as
this library does so that calls never share a ``contextvars`` context: what no consumer built
that way can undercut on the same machine. Long-lived worker coroutines that take lanes from
a queue cost less per call (their calls share a context) and can go under it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from parallel_consumer.bench import features
from parallel_consumer.bench.contestants.base import LogRecorder, RunEnv
from parallel_consumer.bench.kafka_io import base_consumer_config, new_group
from parallel_consumer.bench.measure import lane_of
from parallel_consumer.bench.model import Observation, Ordering, Row
from parallel_consumer.bench.work import async_work, loop_factory

__all__ = ["AsyncioFloorContestant", "lanes_in_order", "read_records"]

Record = tuple[int, Any, int]


def read_records(bootstrap: str, topic: str, ends: dict[int, int], timeout: float) -> list[Record]:
    """Every record of ``topic`` below ``ends`` as ``(partition, key, offset)``, partition by
    partition in offset order (assigned, not subscribed: no group, nothing committed)."""
    consumer = Consumer(base_consumer_config(bootstrap, new_group("asyncio-read")))
    out: dict[int, list[Record]] = {p: [] for p in ends}
    left = sum(ends.values())
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        while left > 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"asyncio: read only {sum(map(len, out.values()))} records")
            for m in consumer.consume(num_messages=1000, timeout=1.0):
                if m.error():
                    continue
                partition, offset = m.partition() or 0, m.offset() or 0
                if offset < ends[partition]:
                    out[partition].append((partition, m.key(), offset))
                    left -= 1
    finally:
        consumer.close()
    return [record for p in sorted(out) for record in out[p]]


def _partition_offset(record: Record) -> tuple[int, int]:
    return record[0], record[2]


def lanes_in_order(records: list[Record], ordering: Ordering) -> list[list[Record]]:
    """``records`` split into what may not run at once, each lane in offset order, lanes in
    the order of their first record when the partitions are read round-robin (as a consumer
    fetching every partition sees them). Lanes start in that order, not longest first: in W6
    KEY-10000 (17,704 lanes of up to 4 records) that order needs 0.3 s of 50 ms calls at 5,000
    at once even at no cost per call; longest first would need 0.2 s."""
    by_partition: dict[int, list[Record]] = {}
    for record in sorted(records, key=_partition_offset):
        by_partition.setdefault(record[0], []).append(record)
    interleaved: list[Record] = []
    columns = list(by_partition.values())
    for i in range(max(map(len, columns), default=0)):
        interleaved.extend(column[i] for column in columns if i < len(column))
    lanes: dict[object, list[Record]] = {}
    for record in interleaved:
        lanes.setdefault(lane_of(*record, ordering), []).append(record)
    return list(lanes.values())


class AsyncioFloorContestant:
    name = "asyncio"
    description = (
        "the async rows' calls on a bare event loop (records read beforehand, no Kafka on the "
        "clock, no commits): the floor of a task per call"
    )

    def unavailable(self) -> str | None:
        return None

    def unsupported(self, row: Row) -> str | None:
        if not row.async_handler:
            return "asyncio runs async rows only (their floor on a bare event loop)"
        if row.batch_size != 1:
            return "asyncio has no batches"
        if row.runner.get("loop_factory") == "uvloop":
            return features.uvloop_missing()
        return None

    def run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        lanes = lanes_in_order(read_records(env.bootstrap, topic, ends, env.timeout), row.ordering)
        recorder = LogRecorder(sum(len(lane) for lane in lanes))
        loop = (loop_factory(row) or asyncio.new_event_loop)()
        started = time.time()
        try:
            finished = loop.run_until_complete(
                asyncio.wait_for(_run(lanes, row, recorder), env.timeout)
            )
        finally:
            loop.close()
        assert recorder.first_call is not None
        return Observation(
            started=started,
            first_call=recorder.first_call,
            finished=finished,
            log=recorder.log,
            extra={"clock": "first call to the end of the last; records read beforehand"},
        )


async def _run(lanes: list[list[Record]], row: Row, recorder: LogRecorder) -> float:
    """Run every lane, at most ``row.concurrency`` at once; return when the last ended (epoch).
    The clock starts inside the first call, as this library's handler starts it."""
    work = async_work(row.work)
    add_one = recorder.add_one
    perf_counter = time.perf_counter
    waiting = deque(lanes)
    all_done = asyncio.Event()
    loop = asyncio.get_running_loop()
    create_task = loop.create_task
    tasks: set[asyncio.Task[None]] = set()

    async def run_lane(lane: list[Record]) -> None:
        for partition, key, offset in lane:
            if recorder.first_call is None:
                recorder.first_call = time.time()
            t0 = perf_counter()
            await work()
            add_one(partition, key, offset, perf_counter() - t0)

    failures: list[BaseException] = []

    def ended(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:  # a failure of the harness itself: end the run with it
            failures.append(error)
            waiting.clear()
            all_done.set()
        elif waiting:
            start(waiting.popleft())
        elif not tasks:
            all_done.set()

    def start(lane: list[Record]) -> None:
        task = create_task(run_lane(lane))
        tasks.add(task)
        task.add_done_callback(ended)

    try:
        for _ in range(min(row.concurrency, len(waiting))):
            start(waiting.popleft())
        if tasks:
            await all_done.wait()
        if failures:
            raise failures[0]
        return time.time()
    finally:
        # A failure or a timeout leaves lanes running: end them before the loop closes.
        waiting.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
