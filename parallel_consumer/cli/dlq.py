"""``pc dlq show`` and ``pc dlq redrive``: look into a dead-letter topic, and send its records back.

``show`` reads a dead-letter topic from its start (or ``--from-offset``) to the end it had when
the command started, without joining any consumer group, and prints each record's ``pc.dlq.*``
headers (see :mod:`parallel_consumer.dead_letter`) as a table or, with ``--json``, one JSON
object per line.

``redrive`` copies dead-lettered records back to their topic (``--to``, else the original topic
named in each record's headers). The copy keeps key, value and the record's own headers, loses
its ``pc.dlq.*`` headers (so its attempt count starts again) and gains ``pc.redrive.*`` audit
headers. Progress is kept as the committed offset of a consumer group (``--group``, default
``pc-dlq-redrive.<dead-letter topic>``), committed in one Kafka transaction with the copies: a
redrive that is interrupted, killed or run twice never sends a record twice, and the next run
starts where the last one stopped. Records that ``--filter`` passes over are passed for good
(the group moves past them); ``--from-beginning`` reads the whole topic again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO, cast

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from parallel_consumer import dead_letter as dl

__all__ = ["add_parser", "run"]

#: How long a read may wait without any progress before it reports what it is stuck on.
IDLE_LIMIT = 30.0


def _config_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def _header_filter(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected header=value, got {text!r}")
    key = key.strip()
    # Short names for the dead-letter headers: --filter reason=stalled, --filter error.type=...
    if not key.startswith((dl.DLQ_PREFIX, dl.REDRIVE_PREFIX)) and f"{dl.DLQ_PREFIX}{key}" in {
        dl.ORIGINAL_TOPIC,
        dl.ORIGINAL_PARTITION,
        dl.REASON,
        dl.ERROR_TYPE,
        dl.GROUP,
        dl.ATTEMPTS,
    }:
        key = f"{dl.DLQ_PREFIX}{key}"
    return key, value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 up, got {text}")
    return value


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dlq = commands.add_parser("dlq", help="inspect and redrive dead-letter topics")
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--bootstrap", required=True, help="the brokers, host:port[,...]")
        parser.add_argument(
            "--config",
            type=_config_pair,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a librdkafka client setting for every client (security, ...; repeatable)",
        )
        parser.add_argument(
            "--filter",
            type=_header_filter,
            action="append",
            default=[],
            metavar="HEADER=VALUE",
            help="only records whose header has this value (repeatable: all must match); "
            "short names: original.topic, original.partition, reason, error.type, group, attempts",
        )
        parser.add_argument("--limit", type=_non_negative, default=None, help="at most N records")
        parser.add_argument("--json", action="store_true", help="one JSON object per line")

    show = actions.add_parser("show", help="list the records of a dead-letter topic")
    show.add_argument("topic", help="the dead-letter topic, e.g. orders.dlq")
    common(show)
    show.add_argument(
        "--from-offset",
        type=_non_negative,
        default=None,
        help="start every partition at this offset (default: its first record)",
    )

    redrive = actions.add_parser("redrive", help="re-publish dead-lettered records")
    redrive.add_argument("--from", dest="source", required=True, help="the dead-letter topic")
    redrive.add_argument(
        "--to", default=None, help="the topic to write to (default: each record's original topic)"
    )
    common(redrive)
    redrive.add_argument(
        "--group",
        default=None,
        help="the consumer group that keeps redrive progress "
        "(default: pc-dlq-redrive.<dead-letter topic>)",
    )
    redrive.add_argument(
        "--from-beginning",
        action="store_true",
        help="ignore the progress kept so far and read the dead-letter topic from its start",
    )
    redrive.add_argument(
        "--dry-run", action="store_true", help="show what would be sent; send and commit nothing"
    )


class DlqError(Exception):
    """A ``pc dlq`` command cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class _Range:
    tp: TopicPartition
    start: int
    end: int


def _consumer(args: argparse.Namespace, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": False,
            "log_level": 3,
            **dict(args.config),
        }
    )


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=10)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        reason = found.error if found is not None and found.error is not None else "no partitions"
        raise DlqError(f"topic {topic!r} cannot be read ({reason}); is the name right?")
    return sorted(found.partitions)


def _ranges(
    consumer: Consumer, topic: str, starts: dict[int, int] | None, from_offset: int | None
) -> list[_Range]:
    out = []
    for partition in _partitions(consumer, topic):
        tp = TopicPartition(topic, partition)
        low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
        start = low
        if starts is not None and starts.get(partition, -1) >= 0:
            start = max(low, starts[partition])
        if from_offset is not None:
            start = max(low, from_offset)
        if start < high:
            out.append(_Range(tp, start, high))
    return out


def _read(consumer: Consumer, ranges: Sequence[_Range]) -> Iterator[Message]:
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


def _headers(message: Message) -> list[tuple[str, bytes]]:
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


def _matches(headers: Sequence[tuple[str, bytes]], filters: Sequence[tuple[str, str]]) -> bool:
    if not filters:
        return True
    found: dict[str, str] = {}
    for key, value in headers:
        found[key] = value.decode("utf-8", errors="replace")
    return all(found.get(key) == value for key, value in filters)


def _describe(message: Message) -> dict[str, Any]:
    headers = _headers(message)
    info = dl.read_dead_letter(headers)
    row: dict[str, Any] = {
        "partition": message.partition(),
        "offset": message.offset(),
        "key": _text(message.key()),
        "value_bytes": len(message.value() or b""),
    }
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


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


_COLUMNS = ("AT", "ORIGINAL", "ATT", "REASON", "LAST FAILURE", "KEY", "ERROR")


def _table_row(row: dict[str, Any]) -> tuple[str, ...]:
    at = f"{row['partition']}@{row['offset']}"
    if not row["dead_letter"]:
        return (at, "(not a dead letter)", "", "", "", _cut(row["key"] or "", 16), "")
    error = row["error_type"].rsplit(".", 1)[-1]
    if row["error_message"]:
        error = f"{error}: {row['error_message']}"
    return (
        at,
        f"{row['original_topic']}[{row['original_partition']}]@{row['original_offset']}",
        str(row["attempts"]),
        row["reason"],
        row["last_failure_at"],
        _cut(row["key"] or "", 16),
        _cut(error, 60),
    )


def _print_table(rows: Sequence[dict[str, Any]], out: TextIO) -> None:
    cells = [_COLUMNS, *(_table_row(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(_COLUMNS))]
    for line in cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)


def _show(args: argparse.Namespace, out: TextIO) -> int:
    consumer = _consumer(args, f"pc-dlq-show-{uuid.uuid4().hex[:8]}")  # never commits
    rows = []
    shown = 0
    try:
        for message in _read(consumer, _ranges(consumer, args.topic, None, args.from_offset)):
            if not _matches(_headers(message), args.filter):
                continue
            row = _describe(message)
            shown += 1
            if args.json:
                print(json.dumps(row, sort_keys=True), file=out, flush=True)
            else:
                rows.append(row)
            if args.limit is not None and shown >= args.limit:
                break
    finally:
        consumer.close()
    if not args.json:
        if rows:
            _print_table(rows, out)
        print(f"{shown} record(s) in {args.topic}", file=sys.stderr)
    return 0


def redrive_headers(message: Message, source: str) -> list[tuple[str, bytes]]:
    """The headers of a redriven copy of ``message`` (read from the dead-letter ``source``)."""
    headers = _headers(message)
    info = dl.read_dead_letter(headers)
    count = (info.redrive_count if info is not None else 0) + 1
    kept = [(k, v) for k, v in headers if not k.startswith((dl.DLQ_PREFIX, dl.REDRIVE_PREFIX))]
    return [
        *kept,
        (dl.REDRIVE_AT, dl.format_time(time.time()).encode()),
        (dl.REDRIVE_FROM, f"{source}/{message.partition()}@{message.offset()}".encode()),
        (dl.REDRIVE_COUNT, str(count).encode()),
    ]


def _redrive(args: argparse.Namespace, out: TextIO) -> int:
    source: str = args.source
    group = args.group or f"pc-dlq-redrive.{source}"
    consumer = _consumer(args, group)
    producer: Producer | None = None
    sent = passed = 0
    not_dead_letters = 0
    positions: dict[int, int] = {}
    errors: list[str] = []
    widths: dict[str, int] = {}
    try:
        starts = None
        if not args.from_beginning:
            committed = consumer.committed(
                [TopicPartition(source, p) for p in _partitions(consumer, source)], timeout=10
            )
            starts = {tp.partition: tp.offset for tp in committed}
        ranges = _ranges(consumer, source, starts, None)
        if not args.dry_run:
            producer = Producer(
                {
                    "bootstrap.servers": args.bootstrap,
                    # Stable per group: a second redrive of the same group fences a stuck one.
                    "transactional.id": f"{group}-redrive",
                    "log_level": 3,
                    **dict(args.config),
                }
            )
            producer.init_transactions(30)
            producer.begin_transaction()
        dry_rows = []
        for message in _read(consumer, ranges):
            partition = message.partition()
            offset = message.offset()
            assert partition is not None
            assert offset is not None
            headers = _headers(message)
            if not _matches(headers, args.filter):
                passed += 1
                positions[partition] = offset + 1
                continue
            info = dl.read_dead_letter(headers)
            to = args.to or (info.topic if info is not None else None)
            if to is None:
                # Not written by this library's dead-lettering and no --to: nowhere to send it.
                not_dead_letters += 1
                passed += 1
                positions[partition] = offset + 1
                continue
            if args.dry_run:
                dry_rows.append(_describe(message) | {"to": to})
            else:
                assert producer is not None
                # Back to the partition it came from when it goes back to its own topic, so it
                # lines up with its key's later records whatever partitioner wrote them.
                # (Unless the topic has fewer partitions now: then the partitioner picks.)
                partition_to = -1
                if info is not None and to == info.topic and info.partition >= 0:
                    if to not in widths:
                        widths[to] = _partition_count(producer, to)
                    if info.partition < widths[to]:
                        partition_to = info.partition
                _produce(
                    producer, to, partition_to, message, redrive_headers(message, source), errors
                )
                if errors:
                    raise DlqError(errors[0])
            sent += 1
            positions[partition] = offset + 1
            if args.limit is not None and sent >= args.limit:
                break
        if args.dry_run:
            for row in dry_rows:
                print(json.dumps(row, sort_keys=True) if args.json else _dry_line(row), file=out)
        else:
            assert producer is not None
            if positions:
                offsets = [TopicPartition(source, p, o) for p, o in sorted(positions.items())]
                producer.send_offsets_to_transaction(
                    offsets, consumer.consumer_group_metadata(), 30
                )
            producer.flush(60)
            if errors:
                raise DlqError(errors[0])
            producer.commit_transaction(60)
    except (KafkaException, DlqError) as exc:
        if producer is not None:
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(30)
        raise DlqError(f"redrive from {source} failed; nothing was committed: {exc}") from exc
    finally:
        consumer.close()
    verb = "would redrive" if args.dry_run else "redrove"
    where = f"to {args.to}" if args.to else "to their original topics"
    summary = f"{verb} {sent} record(s) from {source} {where}; passed over {passed}"
    if not_dead_letters:
        summary += f" ({not_dead_letters} without dead-letter headers: give --to to send those)"
    if not args.dry_run:
        summary += f"; progress kept in group {group}"
    print(summary, file=sys.stderr)
    return 0


def _partition_count(producer: Producer, topic: str) -> int:
    found = producer.list_topics(topic, timeout=10).topics.get(topic)
    if found is None or found.error is not None:
        return 0  # unknown here: the send names the problem
    return len(found.partitions)


def _dry_line(row: dict[str, Any]) -> str:
    return (
        f"{row['partition']}@{row['offset']} -> {row['to']}  key={row['key']!r} "
        f"reason={row.get('reason', '')} attempts={row.get('attempts', '')}"
    )


def _produce(
    producer: Producer,
    topic: str,
    partition: int,
    message: Message,
    headers: list[Any],
    errors: list[str],
) -> None:
    def on_delivery(error: Any, _: Any) -> None:
        if error is not None:
            errors.append(f"{topic}: {error}")

    while True:
        try:
            producer.produce(
                topic,
                partition=partition,
                key=message.key(),
                value=message.value(),
                headers=headers,
                on_delivery=on_delivery,
            )
            break
        except BufferError:
            producer.poll(0.1)
    producer.poll(0)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        if args.dlq_command == "show":
            return _show(args, out)
        return _redrive(args, out)
    except DlqError as exc:
        print(f"pc dlq: {exc}", file=sys.stderr)
        return 1
    except KafkaException as exc:
        print(f"pc dlq: {exc}", file=sys.stderr)
        return 1
