"""End to end on the real broker (the ``kafka`` fixture) with Spark's Kafka connector: a
streaming pipeline with transient failures and poison records, a restart from its checkpoint,
and a backfill over an offset range. Handlers live at module level: Spark's Python workers
import this module."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from parallel_consumer import Options, PollContext, ProducerRecord, exponential_backoff
from parallel_consumer.dead_letter import Reason, read_dead_letter
from parallel_consumer.spark import SOURCE_ID, backfill, run_stream
from parallel_consumer.testing import produce_records

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

OUTPUT_TOPIC_HEADER = "out-topic"


class Stored(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None]


def read_all(bootstrap: str, topic: str, timeout: float = 60.0) -> list[Stored]:
    """Every record of ``topic`` with its headers, by partition then offset."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "pc-spark-test-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
        pending = set(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
        out: list[Stored] = []
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"{topic}: no end of {sorted(pending)}"
            for msg in consumer.consume(1000, timeout=0.2):
                err = msg.error()
                if err is None:
                    headers = dict(msg.headers() or [])
                    out.append(
                        Stored(msg.partition(), msg.offset(), msg.key(), msg.value(), headers)
                    )
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                else:
                    raise AssertionError(f"reading {topic}: {err}")
        return sorted(out, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def _bucket(value: bytes | None) -> int:
    return zlib.crc32(value or b"") % 1000


def is_poison(value: bytes | None) -> bool:
    return _bucket(value) < 5  # 0.5 %


def is_flaky(value: bytes | None) -> bool:
    return 5 <= _bucket(value) < 35  # 3 %


def pipeline(ctx: PollContext) -> ProducerRecord:
    """Transient failures (first attempt) on 3 % of the records, poison on 0.5 %; the output
    topic comes in a header so one handler serves every test."""
    if is_poison(ctx.value):
        raise ValueError(f"poison {ctx.value!r}")
    if is_flaky(ctx.value) and ctx.attempts == 0:
        raise ConnectionError("transient")
    target = dict(ctx.headers)[OUTPUT_TOPIC_HEADER]
    assert target is not None
    return ProducerRecord(target.decode(), ctx.value, ctx.key)


def _produce(kafka: KafkaBroker, topic: str, output: str, first: int, n: int, keys: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5})
    for i in range(first, first + n):
        producer.produce(
            topic,
            key=f"key-{i % keys}",
            value=f"{i}",
            headers=[(OUTPUT_TOPIC_HEADER, output.encode())],
        )
        producer.poll(0)
    assert producer.flush(30) == 0


def _options(dlq: str) -> Options:
    return Options(
        max_retries=2,
        retry_delay_provider=exponential_backoff(initial=0.01, max=0.05),
        dead_letter_topic=dlq,
        max_concurrency=64,
    )


def _check_order(outputs: list[Stored]) -> None:
    """Per key, the outputs (one output partition per key) carry increasing input numbers."""
    last: dict[bytes | None, int] = {}
    for record in outputs:
        number = int(record.value or b"")
        assert number > last.get(record.key, -1), record
        last[record.key] = number


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
    _produce(kafka, source, output, 0, 20_000, 100)
    checkpoint = str(tmp_path / "checkpoint")

    def start() -> Any:
        return run_stream(
            spark,
            pipeline,
            bootstrap_servers=kafka.bootstrap_servers,
            topic=source,
            checkpoint=checkpoint,
            options=_options(dlq),
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
    letters = read_all(kafka.bootstrap_servers, dlq)
    assert {r.value for r in letters} == poison
    for letter in letters:
        info = read_dead_letter(list(letter.headers.items()))
        assert info is not None
        assert (info.topic, info.reason, info.attempts) == (source, Reason.RETRIES_EXHAUSTED, 3)
        assert info.error_type == "builtins.ValueError"
        assert info.timestamp is not None  # the source record's time, from Spark's column
        assert letter.headers[OUTPUT_TOPIC_HEADER] == output.encode()  # its own headers kept
    # And per-key order holds in the output, and each output names its input
    _check_order(outputs)
    assert len({r.headers[SOURCE_ID] for r in outputs}) == len(outputs)
    assert sum(b["numInputRows"] for b in batches) == 20_000

    # Given 1,000 more records
    _produce(kafka, source, output, 20_000, 1_000, 100)
    # When the query starts again from its checkpoint
    again = _run(start)
    # Then only the new records were read and processed
    assert sum(b["numInputRows"] for b in again) == 1_000
    outputs = read_all(kafka.bootstrap_servers, output)
    new = [f"{i}".encode() for i in range(20_000, 21_000)]
    assert len(outputs) == 21_000 - len(poison) - sum(map(is_poison, new))
    assert len({r.headers[SOURCE_ID] for r in outputs}) == len(outputs)
    _check_order(outputs)


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
        options=_options(dlq),
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
