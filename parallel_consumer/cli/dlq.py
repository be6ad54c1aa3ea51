"""``pc dlq show`` and ``pc dlq redrive``: look into a dead-letter topic, and send its records back.

``show`` reads a dead-letter topic from its start (or ``--from-offset``) to the end it had when
the command started, without joining any consumer group, and prints each record's ``pc.dlq.*``
headers (see :mod:`parallel_consumer.dead_letter`) as a table or, with ``--json``, one JSON
object per line; ``--show-value`` adds each record's value.

``redrive`` copies dead-lettered records back to their topic (``--to``, else the original topic
named in each record's headers). The copy keeps key, value and the record's own headers, loses
its ``pc.dlq.*`` headers (so its attempt count starts again) and gains ``pc.redrive.*`` audit
headers. Progress is kept as the committed offset of a consumer group (``--group``, default
``pc-dlq-redrive.<dead-letter topic>``), committed in one Kafka transaction with the copies: a
redrive that is interrupted, killed or run twice never sends a record twice, and the next run
starts where the last one stopped. Records that ``--filter`` passes over are passed for good
(the group moves past them: give a filtered redrive its own ``--group``, or it warns);
``--from-beginning`` reads the whole topic again.

Reading and filtering live in :mod:`.dlq_records`, the redrive in :mod:`.dlq_redrive`.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Sequence
from typing import Any, TextIO

from confluent_kafka import KafkaException

from parallel_consumer._arguments import non_negative
from parallel_consumer.cli.brokers import (
    CommandError,
    add_connection_arguments,
    describe_failure,
    given_settings,
    reach,
)
from parallel_consumer.cli.dlq_records import (
    DlqError,
    describe,
    header_filter,
    headers,
    matches,
    open_consumer,
    ranges,
    read,
)
from parallel_consumer.cli.dlq_redrive import redrive

__all__ = ["DlqError", "add_parser", "run"]


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    dlq = commands.add_parser("dlq", help="inspect and redrive dead-letter topics")
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")

    def common(parser: argparse.ArgumentParser) -> None:
        add_connection_arguments(parser)
        parser.add_argument(
            "--filter",
            type=header_filter,
            action="append",
            default=[],
            metavar="HEADER=VALUE",
            help="only records whose header has this value (repeatable: all must match); "
            "short names: original.topic, original.partition, reason, error.type (with or "
            "without its module: ValueError, builtins.ValueError), group, attempts",
        )
        parser.add_argument("--limit", type=non_negative, default=None, help="at most N records")
        parser.add_argument("--json", action="store_true", help="one JSON object per line")

    show = actions.add_parser("show", help="list the records of a dead-letter topic")
    show.add_argument("topic", help="the dead-letter topic, e.g. orders.dlq")
    common(show)
    show.add_argument(
        "--from-offset",
        type=non_negative,
        default=None,
        help="start every partition at this offset (default: its first record)",
    )
    show.add_argument(
        "--show-value",
        action="store_true",
        help="show each record's value too (as text; bytes that are not UTF-8 escaped)",
    )

    redrive_parser = actions.add_parser("redrive", help="re-publish dead-lettered records")
    redrive_parser.add_argument(
        "--from", dest="source", required=True, help="the dead-letter topic"
    )
    redrive_parser.add_argument(
        "--to", default=None, help="the topic to write to (default: each record's original topic)"
    )
    common(redrive_parser)
    redrive_parser.add_argument(
        "--group",
        default=None,
        help="the consumer group that keeps redrive progress (default: "
        "pc-dlq-redrive.<dead-letter topic>; give one of its own to a redrive with --filter)",
    )
    redrive_parser.add_argument(
        "--from-beginning",
        action="store_true",
        help="ignore the progress kept so far and read the dead-letter topic from its start",
    )
    redrive_parser.add_argument(
        "--dry-run", action="store_true", help="show what would be sent; send and commit nothing"
    )


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


def _print_table(rows: Sequence[dict[str, Any]], out: TextIO, *, value: bool) -> None:
    columns = (*_COLUMNS, "VALUE") if value else _COLUMNS
    cells: list[tuple[str, ...]] = [columns]
    cells.extend(
        _table_row(row) + ((_cut(row["value"] or "", 40),) if value else ()) for row in rows
    )
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)


def _show(args: argparse.Namespace, out: TextIO) -> int:
    consumer = open_consumer(args, f"pc-dlq-show-{uuid.uuid4().hex[:8]}")  # never commits
    rows = []
    shown = seen = 0
    try:
        todo = ranges(consumer, args.topic, None, args.from_offset, args.timeout)
        for message in read(consumer, todo):
            seen += 1
            if not matches(headers(message), args.filter):
                continue
            row = describe(message, value=args.show_value)
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
            _print_table(rows, out, value=args.show_value)
        matched = f" ({shown} of {seen} matched --filter)" if args.filter else ""
        print(f"{shown} record(s) in {args.topic}{matched}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        reach(args.bootstrap, args.timeout, given_settings(args))
        if args.dlq_command == "show":
            return _show(args, out)
        return redrive(args, out)
    except (DlqError, CommandError) as exc:
        print(f"pc dlq: {exc}", file=sys.stderr)
        return 1
    except (KafkaException, TimeoutError) as exc:
        print(f"pc dlq: {describe_failure(exc, args.bootstrap, args.timeout)}", file=sys.stderr)
        return 1
