"""The Spark adapter on plain DataFrames (local[2], no broker): the core's checks through
``mapInArrow``. Handlers live at module level: Spark's Python workers import this module."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from parallel_consumer import DeadLetter, OnExhausted, Options, PollContext, ProducerRecord
from parallel_consumer.dead_letter import Reason, read_dead_letter
from parallel_consumer.spark import KIND_DEAD_LETTER, KIND_OUTPUT, KIND_SUMMARY, SOURCE_ID, process
from parallel_consumer.spark._arrow import tally_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession


def kafka_rows(
    spark: SparkSession, per_partition: int, partitions: int, keys: int, *, tasks: int = 2
) -> DataFrame:
    """Rows shaped like Spark's Kafka source: each Kafka partition whole, in offset order, in
    one of ``tasks`` Spark partitions."""
    rows = [
        ("in", p, o, f"k{(o + p) % keys}".encode(), f"{p}:{o}".encode())
        for p in range(partitions)
        for o in range(per_partition)
    ]
    df = spark.createDataFrame(
        rows, "topic string, partition int, offset long, key binary, value binary"
    )
    return df.repartition(tasks, "partition").sortWithinPartitions("partition", "offset")


def echo(ctx: PollContext) -> ProducerRecord:
    return ProducerRecord("out", ctx.value, ctx.key, {"attempts": str(ctx.attempts)})


def flaky_and_poison(ctx: PollContext) -> list[ProducerRecord]:
    """Offsets divisible by 7 fail once; offset 13 of every partition always fails; offset 20
    asks for a dead letter; every record gives two outputs."""
    if ctx.offset == 13:
        raise ValueError(f"poison {ctx.partition}:{ctx.offset}")
    if ctx.offset == 20:
        raise DeadLetter("not wanted")
    if ctx.offset % 7 == 0 and ctx.attempts == 0:
        raise ConnectionError("flaky")
    return [ProducerRecord("out", ctx.value, ctx.key), ProducerRecord("audit", ctx.value)]


async def async_echo(ctx: PollContext) -> ProducerRecord:
    await asyncio.sleep(0)
    if ctx.offset % 5 == 0 and ctx.attempts == 0:
        raise ConnectionError("flaky")
    return echo(ctx)


def always_fails(ctx: PollContext) -> None:
    raise ValueError("always")


def _headers(row: Row) -> dict[str, bytes | None]:
    return {h["key"]: h["value"] for h in row["headers"] or []}


def _per_key_in_order(rows: list[Row]) -> None:
    seen: dict[bytes, list[tuple[int, int]]] = {}
    for row in rows:
        seen.setdefault(bytes(row["key"]), []).append(
            (row["source_partition"], row["source_offset"])
        )
    for key, where in seen.items():
        for partition in {p for p, _ in where}:
            offsets = [o for p, o in where if p == partition]
            assert offsets == sorted(offsets), key


def test_every_input_gives_its_output_in_key_order(spark: SparkSession) -> None:
    # Given 4 Kafka partitions of 250 records, 10 keys, in 2 Spark partitions
    df = kafka_rows(spark, 250, 4, 10)
    # When the echo handler runs through mapInArrow
    rows = process(df, echo, options=Options(max_concurrency=8)).collect()
    # Then every input has one output, per-key order holds, and the summaries count them all
    outputs = [r for r in rows if r["kind"] == KIND_OUTPUT]
    assert len(outputs) == 1000
    assert {(r["source_partition"], r["source_offset"]) for r in outputs} == {
        (p, o) for p in range(4) for o in range(250)
    }
    assert all(_headers(r)[SOURCE_ID] is not None for r in outputs)
    _per_key_in_order(outputs)
    tallies = {
        r["source_partition"]: tally_of(bytes(r["value"]))
        for r in rows
        if r["kind"] == KIND_SUMMARY
    }
    assert sorted(tallies) == [0, 1, 2, 3]
    assert all((t.inputs, t.first_offset, t.last_offset) == (250, 0, 249) for t in tallies.values())


def test_retries_dead_letters_and_fan_out_through_spark(spark: SparkSession) -> None:
    # Given 3 partitions of 30 records and a handler with transient failures and poison records
    df = kafka_rows(spark, 30, 3, 4)
    options = Options(max_retries=2, retry_delay=0.01, dead_letter_topic="in.dlq")
    # When it runs through Spark
    rows = process(df, flaky_and_poison, options=options, group="g-test").collect()
    # Then offsets 13 and 20 of each partition are dead letters with the engine's headers
    letters = [r for r in rows if r["kind"] == KIND_DEAD_LETTER]
    assert sorted((r["source_partition"], r["source_offset"]) for r in letters) == [
        (p, o) for p in range(3) for o in (13, 20)
    ]
    for letter in letters:
        assert letter["topic"] == "in.dlq"
        info = read_dead_letter(list(_headers(letter).items()))
        assert info is not None
        assert info.group == "g-test"
        assert info.offset == letter["source_offset"]
        if info.offset == 13:
            assert (info.reason, info.attempts, info.error_type) == (
                Reason.RETRIES_EXHAUSTED,
                3,
                "builtins.ValueError",
            )
        else:
            assert info.reason == Reason.DEAD_LETTER
    # And every other record gave two outputs
    outputs = [r for r in rows if r["kind"] == KIND_OUTPUT]
    assert len(outputs) == 2 * 28 * 3
    assert {r["topic"] for r in outputs} == {"out", "audit"}
    _per_key_in_order([r for r in outputs if r["topic"] == "out"])
    retries = sum(tally_of(bytes(r["value"])).retries for r in rows if r["kind"] == KIND_SUMMARY)
    assert retries == 3 * (5 + 2)  # 0, 7, 14, 21, 28 once each, and 13 twice, per partition


def test_async_handlers_run_through_spark(spark: SparkSession) -> None:
    rows = process(
        kafka_rows(spark, 40, 2, 3), async_echo, options=Options(retry_delay=0)
    ).collect()
    outputs = [r for r in rows if r["kind"] == KIND_OUTPUT]
    assert len(outputs) == 80
    assert {_headers(r)["attempts"] for r in outputs} == {b"0", b"1"}
    _per_key_in_order(outputs)


def test_an_empty_input_and_empty_partitions_give_no_rows(spark: SparkSession) -> None:
    # Given one Kafka partition spread over 4 Spark tasks (3 of them empty), and an empty input
    one = kafka_rows(spark, 5, 1, 1, tasks=4)
    empty = one.where("offset < 0")
    # When both run through Spark
    rows = process(one, echo, tasks=4).collect()
    none = process(empty, echo).collect()
    # Then the empty tasks add nothing, and the empty input gives nothing
    assert len([r for r in rows if r["kind"] == KIND_OUTPUT]) == 5
    assert none == []


def test_a_stop_decision_fails_the_spark_job(spark: SparkSession) -> None:
    options = Options(max_retries=0, on_retries_exhausted=OnExhausted.STOP)
    with pytest.raises(Exception, match="RetriesExhausted"):
        process(kafka_rows(spark, 3, 1, 1), always_fails, options=options).collect()


def test_a_dataframe_without_the_kafka_columns_is_refused(spark: SparkSession) -> None:
    from parallel_consumer import ConfigurationError

    df = spark.createDataFrame([(1,)], "offset long")
    with pytest.raises(ConfigurationError, match="topic"):
        process(df, echo)
