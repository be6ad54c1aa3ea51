"""The Spark runner's records: what a Spark task hands in (:class:`InputRecord`, seen by the
handler through :class:`Message`), what it writes out (:class:`OutputRow`, tagged with
:data:`SOURCE_ID`), and what it did per Kafka partition (:class:`PartitionTally`). Plain values,
no Spark and no Kafka client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "SOURCE_ID",
    "Header",
    "InputRecord",
    "Message",
    "OutputRow",
    "PartitionTally",
    "Result",
    "source_id",
]

#: Header added to every output row: ``<topic>/<partition>@<offset>/<n>`` of the input record
#: (``n`` counts its outputs from 0; a dead letter's ``n`` is ``dlq``). Deterministic for a
#: deterministic handler, so a replayed micro-batch writes the same ids again.
SOURCE_ID = "pc.source.id"

Header = tuple[str, bytes | None]

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
