"""What the end-to-end Spark tests share: producing the inputs of :mod:`spark_pipeline`'s
handler, its options, and reading and checking what the pipeline wrote."""

from __future__ import annotations

import time
from typing import NamedTuple

from spark_pipeline import OUTPUT_TOPIC_HEADER

from parallel_consumer import Options, exponential_backoff
from parallel_consumer.dead_letter import Reason, read_dead_letter


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


def produce_inputs(
    bootstrap: str,
    topic: str,
    output: str,
    first: int,
    n: int,
    keys: int,
    extra_headers: dict[int, list[tuple[str, bytes]]] | None = None,
) -> None:
    """Records ``first`` .. ``first + n - 1`` (the number as the value) of ``keys`` keys, each
    naming ``output`` in its header; ``extra_headers`` adds headers to some of them."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(first, first + n):
        producer.produce(
            topic,
            key=f"key-{i % keys}",
            value=f"{i}",
            headers=[(OUTPUT_TOPIC_HEADER, output.encode()), *(extra_headers or {}).get(i, [])],
        )
        producer.poll(0)
    assert producer.flush(30) == 0


def pipeline_options(dlq: str) -> Options:
    return Options(
        max_retries=2,
        retry_delay_provider=exponential_backoff(initial=0.01, max=0.05),
        dead_letter_topic=dlq,
        max_concurrency=64,
    )


def check_key_order(outputs: list[Stored]) -> None:
    """Per key, the outputs (one output partition per key) carry increasing input numbers."""
    last: dict[bytes | None, int] = {}
    for record in outputs:
        number = int(record.value or b"")
        assert number > last.get(record.key, -1), record
        last[record.key] = number


def first_of_each(records: list[Stored], header: str) -> list[Stored]:
    """``records`` without the repeats of a ``header`` value (a replayed micro-batch's outputs),
    each kept where it first appears."""
    seen: set[bytes | None] = set()
    kept = []
    for record in records:
        mark = record.headers[header]
        if mark not in seen:
            seen.add(mark)
            kept.append(record)
    return kept


def check_dead_letters(letters: list[Stored], source: str, output: str, poison: set[bytes]) -> None:
    """The dead letters are the poison records, each after its 3 attempts, with the source
    record's time and its own headers."""
    assert {r.value for r in letters} == poison
    for letter in letters:
        info = read_dead_letter(list(letter.headers.items()))
        assert info is not None
        assert (info.topic, info.reason, info.attempts) == (source, Reason.RETRIES_EXHAUSTED, 3)
        assert info.error_type == "builtins.ValueError"
        assert info.timestamp is not None  # the source record's time, from Spark's column
        assert letter.headers[OUTPUT_TOPIC_HEADER] == output.encode()  # its own headers kept
