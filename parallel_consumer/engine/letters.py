"""Dead letters on their way: building them and tracking their writes.

Owned by the controller thread (:class:`DeadLetters`). A dead letter travels the same path as
a ``poll_and_produce`` output (engine/delivery.py -> the library's producer,
:class:`~parallel_consumer.kafka.producer.Outputs` -> ``OutputsDelivered``), as a one-record write
marked ``Pending.letter``, so that in the transactional mode it goes into the open transaction
with the offsets (the :class:`~parallel_consumer.work.outputs.TransactionGate` holds it back
while a transaction commits) and the record's offset is only marked done once the broker
acknowledged it. A write that fails leaves the record incomplete: it waits in the retry queue
and its dead letter is written again (:meth:`DeadLetters.failed`).

The headers are the contract of :mod:`parallel_consumer.dead_letter`. The dead-letter topics are
checked (or created) when processing starts by :mod:`parallel_consumer.kafka.dead_letter_topics`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parallel_consumer.context import RecordContext
from parallel_consumer.dead_letter import dead_letter_headers, default_topic
from parallel_consumer.options import Options
from parallel_consumer.produce import ProducerRecord
from parallel_consumer.work.inflight import Batch
from parallel_consumer.work.item import TopicPartition, WorkItem
from parallel_consumer.work.outcomes import failed_attempts

__all__ = ["DeadLetters", "Letter"]

log = logging.getLogger("parallel_consumer")

#: Delay before a failed dead-letter write is tried again: doubles per failure, up to the cap.
RESEND_FIRST = 1.0
RESEND_CAP = 30.0


@dataclass(slots=True)
class Letter:
    """One record to dead-letter: why, with which error, and how many writes failed."""

    item: WorkItem
    error: BaseException | None
    reason: str
    failures: int = 0


class DeadLetters:
    """Dead letters being written or waiting to be written again. Owned by the controller."""

    __slots__ = ("_group", "_topic", "_trace_id", "sending", "waiting")

    def __init__(
        self,
        options: Options,
        group: str,
        trace_id: Callable[[RecordContext], str | None] | None = None,
    ) -> None:
        self._topic = options.dead_letter_topic
        self._group = group
        #: The trace id of a record's processing (telemetry), for the ``pc.dlq.trace.id`` header.
        self._trace_id = trace_id
        #: Batch id -> letter, while its write is on its way (or held back by the gate).
        self.sending: dict[int, Letter] = {}
        #: id(item) -> letter, while the record waits in the retry queue for another write.
        self.waiting: dict[int, Letter] = {}

    def topic_for(self, tp: TopicPartition) -> str:
        return self._topic or default_topic(tp[0])

    def start(self, letter: Letter, batch_id: int, now: float) -> tuple[Batch, ProducerRecord]:
        """The one-record write of ``letter``, as write ``batch_id`` (an id of the in-flight
        table's, so that the producer's reports never mix it up with a handler call's)."""
        item = letter.item
        message = item.message
        kind, millis = message.timestamp()
        headers = dead_letter_headers(
            topic=item.tp[0],
            partition=item.tp[1],
            offset=item.offset,
            timestamp_ms=millis if kind and millis is not None and millis >= 0 else None,
            attempts=item.attempts,
            error=letter.error,
            first_failure_at=item.first_failure_at,
            last_failure_at=item.last_failure_at,
            group=self._group,
            reason=letter.reason,
            trace_id=self._trace_id(RecordContext(message)) if self._trace_id else None,
            original_headers=message.headers() or None,
            delivery_count=_delivery_count(message),
        )
        # The record's key (the default partitioner keeps each key's dead letters in order).
        record = ProducerRecord(
            self.topic_for(item.tp), message.value(), message.key(), list(headers)
        )
        batch = Batch(batch_id, (item,), now)
        self.sending[batch.id] = letter
        return batch, record

    def sending_for(self, item: WorkItem) -> bool:
        """``item``'s dead letter is on its way (or held back by the transaction gate)."""
        return any(letter.item is item for letter in self.sending.values())

    def settled(self, batch_id: int) -> Letter | None:
        return self.sending.pop(batch_id, None)

    def written(self, letter: Letter) -> None:
        """The broker acknowledged ``letter``: say so (the controller marks the record done)."""
        item = letter.item
        error = letter.error
        log.warning(
            "%s[%d]@%d dead-lettered to %s (%s) after %s: %r",
            *item.tp,
            item.offset,
            self.topic_for(item.tp),
            letter.reason,
            failed_attempts(item.attempts),
            error,
            exc_info=error,  # (a final failure: with its traceback, and its cause's)
        )

    def failed(self, letter: Letter, error: BaseException) -> float:
        """The write of ``letter`` failed: it waits (the record stays uncommitted) to be written
        again; returns the delay before that."""
        letter.failures += 1
        self.waiting[id(letter.item)] = letter
        delay = min(RESEND_CAP, RESEND_FIRST * 2.0 ** min(letter.failures - 1, 16))
        item = letter.item
        log.warning(
            "the dead letter of %s[%d]@%d to %s was not written (%s); the record stays "
            "uncommitted and is written again in %.1fs",
            *item.tp,
            item.offset,
            self.topic_for(item.tp),
            error,
            delay,
        )
        return delay

    def take_waiting(self, item: WorkItem) -> Letter | None:
        """The letter of ``item`` if it waits for another write (it is due now)."""
        if not self.waiting:
            return None
        return self.waiting.pop(id(item), None)

    def forget(self, tp: TopicPartition) -> None:
        """The partition left the assignment: its waiting letters go (their records come again
        to the partition's next owner, which fails and dead-letters them itself)."""
        if self.waiting:
            self.waiting = {k: v for k, v in self.waiting.items() if v.item.tp != tp}

    def __len__(self) -> int:
        return len(self.sending) + len(self.waiting)

    def __repr__(self) -> str:
        return f"<DeadLetters sending={len(self.sending)} waiting={len(self.waiting)}>"


def _delivery_count(message: Any) -> int | None:
    """A share group's record says how often the broker delivered it; others do not."""
    count = getattr(message, "delivery_count", None)
    value = count() if callable(count) else None
    return value if isinstance(value, int) and value > 0 else None
