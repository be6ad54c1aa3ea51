"""``pc dlq redrive``: copy dead-lettered records back to their topic, exactly once.

The copies and the group's progress commit in one Kafka transaction (see :mod:`.dlq`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any, TextIO

from confluent_kafka import KafkaException, Message, Producer, TopicPartition

from parallel_consumer import dead_letter as dl
from parallel_consumer.cli.brokers import client_config
from parallel_consumer.cli.dlq_records import (
    DlqError,
    describe,
    headers,
    matches,
    open_consumer,
    partitions,
    ranges,
    read,
)

__all__ = ["default_group", "redrive", "redrive_headers"]

#: Seconds the transactional steps may take (they follow a broker that already answered).
TRANSACTION_TIMEOUT = 30.0


def default_group(source: str) -> str:
    return f"pc-dlq-redrive.{source}"


def redrive_headers(message: Message, source: str) -> list[tuple[str, bytes]]:
    """The headers of a redriven copy of ``message`` (read from the dead-letter ``source``)."""
    found = headers(message)
    info = dl.read_dead_letter(found)
    count = (info.redrive_count if info is not None else 0) + 1
    kept = [(k, v) for k, v in found if not k.startswith((dl.DLQ_PREFIX, dl.REDRIVE_PREFIX))]
    return [
        *kept,
        (dl.REDRIVE_AT, dl.format_time(time.time()).encode()),
        (dl.REDRIVE_FROM, f"{source}/{message.partition()}@{message.offset()}".encode()),
        (dl.REDRIVE_COUNT, str(count).encode()),
    ]


def _warn_filter_in_default_group(args: argparse.Namespace, group: str) -> None:
    if args.filter and args.group is None and not args.dry_run:
        print(
            f"pc dlq: warning: --filter without --group: the records it passes over are passed "
            f"for good in the default group {group} (a later redrive without --filter does not "
            "send them); give --group NAME to keep this redrive's progress apart",
            file=sys.stderr,
        )


def redrive(args: argparse.Namespace, out: TextIO) -> int:
    source: str = args.source
    group = args.group or default_group(source)
    _warn_filter_in_default_group(args, group)
    consumer = open_consumer(args, group)
    producer: Producer | None = None
    sent = passed = matched = seen = 0
    not_dead_letters = 0
    positions: dict[int, int] = {}
    errors: list[str] = []
    widths: dict[str, int] = {}
    try:
        starts = None
        if not args.from_beginning:
            committed = consumer.committed(
                [TopicPartition(source, p) for p in partitions(consumer, source, args.timeout)],
                timeout=args.timeout,
            )
            starts = {tp.partition: tp.offset for tp in committed}
        todo = ranges(consumer, source, starts, None, args.timeout)
        if not args.dry_run:
            producer = Producer(
                # Stable per group: a second redrive of the same group fences a stuck one.
                client_config(args, **{"transactional.id": f"{group}-redrive"})
            )
            producer.init_transactions(TRANSACTION_TIMEOUT)
            producer.begin_transaction()
        dry_rows = []
        for message in read(consumer, todo):
            partition = message.partition()
            offset = message.offset()
            assert partition is not None
            assert offset is not None
            found = headers(message)
            seen += 1
            if not matches(found, args.filter):
                passed += 1
                positions[partition] = offset + 1
                continue
            matched += 1
            info = dl.read_dead_letter(found)
            to = args.to or (info.topic if info is not None else None)
            if to is None:
                # Not written by this library's dead-lettering and no --to: nowhere to send it.
                not_dead_letters += 1
                passed += 1
                positions[partition] = offset + 1
                continue
            if args.dry_run:
                dry_rows.append(describe(message) | {"to": to})
            else:
                assert producer is not None
                # Back to the partition it came from when it goes back to its own topic, so it
                # lines up with its key's later records whatever partitioner wrote them.
                # (Unless the topic has fewer partitions now: then the partitioner picks.)
                partition_to = -1
                if info is not None and to == info.topic and info.partition >= 0:
                    if to not in widths:
                        widths[to] = _partition_count(producer, to, args.timeout)
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
                    offsets, consumer.consumer_group_metadata(), TRANSACTION_TIMEOUT
                )
            producer.flush(2 * TRANSACTION_TIMEOUT)
            if errors:
                raise DlqError(errors[0])
            producer.commit_transaction(2 * TRANSACTION_TIMEOUT)
    except (KafkaException, DlqError) as exc:
        if producer is not None:
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(TRANSACTION_TIMEOUT)
        raise DlqError(f"redrive from {source} failed; nothing was committed: {exc}") from exc
    finally:
        consumer.close()
    verb = "would redrive" if args.dry_run else "redrove"
    where = f"to {args.to}" if args.to else "to their original topics"
    summary = f"{verb} {sent} record(s) from {source} {where}"
    if args.filter:
        summary += f"; {matched} of {seen} matched --filter"
    summary += f"; passed over {passed}"
    if not_dead_letters:
        summary += f" ({not_dead_letters} without dead-letter headers: give --to to send those)"
    if not args.dry_run:
        summary += f"; progress kept in group {group}"
    print(summary, file=sys.stderr)
    return 0


def _partition_count(producer: Producer, topic: str, timeout: float) -> int:
    found = producer.list_topics(topic, timeout=timeout).topics.get(topic)
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
