"""Reading a dead-letter topic for ``pc dlq``: which records to read, reading them without
joining a group, matching them against ``--filter`` and describing them (one dict per record:
a table row of ``show``, a JSON object of ``show --json`` and ``redrive --dry-run``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import Consumer, Message, TopicPartition

from parallel_consumer import dead_letter as dl
from parallel_consumer.cli.brokers import client_config

__all__ = [
    "DlqError",
    "Range",
    "describe",
    "header_filter",
    "headers",
    "matches",
    "open_consumer",
    "partitions",
    "ranges",
    "read",
]

#: How long a read may wait without any progress before it reports what it is stuck on.
IDLE_LIMIT = 30.0

#: The dead-letter headers ``--filter`` knows by their short names (``reason=stalled``).
_SHORT_NAMES = {
    dl.ORIGINAL_TOPIC,
    dl.ORIGINAL_PARTITION,
    dl.REASON,
    dl.ERROR_TYPE,
    dl.GROUP,
    dl.ATTEMPTS,
}


class DlqError(Exception):
    """A ``pc dlq`` command cannot go on; the message says why and what to do."""


def header_filter(text: str) -> tuple[str, str]:
    """``--filter HEADER=VALUE``; the dead-letter headers also by their short names."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected header=value, got {text!r}")
    key = key.strip()
    if not key.startswith((dl.DLQ_PREFIX, dl.REDRIVE_PREFIX)) and (
        f"{dl.DLQ_PREFIX}{key}" in _SHORT_NAMES
    ):
        key = f"{dl.DLQ_PREFIX}{key}"
    return key, value


@dataclass(frozen=True)
class Range:
    """The offsets ``[start, end)`` of one partition to read."""

    tp: TopicPartition
    start: int
    end: int


def open_consumer(args: argparse.Namespace, group: str) -> Consumer:
    """A consumer of committed records only, which commits nothing by itself."""
    return Consumer(
        client_config(
            args,
            **{
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "enable.partition.eof": False,
            },
        )
    )


def partitions(consumer: Consumer, topic: str, timeout: float) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=timeout)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        reason = found.error if found is not None and found.error is not None else "no partitions"
        raise DlqError(f"topic {topic!r} cannot be read ({reason}); is the name right?")
    return sorted(found.partitions)


def ranges(
    consumer: Consumer,
    topic: str,
    starts: dict[int, int] | None,
    from_offset: int | None,
    timeout: float,
) -> list[Range]:
    """What to read of each partition: from ``starts`` (committed progress), ``from_offset``
    or the first record, to the end the partition has now."""
    out = []
    for partition in partitions(consumer, topic, timeout):
        tp = TopicPartition(topic, partition)
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
        start = low
        if starts is not None and starts.get(partition, -1) >= 0:
            start = max(low, starts[partition])
        if from_offset is not None:
            start = max(low, from_offset)
        if start < high:
            out.append(Range(tp, start, high))
    return out


def read(consumer: Consumer, ranges: Sequence[Range]) -> Iterator[Message]:
    """Every record of ``ranges``, partition by partition in offset order as fetched; stops once
    the consumer's position reached each range's end (past transaction markers too)."""
    if not ranges:
        return
    consumer.assign([TopicPartition(r.tp.topic, r.tp.partition, r.start) for r in ranges])
    open_ = {r.tp.partition: r.end for r in ranges}
    idle_since = time.monotonic()
    while open_:
        messages = consumer.consume(num_messages=500, timeout=0.5)
        for message in messages:
            error = message.error()
            if error is not None:
                raise DlqError(f"reading {message.topic()}: {error}")
            partition = message.partition()
            offset = message.offset()
            assert partition is not None
            assert offset is not None
            end = open_.get(partition)
            if end is None or offset >= end:
                continue
            idle_since = time.monotonic()
            yield message
        # The position moves past transaction markers and aborted records too, which a
        # read_committed consumer never sees as messages.
        for answer in consumer.position(
            [TopicPartition(ranges[0].tp.topic, p) for p in list(open_)]
        ):
            if answer.offset >= open_[answer.partition]:
                del open_[answer.partition]
                idle_since = time.monotonic()
        if open_ and time.monotonic() - idle_since > IDLE_LIMIT:
            raise DlqError(
                f"no progress for {IDLE_LIMIT:.0f} s reading partitions {sorted(open_)}; "
                "is an open transaction holding them back (read_committed)?"
            )


def headers(message: Message) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    # A consumed record's headers are always a list of pairs (dicts are for producing).
    pairs = cast(list[tuple[str, bytes | str | None]], message.headers() or [])
    for key, value in pairs:
        if value is None:
            value = b""
        elif isinstance(value, str):
            value = value.encode()
        out.append((key, value))
    return out


def matches(found: Sequence[tuple[str, bytes]], filters: Sequence[tuple[str, str]]) -> bool:
    """Whether every filter's header has its value. ``error.type`` is written with its module
    (``builtins.ValueError``); a filter without a module matches the bare class name too."""
    if not filters:
        return True
    values: dict[str, str] = {}
    for key, raw in found:
        values[key] = raw.decode("utf-8", errors="replace")
    for key, wanted in filters:
        value = values.get(key)
        bare = key == dl.ERROR_TYPE and value is not None and "." not in wanted
        if value != wanted and not (bare and value is not None and value.endswith(f".{wanted}")):
            return False
    return True


def describe(message: Message, *, value: bool = False) -> dict[str, Any]:
    """A record as a dict: where it is, its key, and its dead-letter headers read (``value``:
    its value too, as text)."""
    info = dl.read_dead_letter(headers(message))
    row: dict[str, Any] = {
        "partition": message.partition(),
        "offset": message.offset(),
        "key": _text(message.key()),
        "value_bytes": len(message.value() or b""),
    }
    if value:
        row["value"] = _text(message.value())
    if info is None:
        row["dead_letter"] = False
        return row
    row.update(
        dead_letter=True,
        original_topic=info.topic,
        original_partition=info.partition,
        original_offset=info.offset,
        original_timestamp=dl.format_time(info.timestamp),
        attempts=info.attempts,
        reason=info.reason,
        error_type=info.error_type,
        error_message=info.error_message,
        first_failure_at=dl.format_time(info.first_failure_at),
        last_failure_at=dl.format_time(info.last_failure_at),
        group=info.group,
        trace_id=info.trace_id,
        redrive_count=info.redrive_count,
    )
    return row


def _text(data: bytes | str | None) -> str | None:
    if data is None:
        return None
    if isinstance(data, str):
        return data
    return data.decode("utf-8", errors="backslashreplace")
