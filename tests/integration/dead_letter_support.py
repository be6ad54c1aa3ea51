"""Reading dead-letter (and output) topics back with their headers, for the failure tests."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition


class Stored(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def read_with_headers(
    bootstrap_servers: str, topic: str, *, read_committed: bool = True, timeout: float = 30.0
) -> list[Stored]:
    """Every record of ``topic`` from the beginning to its current end (the last stable offset
    under ``read_committed``), by partition then offset, with headers."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "pc-dlq-reader-unused",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if read_committed else "read_uncommitted",
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        metadata: Any = consumer.list_topics(topic, timeout=timeout).topics[topic]
        pending = set(metadata.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
        out: list[Stored] = []
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"reading {topic} did not reach its end"
            for msg in consumer.consume(500, timeout=0.2):
                error = msg.error()
                if error is None:
                    out.append(
                        Stored(
                            msg.partition(),
                            msg.offset(),
                            msg.key(),
                            msg.value(),
                            msg.headers() or [],
                        )
                    )
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                else:
                    raise AssertionError(f"reading {topic} failed: {error}")
        return sorted(out, key=lambda s: (s.partition, s.offset))
    finally:
        consumer.close()
