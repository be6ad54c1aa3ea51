"""Spark entry points: the ``mapInArrow`` adapter over a DataFrame of Kafka records, a
Structured Streaming pipeline (:func:`run_stream`) and a batch reprocessing (:func:`backfill`).

The plan is narrow: Kafka source -> ``coalesce`` (whole Kafka partitions per task, no shuffle)
-> ``mapInArrow`` (the core, see :mod:`parallel_consumer.spark._core`) -> Kafka sink (or your
``foreachBatch``). Spark's Kafka source gives each Kafka partition's offset range of a micro-batch
to one Spark partition in offset order, and ``coalesce`` only concatenates Spark partitions, so a
Kafka partition is never split across tasks: per-key order holds within a micro-batch, and
micro-batches run one after another.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from parallel_consumer.context import PollContext
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.options import Options
from parallel_consumer.spark._arrow import (
    KIND_DEAD_LETTER,
    KIND_OUTPUT,
    KIND_SUMMARY,
    OUTPUT_DDL,
    map_function,
    tally_of,
)
from parallel_consumer.spark._core import check_options
from parallel_consumer.spark._records import PartitionTally

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "KIND_DEAD_LETTER",
    "KIND_OUTPUT",
    "KIND_SUMMARY",
    "BackfillResult",
    "backfill",
    "process",
    "run_stream",
]

log = logging.getLogger("parallel_consumer.spark")

Handler = Callable[[PollContext], object]
Offsets = str | Mapping[str, Mapping[int, int]] | datetime

#: The columns the Kafka sink reads (the per-row ``topic`` routes outputs and dead letters).
SINK_COLUMNS = ("key", "value", "topic", "partition", "headers")
#: Source settings that split one Kafka partition over several Spark tasks (order would break).
_SPLITTING = ("minpartitions", "maxrecordsperpartition")
_HEADER_TYPE = "array<struct<key: string, value: binary>>"


def process(
    df: DataFrame,
    handler: Handler,
    *,
    options: Options | None = None,
    group: str = "spark",
    tasks: int | None = None,
) -> DataFrame:
    """``df`` (rows of Spark's Kafka source, or any DataFrame with ``topic``, ``partition``,
    ``offset``, ``key``, ``value`` and optionally ``timestamp``, ``timestampType``, ``headers``)
    through ``handler``: one row per output and per dead letter (schema
    :data:`~parallel_consumer.spark._arrow.OUTPUT_DDL`; ``kind`` is ``output``,
    ``dead_letter`` or ``summary``, one summary row per Kafka partition and task carrying its
    tally as JSON in ``value``).

    Each Kafka partition must sit whole, in offset order, in one Spark partition (Spark's Kafka
    source does that). ``tasks`` caps the Spark tasks by ``coalesce`` (default: the session's
    default parallelism; each task runs ``Options.max_concurrency`` lanes at once).
    """
    options = options if options is not None else Options()
    check_options(options, handler)
    names = set(df.columns)
    missing = {"topic", "partition", "offset", "key", "value"} - names
    if missing:
        raise ConfigurationError(
            f"the DataFrame lacks the Kafka record column(s) {sorted(missing)}; it has "
            f"{sorted(names)}"
        )
    selected = df.selectExpr(
        "CAST(key AS BINARY) AS key",
        "CAST(value AS BINARY) AS value",
        "CAST(topic AS STRING) AS topic",
        "CAST(partition AS INT) AS partition",
        "CAST(offset AS BIGINT) AS offset",
        "unix_millis(timestamp) AS timestamp_ms"
        if "timestamp" in names
        else "CAST(NULL AS BIGINT) AS timestamp_ms",
        "CAST(timestampType AS INT) AS timestamp_type"
        if "timestampType" in names
        else "CAST(NULL AS INT) AS timestamp_type",
        f"CAST(headers AS {_HEADER_TYPE}) AS headers"
        if "headers" in names
        else f"CAST(NULL AS {_HEADER_TYPE}) AS headers",
    )
    if tasks is None:
        tasks = _default_parallelism(df)
    if tasks is not None:
        if tasks < 1:
            raise ConfigurationError(f"tasks must be >= 1, got {tasks!r}")
        selected = selected.coalesce(tasks)
    return selected.mapInArrow(map_function(handler, options, group), OUTPUT_DDL)


def _default_parallelism(df: DataFrame) -> int | None:
    try:
        return int(df.sparkSession.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext: leave the tasks as they are
        return None


def _subscription(topic: str | Sequence[str]) -> tuple[str, str, list[str]]:
    """(source option, its value, topic names for dead-letter checks)."""
    if isinstance(topic, str):
        if topic.startswith("^"):
            return "subscribePattern", topic, [topic]
        return "subscribe", topic, [topic]
    names = list(topic)
    if not names or not all(isinstance(t, str) and t for t in names):
        raise ConfigurationError(f"topic must be a topic name or a list of them, got {topic!r}")
    return "subscribe", ",".join(names), names


def _source(
    reader: Any,
    bootstrap_servers: str,
    topic: str | Sequence[str],
    defaults: Mapping[str, str],
    source_options: Mapping[str, Any] | None,
) -> Any:
    option, value, _ = _subscription(topic)
    settings: dict[str, str] = {
        "kafka.bootstrap.servers": bootstrap_servers,
        option: value,
        "includeHeaders": "true",
        # A task reading up to the end of a partition otherwise waits out the consumer's
        # default 500 ms fetch wait once per partition (measured here: reading 20,000 records
        # of 8 partitions took 3.0 s, 1.0 s with 50 ms); a short wait costs only a few more
        # empty fetches. Fewer, larger polls: a Spark task reads its range in one go anyway.
        "kafka.fetch.max.wait.ms": "10",
        "kafka.max.poll.records": "10000",
        **defaults,
    }
    for key, given in (source_options or {}).items():
        if key.lower() in _SPLITTING:
            raise ConfigurationError(
                f"source option {key!r} splits a Kafka partition over several Spark tasks, "
                "which breaks per-key order; remove it (raise Options.max_concurrency instead)"
            )
        settings[key] = str(given)
    reader = reader.format("kafka")
    for key, text in settings.items():
        reader = reader.option(key, text)
    return reader


def _prepare_dead_letter_topics(
    options: Options,
    bootstrap_servers: str,
    topic: str | Sequence[str],
    admin_config: Mapping[str, Any] | None,
) -> None:
    """Check (or create) the dead-letter topics, as the engine does when it starts, with a
    confluent_kafka admin client (librdkafka settings: the Java ``kafka.*`` source options do
    not apply to it)."""
    if not options.dead_lettering:
        return
    from confluent_kafka.admin import AdminClient

    from parallel_consumer.kafka.dead_letter_topics import dead_letter_topics, prepare_topics

    config: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, **(admin_config or {})}
    prepare_topics(AdminClient, config, dead_letter_topics(options, _subscription(topic)[2]))


def run_stream(
    spark: SparkSession,
    handler: Handler,
    *,
    bootstrap_servers: str,
    topic: str | Sequence[str],
    checkpoint: str,
    options: Options | None = None,
    source_options: Mapping[str, Any] | None = None,
    sink_options: Mapping[str, Any] | None = None,
    foreach_batch: Callable[[DataFrame, int], None] | None = None,
    trigger: Mapping[str, Any] | None = None,
    group: str | None = None,
    tasks: int | None = None,
    query_name: str | None = None,
    admin_config: Mapping[str, Any] | None = None,
) -> StreamingQuery:
    """Start a Structured Streaming query: Kafka ``topic`` -> ``handler`` -> Kafka.

    Outputs go to the topics the handler's ``ProducerRecord``\\ s name, dead letters to the
    dead-letter topic (checked or created here, as the engine does), through Spark's Kafka sink
    (``sink_options``: ``kafka.*`` producer settings). With ``foreach_batch``, each micro-batch's
    rows (every ``kind``) go to that function instead. Offsets live in ``checkpoint``: a query
    started again with the same checkpoint continues after the last finished micro-batch.
    ``source_options`` go to the Kafka source (``startingOffsets`` is ``earliest`` unless given;
    ``maxOffsetsPerTrigger`` bounds a micro-batch); ``trigger`` goes to
    ``DataStreamWriter.trigger`` (e.g. ``{"availableNow": True}``); ``group`` fills the dead
    letters' ``pc.dlq.group`` header (default ``spark:<checkpoint>``); ``admin_config``
    (librdkafka settings, e.g. SASL) is for the admin client that checks the dead-letter topics.
    """
    options = options if options is not None else Options()
    check_options(options, handler)
    if options.max_retries is None and not options.non_retryable:
        log.warning(
            "Options.max_retries is None: a record that always fails is retried forever and "
            "holds its micro-batch; set max_retries (and a dead-letter topic) for Spark"
        )
    _prepare_dead_letter_topics(options, bootstrap_servers, topic, admin_config)
    source = _source(
        spark.readStream, bootstrap_servers, topic, {"startingOffsets": "earliest"}, source_options
    ).load()
    rows = process(
        source, handler, options=options, group=group or f"spark:{checkpoint}", tasks=tasks
    )
    if foreach_batch is not None:
        writer = rows.writeStream.foreachBatch(foreach_batch)
    else:
        writer = (
            rows.where(f"kind != '{KIND_SUMMARY}'")
            .select(*SINK_COLUMNS)
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap_servers)
        )
        for key, value in (sink_options or {}).items():
            writer = writer.option(key, str(value))
    writer = writer.option("checkpointLocation", checkpoint)
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What :func:`backfill` did: counts, and per ``(topic, partition)`` the offsets read."""

    inputs: int
    outputs: int
    dead_letters: int
    skipped: int
    retries: int
    partitions: dict[tuple[str, int], PartitionTally] = field(default_factory=dict)


def _offsets_option(name: str, value: Offsets) -> dict[str, str]:
    if isinstance(value, datetime):
        return {f"{name}Timestamp": str(int(value.timestamp() * 1000))}
    if isinstance(value, str):
        return {f"{name}Offsets": value}
    return {
        f"{name}Offsets": json.dumps(
            {t: {str(p): int(o) for p, o in parts.items()} for t, parts in value.items()}
        )
    }


def backfill(
    spark: SparkSession,
    handler: Handler,
    *,
    bootstrap_servers: str,
    topic: str | Sequence[str],
    starting_offsets: Offsets = "earliest",
    ending_offsets: Offsets = "latest",
    options: Options | None = None,
    source_options: Mapping[str, Any] | None = None,
    sink_options: Mapping[str, Any] | None = None,
    write: Callable[[DataFrame], None] | None = None,
    group: str = "spark:backfill",
    tasks: int | None = None,
    admin_config: Mapping[str, Any] | None = None,
) -> BackfillResult:
    """Run ``handler`` once over a range of ``topic`` and write what it produced (a batch job).

    ``starting_offsets`` / ``ending_offsets``: ``"earliest"`` / ``"latest"``, a mapping
    ``{topic: {partition: offset}}`` (start inclusive, end exclusive, as Spark reads them; -2
    earliest, -1 latest), or a :class:`~datetime.datetime` (the first offset at or after that
    time, per partition). Outputs and dead letters go through Spark's Kafka sink, or to
    ``write(rows)`` (rows without the summaries). Each record's handler runs once: the rows are
    materialized (``localCheckpoint``) before they are written and counted.
    """
    options = options if options is not None else Options()
    check_options(options, handler)
    _prepare_dead_letter_topics(options, bootstrap_servers, topic, admin_config)
    offsets = {
        **_offsets_option("starting", starting_offsets),
        **_offsets_option("ending", ending_offsets),
    }
    source = _source(spark.read, bootstrap_servers, topic, offsets, source_options).load()
    rows = process(source, handler, options=options, group=group, tasks=tasks)
    rows = rows.localCheckpoint(eager=True)
    records = rows.where(f"kind != '{KIND_SUMMARY}'")
    if write is not None:
        write(records)
    else:
        sink = records.select(*SINK_COLUMNS).write.format("kafka")
        sink = sink.option("kafka.bootstrap.servers", bootstrap_servers)
        for key, value in (sink_options or {}).items():
            sink = sink.option(key, str(value))
        sink.save()
    partitions: dict[tuple[str, int], PartitionTally] = {}
    for row in (
        rows.where(f"kind = '{KIND_SUMMARY}'")
        .select("source_topic", "source_partition", "value")
        .collect()
    ):
        tally = tally_of(bytes(row["value"]))
        partitions.setdefault((row["source_topic"], row["source_partition"]), PartitionTally()).add(
            tally
        )
    rows.unpersist()
    totals = PartitionTally()
    for tally in partitions.values():
        totals.add(tally)
    return BackfillResult(
        inputs=totals.inputs,
        outputs=totals.outputs,
        dead_letters=totals.dead_letters,
        skipped=totals.skipped,
        retries=totals.retries,
        partitions=dict(sorted(partitions.items())),
    )
