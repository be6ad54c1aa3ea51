"""End to end on the real broker (the ``kafka`` fixture) with Spark's Kafka connector: a
streaming pipeline with transient failures and poison records, a restart from its checkpoint,
and a backfill over an offset range. Handlers live at module level (here and in
``spark_pipeline``): Spark's Python workers import them by reference."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pipeline_checks import (
    check_dead_letters,
    check_key_order,
    pipeline_options,
    produce_inputs,
    read_all,
)
from spark_pipeline import is_poison, pipeline

from parallel_consumer import PollContext, ProducerRecord
from parallel_consumer.spark import SOURCE_ID, backfill, run_stream
from parallel_consumer.testing import produce_records

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory


def _run(start: Callable[[], Any]) -> list[dict[str, Any]]:
    query = start()
    try:
        assert query.awaitTermination(200) is True, "the availableNow query did not finish"
        assert query.exception() is None
        return [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()


@pytest.mark.timeout(300)
def test_streaming_pipeline_with_failures_then_restart_from_checkpoint(
    spark: SparkSession, kafka: KafkaBroker, topic: TopicFactory, tmp_path: Path
) -> None:
    # Given 20,000 records of 100 keys in 4 partitions, 3 % transient failures, 0.5 % poison
    source, output = topic(4), topic(4)
    dlq = f"{source}.dead"
    produce_inputs(kafka.bootstrap_servers, source, output, 0, 20_000, 100)
    checkpoint = str(tmp_path / "checkpoint")

    def start() -> Any:
        return run_stream(
            spark,
            pipeline,
            bootstrap_servers=kafka.bootstrap_servers,
            topic=source,
            checkpoint=checkpoint,
            options=pipeline_options(dlq),
            source_options={"maxOffsetsPerTrigger": 8000},
            trigger={"availableNow": True},
        )

    # When the streaming query runs until it has read everything
    began = time.monotonic()
    batches = _run(start)
    print(f"\n20,000 records in {time.monotonic() - began:.1f} s, {len(batches)} micro-batches")
    # Then every good input has its output, poison records are in the dead-letter topic
    values = [f"{i}".encode() for i in range(20_000)]
    poison = {v for v in values if is_poison(v)}
    assert 50 < len(poison) < 150
    outputs = read_all(kafka.bootstrap_servers, output)
    assert sorted(int(r.value or b"") for r in outputs) == sorted(
        int(v) for v in values if v not in poison
    )
    check_dead_letters(read_all(kafka.bootstrap_servers, dlq), source, output, poison)
    # And per-key order holds in the output, and each output names its input
    check_key_order(outputs)
    assert len({r.headers[SOURCE_ID] for r in outputs}) == len(outputs)
    assert sum(b["numInputRows"] for b in batches) == 20_000

    # Given 1,000 more records
    produce_inputs(kafka.bootstrap_servers, source, output, 20_000, 1_000, 100)
    # When the query starts again from its checkpoint
    again = _run(start)
    # Then only the new records were read and processed
    assert sum(b["numInputRows"] for b in again) == 1_000
    outputs = read_all(kafka.bootstrap_servers, output)
    new = [f"{i}".encode() for i in range(20_000, 21_000)]
    assert len(outputs) == 21_000 - len(poison) - sum(map(is_poison, new))
    assert len({r.headers[SOURCE_ID] for r in outputs}) == len(outputs)
    check_key_order(outputs)


def test_backfill_over_an_offset_range(
    spark: SparkSession, kafka: KafkaBroker, topic: TopicFactory
) -> None:
    # Given 2 partitions of 100 records each
    source, output = topic(2), topic(2)
    dlq = f"{source}.dead"
    produce_records(kafka.bootstrap_servers, source, 200, keys=["a", "b", "c"], partitions=[0, 1])
    # When a backfill runs over offsets [10, 50) of partition 0 and [20, 60) of partition 1
    result = backfill(
        spark,
        lambda ctx: ProducerRecord(output, ctx.value, ctx.key),
        bootstrap_servers=kafka.bootstrap_servers,
        topic=source,
        starting_offsets={source: {0: 10, 1: 20}},
        ending_offsets={source: {0: 50, 1: 60}},
        options=pipeline_options(dlq),
    )
    # Then exactly those 80 records were processed, and their outputs written
    assert (result.inputs, result.outputs, result.dead_letters) == (80, 80, 0)
    ranges = {tp: (t.first_offset, t.last_offset, t.inputs) for tp, t in result.partitions.items()}
    assert ranges == {(source, 0): (10, 49, 40), (source, 1): (20, 59, 40)}
    written = read_all(kafka.bootstrap_servers, output)
    ids = sorted(r.headers[SOURCE_ID] or b"" for r in written)
    assert ids == sorted(
        f"{source}/{p}@{o}/0".encode()
        for p, first in ((0, 10), (1, 20))
        for o in range(first, first + 40)
    )


def test_foreach_batch_hands_each_micro_batch_to_a_function(
    spark: SparkSession, kafka: KafkaBroker, topic: TopicFactory, tmp_path: Path
) -> None:
    # Given 300 records
    source = topic(2)
    produce_records(kafka.bootstrap_servers, source, 300, keys=["a", "b"])
    seen: list[tuple[int, int, int]] = []

    def sink(df: Any, batch_id: int) -> None:
        kinds = {
            row["kind"]: row["n"]
            for row in df.groupBy("kind").count().withColumnRenamed("count", "n").collect()
        }
        seen.append((batch_id, kinds.get("output", 0), kinds.get("summary", 0)))

    # When a query with foreach_batch runs over them
    _run(
        lambda: run_stream(
            spark,
            echo_to("unused-topic"),
            bootstrap_servers=kafka.bootstrap_servers,
            topic=source,
            checkpoint=str(tmp_path / "checkpoint"),
            foreach_batch=sink,
            source_options={"maxOffsetsPerTrigger": 200},
            trigger={"availableNow": True},
        )
    )
    # Then the function saw every output, a summary per partition per batch
    assert sum(outputs for _, outputs, _ in seen) == 300
    assert all(summaries >= 1 for _, outputs, summaries in seen if outputs)


def echo_to(target: str) -> Callable[[PollContext], ProducerRecord]:
    def handler(ctx: PollContext) -> ProducerRecord:
        return ProducerRecord(target, ctx.value, ctx.key)

    return handler
