"""Dead letters on their way: building them, tracking their writes, preparing their topics.

Owned by the controller thread (:class:`DeadLetters`). A dead letter travels the same path as
a ``poll_and_produce`` output (engine/delivery.py -> the library's producer,
:class:`~parallel_consumer.kafka.producer.Outputs` -> ``OutputsDelivered``), as a one-record write
marked ``Pending.letter``, so that in the transactional mode it goes into the open transaction
with the offsets (the :class:`~parallel_consumer.work.outputs.TransactionGate` holds it back
while a transaction commits) and the record's offset is only marked done once the broker
acknowledged it. A write that fails leaves the record incomplete: it waits in the retry queue
and its dead letter is written again (:meth:`DeadLetters.failed`).

The headers are the contract of :mod:`parallel_consumer.dead_letter`. :func:`prepare_topics`
checks (or creates) the dead-letter topics when processing starts.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError
from confluent_kafka.cimpl import NewTopic

from parallel_consumer.context import RecordContext
from parallel_consumer.dead_letter import dead_letter_headers, default_topic
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.options import Options
from parallel_consumer.produce import ProducerRecord
from parallel_consumer.work.inflight import Batch
from parallel_consumer.work.item import TopicPartition, WorkItem

__all__ = ["DeadLetters", "Letter", "dead_letter_topics", "prepare_topics"]

log = logging.getLogger("parallel_consumer")

#: Delay before a failed dead-letter write is tried again: doubles per failure, up to the cap.
RESEND_FIRST = 1.0
RESEND_CAP = 30.0
#: Seconds allowed for reading topic metadata and creating a topic at start.
ADMIN_TIMEOUT = 15.0
#: Producer settings an admin client must not inherit.
_PRODUCER_ONLY = ("transactional.id", "transaction.timeout.ms", "enable.idempotence")


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
        log.warning(
            "%s[%d]@%d dead-lettered to %s (%s) after %d failed attempts: %r",
            *item.tp,
            item.offset,
            self.topic_for(item.tp),
            letter.reason,
            item.attempts,
            letter.error,
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


def dead_letter_topics(options: Options, topics: Iterable[str]) -> dict[str, str]:
    """Input topic -> its dead-letter topic, for the subscribed names. A ``^regex``
    subscription needs ``Options.dead_letter_topic``: the topics it will match are unknown."""
    out: dict[str, str] = {}
    for topic in topics:
        if options.dead_letter_topic is not None:
            out[topic] = options.dead_letter_topic
        elif topic.startswith("^"):
            raise ConfigurationError(
                f"dead-lettering is on and the subscription {topic!r} is a regex: set "
                "Options.dead_letter_topic (the '<topic>.dlq' default needs topic names, so that "
                "the dead-letter topics can be checked or created at start)"
            )
        else:
            out[topic] = default_topic(topic)
    looping = sorted(t for t in out.values() if t in out)
    if looping:
        raise ConfigurationError(
            f"the dead-letter topic {looping[0]!r} is also subscribed: its dead letters would be "
            "consumed (and could be dead-lettered) again; set Options.dead_letter_topic to a "
            "topic this consumer does not read"
        )
    for pattern in (t for t in out if t.startswith("^")):
        matched = sorted(t for t in set(out.values()) if _matches(pattern, t))
        if matched:
            raise ConfigurationError(
                f"the dead-letter topic {matched[0]!r} is also subscribed (the subscription "
                f"{pattern!r} matches it): its dead letters would be consumed (and could be "
                "dead-lettered) again; set Options.dead_letter_topic to a topic the regex does "
                "not match, or narrow the regex"
            )
    return out


def _matches(pattern: str, topic: str) -> bool:
    """Whether the ``^regex`` subscription ``pattern`` matches ``topic``, as the client's regex
    (unanchored at the end, like POSIX ``regexec``) would; a pattern Python cannot compile is
    left to the client."""
    try:
        return re.search(pattern, topic) is not None
    except re.error:
        return False


def admin_config(producer_config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in producer_config.items() if k not in _PRODUCER_ONLY}


def prepare_topics(
    admin_factory: Callable[[dict[str, Any]], Any],
    config: Mapping[str, Any],
    topics: Mapping[str, str],
) -> None:
    """Make sure every dead-letter topic exists: create the missing ones with as many
    partitions as their input topic (and the broker's default replication). Raises a
    ConfigurationError naming the topic when one is missing and cannot be created."""
    try:
        admin = admin_factory(admin_config(config))
        metadata = admin.list_topics(timeout=ADMIN_TIMEOUT)
    except Exception as exc:
        raise ConfigurationError(
            f"could not read the topics of the cluster to check the dead-letter topics "
            f"({', '.join(sorted(set(topics.values())))}): {exc}"
        ) from exc
    known = {name: t for name, t in metadata.topics.items() if t.error is None}
    missing: dict[str, int] = {}
    for source, target in topics.items():
        if target in known or target in missing:
            continue
        source_meta = known.get(source)
        missing[target] = len(source_meta.partitions) if source_meta is not None else 1
    if not missing:
        return
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=count) for name, count in missing.items()],
        request_timeout=ADMIN_TIMEOUT,
    )
    for name, future in futures.items():
        try:
            future.result(ADMIN_TIMEOUT)
        except Exception as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise ConfigurationError(
                f"the dead-letter topic {name!r} does not exist and could not be created "
                f"({exc}); create it, or set Options.dead_letter_topic to a topic that exists "
                "(see docs/dead-letters.md)"
            ) from exc
        log.info("created the dead-letter topic %s (%d partitions)", name, missing[name])
