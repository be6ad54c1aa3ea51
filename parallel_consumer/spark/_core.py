"""The PySpark runner's core, pure Python (no Spark, no Kafka client): run a handler over ordered
slices of Kafka partitions and return the rows to write.

A Spark task hands :func:`process` the records of one or more whole Kafka partitions, each in
offset order. Records are split into *lanes* by ``Options.ordering`` (one per key of a partition
for ``KEY``, one per partition for ``PARTITION``, one per record for ``UNORDERED``); a lane runs
its records one at a time, in offset order, retries included, while up to
``Options.max_concurrency`` lanes run at once (worker threads, or tasks on one event loop for an
``async def`` handler). What a record's failure leads to is the engine's own pure decision
(:func:`parallel_consumer.work.outcomes.decide`): retry after the retry delay (the lane sleeps,
so the record's key and the Spark task wait), skip, dead-letter, or stop (the task fails).

The result is a list of :class:`OutputRow`: the handler's produced records and the dead letters
(with the headers of :mod:`parallel_consumer.dead_letter`), each carrying a :data:`SOURCE_ID`
header that names its input record, so that downstream readers can drop the duplicates of a
replayed micro-batch. Nothing here is shared between calls: every call owns its lanes and tallies.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple, cast

from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.dead_letter import dead_letter_headers, default_topic
from parallel_consumer.errors import ConfigurationError, DeadLetter, RetriesExhausted, Skip
from parallel_consumer.options import Options, ProcessingOrder, RunnerKind
from parallel_consumer.produce import ProducerRecord, outputs_of
from parallel_consumer.runners.base import handler_kind
from parallel_consumer.work.outcomes import DeadLetterNow, RetryAt, SkipNow, StopNow, decide

__all__ = [
    "SOURCE_ID",
    "InputRecord",
    "Lane",
    "LaneKey",
    "Message",
    "OutputRow",
    "PartitionTally",
    "Result",
    "check_options",
    "lane_key",
    "lanes_of",
    "process",
    "run_record",
    "source_id",
]

log = logging.getLogger("parallel_consumer.spark")

#: Header added to every output row: ``<topic>/<partition>@<offset>/<n>`` of the input record
#: (``n`` counts its outputs from 0; a dead letter's ``n`` is ``dlq``). Deterministic for a
#: deterministic handler, so a replayed micro-batch writes the same ids again.
SOURCE_ID = "pc.source.id"

Header = tuple[str, bytes | None]
LaneKey = tuple[Any, ...]

#: confluent_kafka's timestamp types (``Message.timestamp()[0]``).
TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1


class InputRecord(NamedTuple):
    """One Kafka record as a Spark Kafka source row gives it.

    ``timestamp_type`` uses confluent_kafka's numbers (1 create time, 2 log-append time; Spark's
    ``timestampType`` column is one less)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None
    timestamp_type: int = TIMESTAMP_CREATE_TIME
    headers: tuple[Header, ...] = ()


class Message:
    """The subset of ``confluent_kafka.Message`` that :class:`RecordContext` reads."""

    __slots__ = ("_record",)

    def __init__(self, record: InputRecord) -> None:
        self._record = record

    def topic(self) -> str:
        return self._record.topic

    def partition(self) -> int:
        return self._record.partition

    def offset(self) -> int:
        return self._record.offset

    def key(self) -> bytes | None:
        return self._record.key

    def value(self) -> bytes | None:
        return self._record.value

    def headers(self) -> list[Header] | None:
        return list(self._record.headers) or None

    def timestamp(self) -> tuple[int, int]:
        millis = self._record.timestamp_ms
        if millis is None or millis < 0:
            return TIMESTAMP_NOT_AVAILABLE, -1
        return self._record.timestamp_type, millis


class OutputRow(NamedTuple):
    """One record to write: a handler output (``dead_letter`` False) or a dead letter."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    #: The output partition the handler asked for; None lets the producer's partitioner pick.
    partition: int | None
    dead_letter: bool
    source_topic: str
    source_partition: int
    source_offset: int


@dataclass(slots=True)
class PartitionTally:
    """What one call did with the records of one Kafka partition."""

    inputs: int = 0
    first_offset: int = -1
    last_offset: int = -1
    outputs: int = 0
    dead_letters: int = 0
    skipped: int = 0
    #: Failed attempts that were retried.
    retries: int = 0

    def add(self, other: PartitionTally) -> None:
        if other.first_offset >= 0:
            if self.first_offset < 0 or other.first_offset < self.first_offset:
                self.first_offset = other.first_offset
            self.last_offset = max(self.last_offset, other.last_offset)
        self.inputs += other.inputs
        self.outputs += other.outputs
        self.dead_letters += other.dead_letters
        self.skipped += other.skipped
        self.retries += other.retries


@dataclass(slots=True)
class Result:
    """The rows of one call, in lane order (each lane's rows in offset order), and its tallies
    per ``(topic, partition)``."""

    rows: list[OutputRow] = field(default_factory=list)
    partitions: dict[tuple[str, int], PartitionTally] = field(default_factory=dict)


def source_id(topic: str, partition: int, offset: int, index: int | str) -> bytes:
    """The :data:`SOURCE_ID` header value of the ``index``-th output of a record."""
    return f"{topic}/{partition}@{offset}/{index}".encode("utf-8", errors="backslashreplace")


def check_options(options: Options, handler: Callable[..., object]) -> None:
    """Refuse the settings the Spark runner cannot honour, with what to do instead."""
    if not callable(handler):
        raise ConfigurationError(
            f"the handler must be a callable taking a PollContext: {handler!r}"
        )
    if options.batch_size != 1:
        raise ConfigurationError(
            f"Options.batch_size={options.batch_size}: the Spark runner calls the handler with "
            "one record at a time; remove batch_size (Spark already batches by micro-batch)"
        )
    if options.processing_timeout is not None:
        log.warning(
            "Options.processing_timeout=%s is not applied by the Spark runner (a call runs to "
            "its end); Spark's own task timeouts and speculation are the tools there",
            options.processing_timeout,
        )
    if options.runner is RunnerKind.PROCESS:
        raise ConfigurationError(
            "Options.runner='process' does not apply on Spark: each Spark task already runs in "
            "its own Python worker process; scale CPU-bound work with more Spark cores instead"
        )


class Lane:
    """Runs the records of one lane in order; owned by the one thread (or task) that runs it."""

    __slots__ = ("group", "options", "rows", "tally_of", "wall")

    def __init__(self, options: Options, group: str, wall: Callable[[], float]) -> None:
        self.options = options
        self.group = group
        self.wall = wall
        self.rows: list[OutputRow] = []
        self.tally_of: dict[tuple[str, int], PartitionTally] = {}

    def tally(self, record: InputRecord) -> PartitionTally:
        tp = (record.topic, record.partition)
        found = self.tally_of.get(tp)
        if found is None:
            found = self.tally_of[tp] = PartitionTally()
        return found

    def started(self, record: InputRecord) -> PartitionTally:
        """Count ``record`` in its partition's offset range; returns that partition's tally."""
        tally = self.tally(record)
        offset = record.offset
        if tally.first_offset < 0 or offset < tally.first_offset:
            tally.first_offset = offset
        if offset > tally.last_offset:
            tally.last_offset = offset
        return tally

    def emit(
        self,
        record: InputRecord,
        outputs: Sequence[ProducerRecord],
        first: int,
        tally: PartitionTally,
    ) -> int:
        """Add the outputs of one call (numbered from ``first``); returns the next number."""
        if not outputs:
            return first
        topic, partition, offset = record.topic, record.partition, record.offset
        append = self.rows.append
        for index, out in enumerate(outputs, first):
            ident = (SOURCE_ID, source_id(topic, partition, offset, index))
            headers = out.headers
            if headers:
                # (an id forwarded from an earlier stage would come first and be taken for this
                # output's)
                headers = [h for h in headers if h[0] != SOURCE_ID]
            append(
                OutputRow(
                    out.topic,
                    out.key,
                    out.value,
                    (*headers, ident) if headers else (ident,),
                    out.partition,
                    False,
                    topic,
                    partition,
                    offset,
                )
            )
        tally.outputs += len(outputs)
        return first + len(outputs)

    def settle(
        self,
        record: InputRecord,
        error: BaseException,
        attempts: int,
        first_failure: datetime | None,
        last_failure: datetime | None,
    ) -> float | None:
        """A failed attempt (``attempts`` counts it): the delay before the next one, or None
        when the record is finished (skipped or dead-lettered). Raises on a stop decision."""
        context = RecordContext(Message(record), attempts, error, last_failure)
        decision = decide(error, context, time.monotonic(), self.options)
        tally = self.tally(record)
        if isinstance(decision, RetryAt):
            tally.retries += 1
            return decision.delay
        if isinstance(decision, SkipNow):
            tally.skipped += 1
            return None
        if isinstance(decision, DeadLetterNow):
            self.rows.append(
                self.dead_letter(record, error, attempts, first_failure, last_failure, decision)
            )
            tally.dead_letters += 1
            return None
        assert isinstance(decision, StopNow)
        raise RetriesExhausted(decision.message) from error

    def dead_letter(
        self,
        record: InputRecord,
        error: BaseException,
        attempts: int,
        first_failure: datetime | None,
        last_failure: datetime | None,
        decision: DeadLetterNow,
    ) -> OutputRow:
        if isinstance(error, DeadLetter) and error.__cause__ is not None:
            error = error.__cause__  # `raise DeadLetter(...) from exc`: the headers name exc
        stamp = record.timestamp_ms
        headers = dead_letter_headers(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            # (Kafka's -1 means no timestamp)
            timestamp_ms=stamp if stamp is not None and stamp > 0 else None,
            attempts=attempts,
            error=error,
            first_failure_at=first_failure,
            last_failure_at=last_failure,
            group=self.group,
            reason=decision.reason,
            # Kafka headers may have no value; they are kept as they came.
            original_headers=cast(
                "list[tuple[str, bytes]]", [h for h in record.headers if h[0] != SOURCE_ID]
            ),
        )
        topic = self.options.dead_letter_topic or default_topic(record.topic)
        return OutputRow(
            topic,
            record.key,
            record.value,
            (*headers, (SOURCE_ID, source_id(*_where(record), "dlq"))),
            None,
            True,
            *_where(record),
        )

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.wall(), UTC)


def _where(record: InputRecord) -> tuple[str, int, int]:
    return record.topic, record.partition, record.offset


def _attempt(handler: Callable[[PollContext], object], record: InputRecord, context: Any) -> Any:
    """One call; returns (outputs, error)."""
    poll = PollContext.of_one(context)
    try:
        outputs = outputs_of(handler(poll))
    except Exception as exc:  # the record's failure; KeyboardInterrupt and exits propagate
        return [], exc
    return outputs, poll.outcomes(None)[0]


def run_record(
    lane: Lane,
    record: InputRecord,
    handler: Callable[[PollContext], object],
    sleep: Callable[[float], None],
    stopping: threading.Event,
) -> None:
    """Run one record of ``lane`` to its end: success, retries, then skip or dead letter.
    Raises RetriesExhausted (after setting ``stopping``) on a stop decision."""
    tally = lane.started(record)
    attempts, error, first, last = 0, None, None, None
    produced = 0
    while True:
        context = RecordContext(Message(record), attempts, error, last)
        outputs, error = _attempt(handler, record, context)
        produced = lane.emit(record, outputs, produced, tally)
        if error is None:
            break
        if not isinstance(error, Skip | DeadLetter):
            # (as in the engine: raising Skip or DeadLetter is a decision, not a failed attempt)
            attempts += 1
            last = lane.now()
            first = first or last
        try:
            delay = lane.settle(record, error, attempts, first, last)
        except RetriesExhausted:
            stopping.set()
            raise
        if delay is None or stopping.is_set():
            break
        if delay > 0:
            sleep(delay)
            if stopping.is_set():
                break
    tally.inputs += 1


def _run_lane_sync(
    lane: Lane,
    records: Sequence[InputRecord],
    handler: Callable[[PollContext], object],
    sleep: Callable[[float], None],
    stopping: threading.Event,
) -> Lane:
    try:
        for record in records:
            if stopping.is_set():  # another lane stopped the call: its result is an error anyway
                break
            run_record(lane, record, handler, sleep, stopping)
    except BaseException:
        stopping.set()  # (a SystemExit or KeyboardInterrupt of the handler stops the others)
        raise
    return lane


def lane_key(record: InputRecord, ordering: ProcessingOrder) -> LaneKey:
    """The lane of ``record``: its key within its partition (KEY), its partition (PARTITION),
    or itself (UNORDERED)."""
    if ordering is ProcessingOrder.KEY:
        return (record.topic, record.partition, record.key)
    if ordering is ProcessingOrder.PARTITION:
        return (record.topic, record.partition)
    return (record.topic, record.partition, record.offset)


def lanes_of(
    records: Iterable[InputRecord], ordering: ProcessingOrder
) -> dict[LaneKey, list[InputRecord]]:
    """Records grouped into lanes by ``ordering``, lanes in order of first appearance, each lane
    in offset order."""
    lanes: dict[LaneKey, list[InputRecord]] = {}
    for record in records:
        key = lane_key(record, ordering)
        lane = lanes.get(key)
        if lane is None:
            lanes[key] = [record]
        else:
            lane.append(record)
    for lane in lanes.values():
        if any(a.offset > b.offset for a, b in itertools.pairwise(lane)):
            lane.sort(key=lambda r: r.offset)
    return lanes


def process(
    records: Iterable[InputRecord],
    handler: Callable[[PollContext], object],
    options: Options,
    *,
    group: str = "spark",
    executor: Executor | None = None,
    sleep: Callable[[float], None] = time.sleep,
    wall: Callable[[], float] = time.time,
) -> Result:
    """Run ``handler`` over ``records`` (whole Kafka partitions, each in offset order) and return
    the rows to write. ``group`` fills the dead letters' ``pc.dlq.group`` header; ``executor``
    (threads, reused across calls by the Spark adapter) runs the lanes of a plain handler,
    else a pool of ``max_concurrency`` threads is made for this call; ``sleep`` waits out retry
    delays of a plain handler and ``wall`` stamps failures (tests pass fakes).

    Raises :class:`~parallel_consumer.errors.RetriesExhausted` when a record's failure leads
    to a stop (``OnExhausted.STOP``, or ``DeadLetter`` with dead-lettering off): the Spark
    task fails, Spark retries it and in the end fails the query.
    """
    lanes = lanes_of(records, options.ordering)
    result = Result()
    if not lanes:
        return result
    if handler_kind(handler) == "async":
        from parallel_consumer.spark._aio import run_lanes

        with asyncio.Runner(loop_factory=options.loop_factory) as runner:
            done = runner.run(run_lanes(lanes, handler, options, group, wall))
    else:
        done = _run_threads(lanes, handler, options, group, executor, sleep, wall)
    for lane in done:
        result.rows.extend(lane.rows)
        for tp, tally in lane.tally_of.items():
            total = result.partitions.get(tp)
            if total is None:
                result.partitions[tp] = tally
            else:
                total.add(tally)
    return result


def _run_threads(
    lanes: dict[LaneKey, list[InputRecord]],
    handler: Callable[[PollContext], object],
    options: Options,
    group: str,
    executor: Executor | None,
    sleep: Callable[[float], None],
    wall: Callable[[], float],
) -> list[Lane]:
    own = None
    if executor is None:
        own = executor = ThreadPoolExecutor(
            min(options.max_concurrency, len(lanes)), thread_name_prefix=f"{options.name}-spark"
        )
    stopping = threading.Event()
    futures = [
        executor.submit(_run_lane_sync, Lane(options, group, wall), lane, handler, sleep, stopping)
        for lane in lanes.values()
    ]
    try:
        done = [future.result() for future in futures]
    except BaseException:
        stopping.set()  # the lanes still running end after their current record
        # A stop (or an interrupt): lanes not started yet need not run, and the caller gets
        # control back without waiting for the lanes still running.
        for future in futures:
            future.cancel()
        if own is not None:
            own.shutdown(wait=False, cancel_futures=True)
        raise
    if own is not None:
        own.shutdown(wait=True)
    return done
