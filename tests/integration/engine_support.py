"""Shared pieces of the engine's integration tests (``tests/integration/test_engine_*.py``).

Importable by its bare name: pytest's default ``prepend`` import mode puts this folder on
``sys.path`` when it collects the test modules beside it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, TopicPartition

from parallel_consumer import (
    Lifecycle,
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    Statistics,
)
from parallel_consumer.kafka.committed_reader import CommittedReader
from parallel_consumer.offsets import read_committed_metadata

log = logging.getLogger(__name__)

#: How often waits re-check their condition: often enough to be prompt, rare enough to leave the
#: two cores of the test machine to the engine and the broker.
POLL_STEP = 0.01


def wait_until(
    condition: Callable[[], object],
    *,
    timeout: float,
    what: str,
    show: Callable[[], object] | None = None,
) -> None:
    """Re-check ``condition`` every few milliseconds; fail the test after ``timeout`` seconds.

    ``show`` adds what it returns (e.g. ``pc.statistics``) to the failure message.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            detail = f"; {show()}" if show is not None else ""
            pytest.fail(f"timed out after {timeout} s waiting for {what}{detail}")
        time.sleep(POLL_STEP)


def holds_for(condition: Callable[[], object], *, seconds: float, what: str) -> None:
    """Check that ``condition`` stays true for a bounded observation window (proving a negative)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not condition():
            pytest.fail(f"{what} stopped holding within {seconds} s")
        time.sleep(POLL_STEP)


class Call(NamedTuple):
    """One handler call on one record, in the order the calls started."""

    partition: int
    key: bytes | None
    offset: int
    attempts: int


def lane_of(ordering: ProcessingOrder, partition: int, key: bytes | None) -> object:
    """The ordering lane of a record: what may have at most one record in flight at a time."""
    if ordering is ProcessingOrder.KEY:
        return (partition, key)
    if ordering is ProcessingOrder.PARTITION:
        return partition
    return None  # UNORDERED: no lane


class Recorder:
    """Collects every handler call from the worker threads, and overlaps within a lane.

    Use ``with recorder.call(ctx):`` around the handler's work; an overlap is a second record of
    the same lane starting while another of that lane is still inside the handler.
    """

    def __init__(self, ordering: ProcessingOrder = ProcessingOrder.UNORDERED) -> None:
        self._ordering = ordering
        self._lock = threading.Lock()
        self._running: Counter[object] = Counter()
        self.calls: list[Call] = []
        self.seen: set[tuple[int, int]] = set()
        self.overlaps: list[Call] = []

    @contextlib.contextmanager
    def call(self, ctx: PollContext) -> Iterator[Call]:
        record = Call(ctx.partition, ctx.key, ctx.offset, ctx.attempts)
        lane = lane_of(self._ordering, record.partition, record.key)
        with self._lock:
            self.calls.append(record)
            self.seen.add((record.partition, record.offset))
            if lane is not None:
                self._running[lane] += 1
                if self._running[lane] > 1:
                    self.overlaps.append(record)
        try:
            yield record
        finally:
            if lane is not None:
                with self._lock:
                    self._running[lane] -= 1

    def offsets(self, partition: int | None = None) -> set[int]:
        with self._lock:
            return {o for p, o in self.seen if partition is None or p == partition}

    @property
    def duplicates(self) -> int:
        """Handler calls beyond the first per record (retries included)."""
        with self._lock:
            return len(self.calls) - len(self.seen)

    def out_of_order(self) -> list[tuple[object, int, int]]:
        """(lane, previous, offset) wherever a record's first call came before an earlier
        offset's first call of the same lane."""
        first_calls: list[Call] = []
        already: set[tuple[int, int]] = set()
        with self._lock:
            for c in self.calls:
                if (c.partition, c.offset) not in already:
                    already.add((c.partition, c.offset))
                    first_calls.append(c)
        last: dict[object, int] = {}
        wrong = []
        for c in first_calls:
            lane = lane_of(self._ordering, c.partition, c.key)
            if lane is None:
                continue
            if lane in last and c.offset <= last[lane]:
                wrong.append((lane, last[lane], c.offset))
            last[lane] = c.offset
        return wrong


class Engines:
    """Starts ParallelConsumers for a test and makes sure every one is closed at its end.

    ``gate()`` hands out events that handlers block on; they are all set after the engines are
    closed, so blocked worker threads end before the suite's leaked-thread check.
    """

    def __init__(self) -> None:
        self._instances: list[ParallelConsumer] = []
        self._gates: list[threading.Event] = []

    def start(
        self,
        config: Mapping[str, Any],
        options: Options,
        topics: str | list[str],
        handler: Callable[[PollContext], object],
        **subscribe: Any,
    ) -> ParallelConsumer:
        pc = ParallelConsumer(dict(config), options)
        self._instances.append(pc)
        pc.subscribe(topics, **subscribe)
        pc.poll(handler)
        return pc

    def gate(self) -> threading.Event:
        event = threading.Event()
        self._gates.append(event)
        return event

    def close_all(self) -> None:
        for pc in self._instances:
            if pc.lifecycle is not Lifecycle.CLOSED:
                try:
                    pc.close(drain=False, timeout=1.0)
                except Exception:
                    log.exception("closing %r at the end of the test failed", pc)
        for event in self._gates:
            event.set()


def committed(
    config: Mapping[str, Any], topic: str, partitions: Sequence[int]
) -> dict[int, tuple[int, str]]:
    """What the broker stores for ``config``'s group: partition -> (offset, metadata).

    An unset offset reads as -1001 (OFFSET_INVALID) and missing metadata as "". The metadata is
    read with its exact length (``CommittedReader``; confluent-kafka's ``committed()`` reads a
    map committed without a NUL past its end), less the one NUL confluent-kafka stores after
    the metadata it commits (``commit_directly``; the consumer commits its maps exactly).
    """
    reader = CommittedReader({k: config[k] for k in ("bootstrap.servers", "group.id")})
    try:
        exact = reader.read([(topic, p) for p in partitions], timeout=15)
    finally:
        reader.close()
    if exact is not None:
        answer = {p: exact.get((topic, p), (OFFSET_INVALID, None)) for p in partitions}
        return {
            p: (offset, (metadata or "").removesuffix("\x00"))
            for p, (offset, metadata) in answer.items()
        }
    # (a test that made the exact reader unavailable: the map as read_committed_metadata cuts it)
    consumer = Consumer(
        {
            "bootstrap.servers": config["bootstrap.servers"],
            "group.id": config["group.id"],
            "enable.auto.commit": False,
        }
    )
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=15)
    finally:
        consumer.close()
    return {tp.partition: (tp.offset, read_committed_metadata(tp) or "") for tp in found}


def commit_directly(
    config: Mapping[str, Any], topic: str, offsets: Mapping[int, tuple[int, str]]
) -> None:
    """Commit partition -> (offset, metadata) for ``config``'s group with a plain consumer."""
    consumer = Consumer(
        {
            "bootstrap.servers": config["bootstrap.servers"],
            "group.id": config["group.id"],
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o, metadata=m) for p, (o, m) in offsets.items()],
            asynchronous=False,
        )
    finally:
        consumer.close()


def end_offsets(bootstrap_servers: str, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    """The high watermark (offset after the last record or marker) of each partition."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap_servers, "group.id": "pc-watermarks-unused"}
    )
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
            for p in partitions
        }
    finally:
        consumer.close()


def committed_in_engine(stats: Statistics, offsets: Mapping[int, int]) -> bool:
    """True when each partition -> offset of ``offsets`` is assigned, acknowledged committed at
    that offset by the broker, and clean (nothing finished since that commit)."""
    snapshots = {s.partition: s for s in stats.partitions}
    return all(
        (snapshot := snapshots.get(partition)) is not None
        and snapshot.committed_offset == offset
        and not snapshot.dirty
        for partition, offset in offsets.items()
    )
