"""The ``mapInArrow`` function: Arrow record batches of Kafka source rows in, output rows out.

Imports pyarrow only (never pyspark): it runs in Spark's Python workers. One call of the function
made by :func:`map_function` is one Spark task: the records of the Kafka partitions that task
holds (whole partitions: the adapter never splits one). Each Arrow batch's records join their
lanes (:class:`~parallel_consumer.spark._stream.LaneStream`) while earlier ones still run, so the
JVM reads the next batch while Python works, and order per key holds across batches; finished
rows go out as each batch arrives, and every :data:`HAND_OVER_EVERY` seconds once the input
has ended. A pool of worker threads serves the whole task. (An
``async def`` handler runs each batch to its end on an event loop instead.) After the last
batch, one summary row per Kafka partition carries the task's tallies (``kind`` ``summary``,
the tally as JSON in ``value``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from parallel_consumer.context import PollContext
from parallel_consumer.options import Options
from parallel_consumer.runners.base import handler_kind
from parallel_consumer.spark._core import process
from parallel_consumer.spark._records import InputRecord, OutputRow, PartitionTally
from parallel_consumer.spark._stream import LaneStream

__all__ = [
    "INPUT_COLUMNS",
    "KIND_DEAD_LETTER",
    "KIND_OUTPUT",
    "KIND_SUMMARY",
    "OUTPUT_DDL",
    "map_function",
    "tally_of",
]

KIND_OUTPUT = "output"
KIND_DEAD_LETTER = "dead_letter"
KIND_SUMMARY = "summary"

#: Once a task's input has ended, its finished rows go to the JVM this often (seconds) until
#: every lane is done: the JVM writes them while the last lanes still run.
HAND_OVER_EVERY = 0.05

#: The columns the function reads, as SQL expressions over a Kafka source DataFrame.
INPUT_COLUMNS = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp_ms",
    "timestamp_type",
    "headers",
)

#: The output schema: the Kafka sink's columns (key, value, topic, partition, headers), then
#: what each row is and which input record it came from.
OUTPUT_DDL = (
    "key binary, value binary, topic string, partition int, "
    "headers array<struct<key: string, value: binary>>, kind string, "
    "source_topic string, source_partition int, source_offset bigint"
)


def _schema() -> Any:
    import pyarrow as pa

    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("headers", pa.list_(header)),
            ("kind", pa.string()),
            ("source_topic", pa.string()),
            ("source_partition", pa.int32()),
            ("source_offset", pa.int64()),
        ]
    )


def _records(batch: Any) -> list[InputRecord]:
    columns = {name: batch.column(name).to_pylist() for name in INPUT_COLUMNS}
    out = []
    for key, value, topic, partition, offset, millis, kind, headers in zip(
        *(columns[name] for name in INPUT_COLUMNS), strict=True
    ):
        pairs = tuple((h["key"], h["value"]) for h in headers) if headers else ()
        # Spark's timestampType: 0 create time, 1 log-append time; confluent_kafka's is one more.
        out.append(
            InputRecord(
                topic, partition, offset, key, value, millis, 1 if kind is None else kind + 1, pairs
            )
        )
    return out


def _batch(rows: list[OutputRow], summaries: dict[tuple[str, int], PartitionTally]) -> Any:
    import pyarrow as pa

    data: dict[str, list[Any]] = {name: [] for name in _schema().names}
    for row in rows:
        data["key"].append(row.key)
        data["value"].append(row.value)
        data["topic"].append(row.topic)
        data["partition"].append(row.partition)
        data["headers"].append([{"key": k, "value": v} for k, v in row.headers])
        data["kind"].append(KIND_DEAD_LETTER if row.dead_letter else KIND_OUTPUT)
        data["source_topic"].append(row.source_topic)
        data["source_partition"].append(row.source_partition)
        data["source_offset"].append(row.source_offset)
    for (topic, partition), tally in summaries.items():
        data["key"].append(None)
        data["value"].append(json.dumps(asdict(tally)).encode())
        data["topic"].append(topic)
        data["partition"].append(None)
        data["headers"].append([])
        data["kind"].append(KIND_SUMMARY)
        data["source_topic"].append(topic)
        data["source_partition"].append(partition)
        data["source_offset"].append(tally.last_offset)
    return pa.RecordBatch.from_pydict(data, schema=_schema())


def tally_of(value: bytes) -> PartitionTally:
    """The tally a summary row carries in its ``value``."""
    return PartitionTally(**json.loads(value))


def map_function(
    handler: Callable[[PollContext], object], options: Options, group: str
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function to hand to ``DataFrame.mapInArrow`` (picklable when ``handler`` is)."""
    if handler_kind(handler) == "async":
        return _by_batch(handler, options, group)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        with ThreadPoolExecutor(
            options.max_concurrency, thread_name_prefix=f"{options.name}-spark"
        ) as pool:
            stream = LaneStream(handler, options, group, pool)
            try:
                for batch in batches:  # the JVM reads the next batch while the lanes run
                    if batch.num_rows:
                        stream.feed(_records(batch))
                    rows = stream.take()
                    if rows:
                        yield _batch(rows, {})
                # The input has ended: hand finished rows over as they come, so the JVM writes
                # them while the last lanes run, rather than all of them at the end.
                while not stream.wait_idle(HAND_OVER_EVERY):
                    rows = stream.take()
                    if rows:
                        yield _batch(rows, {})
                rows, tallies = stream.finish()
            finally:
                stream.close()
        yield _batch(rows, tallies)

    return run


def _by_batch(
    handler: Callable[[PollContext], object], options: Options, group: str
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """``async def`` handlers: each Arrow batch runs to its end on an event loop of its own."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        tallies: dict[tuple[str, int], PartitionTally] = {}
        for batch in batches:
            if batch.num_rows == 0:
                continue
            result = process(_records(batch), handler, options, group=group)
            for tp, tally in result.partitions.items():
                tallies.setdefault(tp, PartitionTally()).add(tally)
            if result.rows:
                yield _batch(result.rows, {})
        yield _batch([], tallies)

    return run
