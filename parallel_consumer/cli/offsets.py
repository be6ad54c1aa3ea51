"""``pc offsets``: what a consumer group has committed, offset maps included.

For each partition of the group (or of ``--topic``): the committed offset, the offset map in its
metadata decoded (how many records above the committed offset are still unfinished, and the
first ranges of them), the map's encoding and size against the broker's
``offset.metadata.max.bytes``, and the lag to the partition's end. It reads maps written by this
library and by the Java Parallel Consumer alike (the codec is byte-compatible), never joins the
group and commits nothing, so it is safe to run beside live consumers. ``--json`` prints one
JSON object per partition, one per line, for scripts. See docs/offsets-tool.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from parallel_consumer._arguments import non_negative, positive
from parallel_consumer.cli.brokers import (
    CommandError,
    add_connection_arguments,
    client_config,
    describe_failure,
    given_settings,
    reach,
)
from parallel_consumer.kafka.committed_reader import CommittedReader
from parallel_consumer.kafka.spill_store import SpillStore
from parallel_consumer.offsets import (
    DEFAULT_MAX_METADATA_BYTES,
    OffsetDecodeError,
    decode_offset_map,
    read_committed_metadata,
)
from parallel_consumer.offsets.errors import KafkaStreamsMetadataError
from parallel_consumer.offsets.spill import parse_reference

__all__ = ["OffsetsError", "PartitionReport", "add_parser", "describe", "incomplete_ranges", "run"]

#: Ranges of unfinished offsets shown per partition unless ``--ranges`` says otherwise.
DEFAULT_RANGES = 5


class OffsetsError(Exception):
    """``pc offsets`` cannot go on; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class PartitionReport:
    """What ``pc offsets`` reports for one partition (also its ``--json`` object)."""

    topic: str
    partition: int
    #: None: the group has committed nothing for this partition.
    committed_offset: int | None
    #: The partition's high watermark (the offset after its last record).
    end_offset: int
    #: ``end_offset - committed_offset`` (None without a committed offset).
    lag: int | None
    #: The offset map's encoding (the Java library's names), None without a map.
    encoding: str | None
    #: Bytes of committed metadata, against ``metadata_limit``.
    metadata_bytes: int
    metadata_limit: int
    #: Unfinished records at or above the committed offset that the map lists.
    incomplete_count: int
    #: The first ``--ranges`` runs of unfinished offsets, ``[first, last]`` inclusive.
    incomplete_ranges: list[list[int]]
    #: The highest offset the map covers (everything up to it not listed is finished).
    highest_seen: int | None
    #: Why the metadata could not be decoded (None when it could, or there was none).
    decode_error: str | None = None
    #: Where the map lives when it spilled (``topic[partition]@offset`` of the side record;
    #: ``metadata_bytes`` is then the reference's size) and the map's own size.
    spilled_to: str | None = None
    map_bytes: int | None = None


def incomplete_ranges(offsets: Sequence[int], limit: int | None) -> list[list[int]]:
    """Sorted offsets as ``[first, last]`` runs of consecutive offsets, the first ``limit``."""
    ranges: list[list[int]] = []
    for offset in offsets:
        if ranges and offset == ranges[-1][1] + 1:
            ranges[-1][1] = offset
            continue
        if limit is not None and len(ranges) == limit:
            break
        ranges.append([offset, offset])
    return ranges


def describe(
    topic: str,
    partition: int,
    committed: tuple[int, str | None] | None,
    end_offset: int,
    *,
    exact: bool,
    ranges: int | None,
    metadata_limit: int = DEFAULT_MAX_METADATA_BYTES,
    spilled: tuple[str, str] | None = None,
) -> PartitionReport:
    """The report of one partition from what the broker stores (pure: no Kafka here).

    ``spilled``: the committed metadata was a reference, given here as (the reference, where
    its record is); ``committed`` then holds the map fetched from the side topic (exact), or
    ``""`` when it could not be had."""
    if committed is None or committed[0] < 0:
        return PartitionReport(
            topic, partition, None, end_offset, None, None, 0, metadata_limit, 0, [], None
        )
    offset, metadata = committed
    metadata = metadata or ""
    size = len(metadata.encode("utf-8"))
    where: dict[str, Any] = {}
    if spilled is not None:
        where = {"spilled_to": spilled[1], "map_bytes": size}
        size = len(spilled[0].encode("utf-8"))
        exact = True
    try:
        if spilled is not None and not metadata:
            raise OffsetDecodeError(f"the spilled map at {spilled[1]} cannot be read")
        decoded = decode_offset_map(offset, metadata, exact=exact)
    except (OffsetDecodeError, KafkaStreamsMetadataError) as exc:
        return PartitionReport(
            topic,
            partition,
            offset,
            end_offset,
            max(0, end_offset - offset),
            None,
            size,
            metadata_limit,
            0,
            [],
            None,
            decode_error=str(exc),
            **where,
        )
    return PartitionReport(
        topic,
        partition,
        offset,
        end_offset,
        max(0, end_offset - offset),
        None if decoded.encoding is None else _java_name(decoded.encoding.name),
        size,
        metadata_limit,
        len(decoded.incomplete),
        incomplete_ranges(decoded.incomplete, ranges),
        decoded.highest_seen,
        **where,
    )


def _java_name(name: str) -> str:
    """``BIT_SET_V2_COMPRESSED`` -> ``BitSetV2Compressed``, the Java library's OffsetEncoding."""
    return "".join(part.capitalize() for part in name.split("_"))


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    parser = commands.add_parser(
        "offsets", help="show a group's committed offsets, offset maps and lag"
    )
    add_connection_arguments(parser)
    parser.add_argument("--group", required=True, help="the consumer group (group.id)")
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        help="only this topic, every partition of it (repeatable; default: every topic the "
        "group has committed offsets for)",
    )
    parser.add_argument(
        "--ranges",
        type=non_negative,
        default=DEFAULT_RANGES,
        help="unfinished ranges shown per partition (0: all)",
    )
    parser.add_argument(
        "--metadata-limit",
        type=positive,
        default=DEFAULT_MAX_METADATA_BYTES,
        help="the broker's offset.metadata.max.bytes",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per partition")


def _group_partitions(args: argparse.Namespace) -> list[tuple[str, int]]:
    """Every partition the group has a committed offset for."""
    admin = AdminClient(client_config(args))
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(args.group)])
    answer = futures[args.group].result(timeout=args.timeout)
    return sorted(
        (tp.topic, tp.partition) for tp in answer.topic_partitions or () if tp.offset >= 0
    )


def _topic_partitions(
    consumer: Consumer, topics: Sequence[str], timeout: float
) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    metadata = consumer.list_topics(timeout=timeout)
    for topic in topics:
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            reason = found.error if found is not None and found.error is not None else "not found"
            raise OffsetsError(f"topic {topic!r} cannot be read ({reason}); is the name right?")
        out.extend((topic, p) for p in sorted(found.partitions))
    return out


def _committed(
    config: dict[str, Any], consumer: Consumer, tps: list[tuple[str, int]], timeout: float
) -> tuple[dict[tuple[str, int], tuple[int, str | None]], bool]:
    """The committed offsets and metadata, and whether the metadata is exactly what was
    committed (read with :class:`CommittedReader`) or confluent-kafka's read-back."""
    reader = CommittedReader(config, name="pc-offsets")
    try:
        exact = reader.read(tps, timeout)
    finally:
        reader.close()
    if exact is not None:
        return exact, True
    answer = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=timeout)
    return {
        (tp.topic, tp.partition): (tp.offset, read_committed_metadata(tp))
        for tp in answer
        if tp.offset >= 0
    }, False


def _spilled(
    config: dict[str, Any],
    group: str,
    committed: dict[tuple[str, int], tuple[int, str | None]],
) -> dict[tuple[str, int], tuple[str, str]]:
    """For each partition whose map spilled: the reference and where it points; ``committed``
    gets the map fetched from the side topic in its place (``""`` if it cannot be read)."""
    out: dict[tuple[str, int], tuple[str, str]] = {}
    store: SpillStore | None = None
    for tp, (offset, metadata) in committed.items():
        try:
            ref = parse_reference(metadata or "")
        except OffsetDecodeError:
            continue  # describe() says why it cannot be decoded
        if ref is None:
            continue
        assert metadata is not None
        if store is None:
            store = SpillStore(
                config,
                group=group,
                topic=ref.topic,
                producer_factory=Producer,
                consumer_factory=Consumer,
                admin_factory=AdminClient,
                name="pc-offsets",
            )
        out[tp] = (metadata, str(ref))
        committed[tp] = (offset, store.resolve(tp, offset, metadata) or "")
    if store is not None:
        store.close()
    return out


def reports(args: argparse.Namespace) -> list[PartitionReport]:
    reach(args.bootstrap, args.timeout, given_settings(args))
    config = client_config(args, **{"group.id": args.group, "enable.auto.commit": False})
    consumer = Consumer(config)
    try:
        if args.topic:
            tps = _topic_partitions(consumer, args.topic, args.timeout)
        else:
            tps = _group_partitions(args)
            if not tps:
                raise OffsetsError(
                    f"group {args.group!r} has no committed offsets; is the name right? "
                    "(--topic T shows a topic's partitions even without them)"
                )
        committed, exact = _committed(config, consumer, tps, args.timeout)
        spilled = _spilled(config, args.group, committed)
        out = []
        for topic, partition in tps:
            _, end = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=args.timeout, cached=False
            )
            out.append(
                describe(
                    topic,
                    partition,
                    committed.get((topic, partition)),
                    end,
                    exact=exact,
                    ranges=args.ranges or None,
                    metadata_limit=args.metadata_limit,
                    spilled=spilled.get((topic, partition)),
                )
            )
        return out
    finally:
        consumer.close()


def _print_table(rows: Sequence[PartitionReport], out: TextIO) -> None:
    header = ("TOPIC", "PART", "COMMITTED", "END", "LAG", "INCOMPLETE", "ENCODING", "METADATA")
    lines = [header]
    for r in rows:
        share = 100 * r.metadata_bytes / r.metadata_limit
        size = f"{r.metadata_bytes}/{r.metadata_limit} ({share:.0f}%)"
        lines.append(
            (
                r.topic,
                str(r.partition),
                "-" if r.committed_offset is None else str(r.committed_offset),
                str(r.end_offset),
                "-" if r.lag is None else str(r.lag),
                str(r.incomplete_count),
                r.encoding or ("undecodable" if r.decode_error else "-"),
                size,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip(),
            file=out,
        )
    for r in rows:
        if r.incomplete_ranges:
            shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in r.incomplete_ranges)
            more = (
                " ..."
                if sum(b - a + 1 for a, b in r.incomplete_ranges) < r.incomplete_count
                else ""
            )
            print(f"{r.topic}[{r.partition}] unfinished: {shown}{more}", file=out)
        if r.spilled_to:
            print(
                f"{r.topic}[{r.partition}] map spilled: {r.map_bytes} bytes in {r.spilled_to}",
                file=out,
            )
        if r.decode_error:
            print(
                f"{r.topic}[{r.partition}] metadata not an offset map: {r.decode_error}", file=out
            )


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        rows = reports(args)
    except (OffsetsError, CommandError) as exc:
        print(f"pc offsets: {exc}", file=sys.stderr)
        return 1
    except (KafkaException, TimeoutError) as exc:
        print(f"pc offsets: {describe_failure(exc, args.bootstrap, args.timeout)}", file=sys.stderr)
        return 1
    if args.json:
        for row in rows:
            fields = asdict(row)
            if row.spilled_to is None:  # the keys of a spilled map only: old scripts see no change
                del fields["spilled_to"], fields["map_bytes"]
            print(json.dumps(fields, sort_keys=True), file=out)
    else:
        _print_table(rows, out)
    return 0
