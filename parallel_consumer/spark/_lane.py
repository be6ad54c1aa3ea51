"""One lane of the Spark runner: which lane a record runs in, and running a lane's records to
their end, retries included.

The lane rule is the engine's (:func:`~parallel_consumer.work.shards.shard_key_for`): a KEY lane
is a key of a partition, a PARTITION lane a partition; its records run one at a time in offset
order. The engine's UNORDERED lanes keep no order (any waiting record may run), so here each
such record is a lane of its own. What a failure leads to is the engine's pure decision
(:func:`~parallel_consumer.work.outcomes.decide`, its delays from
:func:`~parallel_consumer.retry.retry_delay`): retry after the delay, skip, dead-letter, or stop.

:class:`Attempts` is the one retry loop of one record, without the waiting: the drivers (threads
here in :func:`run_record`, asyncio in :mod:`parallel_consumer.spark._aio`) call the handler
with its :meth:`~Attempts.poll` and wait out the delay it returns.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import cast

from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.dead_letter import dead_letter_headers, default_topic
from parallel_consumer.errors import RetriesExhausted
from parallel_consumer.options import Options, ProcessingOrder
from parallel_consumer.produce import ProducerRecord, outputs_of
from parallel_consumer.spark._records import (
    SOURCE_ID,
    InputRecord,
    Message,
    OutputRow,
    PartitionTally,
    source_id,
)
from parallel_consumer.work.lanes import shard_key_for
from parallel_consumer.work.outcomes import (
    DeadLetterNow,
    RetryAt,
    SkipNow,
    StopNow,
    counts_as_attempt,
    decide,
)

__all__ = ["Attempts", "Lane", "lane_key", "lanes_of", "run_record"]


def lane_key(record: InputRecord, ordering: ProcessingOrder) -> object:
    """The lane of ``record``: the engine's lane (its key within its partition for KEY, its
    partition for PARTITION), or, for UNORDERED, the record itself."""
    tp = (record.topic, record.partition)
    if ordering is ProcessingOrder.UNORDERED:
        return (tp, record.offset)
    return shard_key_for(ordering, tp, record.key)


def lanes_of(
    records: Iterable[InputRecord], ordering: ProcessingOrder
) -> dict[object, list[InputRecord]]:
    """Records grouped into lanes by ``ordering``, lanes in order of first appearance, each lane
    in offset order."""
    lanes: dict[object, list[InputRecord]] = {}
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


class Lane:
    """The rows and tallies of one lane; owned by the one thread (or task) that runs it."""

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
        """A call of ``record`` ended with ``error`` (``attempts`` counts the failed ones so
        far): the delay before the next call, or None when the record is finished (skipped or
        dead-lettered). Raises RetriesExhausted on a stop decision."""
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
        headers = dead_letter_headers(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            timestamp_ms=record.timestamp_ms,
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
        topic, partition, offset = record.topic, record.partition, record.offset
        return OutputRow(
            self.options.dead_letter_topic or default_topic(topic),
            record.key,
            record.value,
            (*headers, (SOURCE_ID, source_id(topic, partition, offset, "dlq"))),
            None,
            True,
            topic,
            partition,
            offset,
        )

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.wall(), UTC)


class Attempts:
    """The calls of one record of a lane, from its first to its end: the argument of each call,
    and what the call's outcome leads to. Owned by the thread (or task) running the lane."""

    __slots__ = (
        "_attempts",
        "_error",
        "_first",
        "_lane",
        "_last",
        "_produced",
        "_record",
        "_tally",
    )

    def __init__(self, lane: Lane, record: InputRecord) -> None:
        self._lane = lane
        self._record = record
        self._tally = lane.started(record)
        #: Failed attempts so far, the last call's error, and when the failures ended.
        self._attempts = 0
        self._error: BaseException | None = None
        self._first: datetime | None = None
        self._last: datetime | None = None
        #: Outputs of the record so far (they are numbered across its calls).
        self._produced = 0

    def poll(self) -> PollContext:
        """The handler's argument for the next call."""
        record = self._record
        return PollContext.of_one(
            RecordContext(Message(record), self._attempts, self._error, self._last)
        )

    def ended(self, poll: PollContext, value: object, error: Exception | None) -> float | None:
        """The call with ``poll`` returned ``value``, or raised ``error``: the delay before the
        next call, or None when the record is finished (done, skipped or dead-lettered). Raises
        RetriesExhausted on a stop decision. A call that returned may still have failed the
        record (``PollContext.fail``, or a return value that is not outputs)."""
        lane = self._lane
        record = self._record
        failure: BaseException | None = error
        if error is None:
            try:
                outputs = outputs_of(value)
            except Exception as exc:
                failure = exc
            else:
                self._produced = lane.emit(record, outputs, self._produced, self._tally)
                failure = poll.outcomes(None)[0]
        if failure is None:
            self._tally.inputs += 1
            return None
        if counts_as_attempt(failure, lane.options):
            self._attempts += 1
            self._last = lane.now()
            self._first = self._first or self._last
        self._error = failure
        delay = lane.settle(record, failure, self._attempts, self._first, self._last)
        if delay is None:
            self._tally.inputs += 1
        return delay


def run_record(
    lane: Lane,
    record: InputRecord,
    handler: Callable[[PollContext], object],
    sleep: Callable[[float], None],
    stopping: threading.Event,
) -> None:
    """Run one record of ``lane`` to its end on this thread, sleeping the retry delays; gives
    up early once ``stopping`` is set. Raises RetriesExhausted (after setting ``stopping``) on
    a stop decision."""
    attempts = Attempts(lane, record)
    while True:
        poll = attempts.poll()
        try:
            value, error = handler(poll), None
        except Exception as exc:  # the record's failure; KeyboardInterrupt and exits propagate
            value, error = None, exc
        try:
            delay = attempts.ended(poll, value, error)
        except RetriesExhausted:
            stopping.set()
            raise
        if delay is None or stopping.is_set():
            return
        if delay > 0:
            sleep(delay)
            if stopping.is_set():
                return
