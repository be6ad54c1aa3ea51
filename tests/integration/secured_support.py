"""Shared pieces of the secured-cluster tests: a SASL_SSL broker with ACLs for one module,
users with known passwords, and readers that log in as the super user."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from parallel_consumer.testing import LocalKafka, create_topic

#: The password of the application's user: searched for in everything a run printed.
KNOWN_PASSWORD = "Kn0wn-App-Pa55word-4711"
#: Names the application's user may use: topics, groups and transactional ids with it.
PREFIX = "sec-"


def secured_broker() -> Iterator[LocalKafka]:
    """A SASL_SSL broker with ACLs; user ``app`` may read and write ``sec-*`` topics, use
    ``sec-*`` groups and transactional ids, and create ``sec-*`` topics (dead-letter ones)."""
    with LocalKafka(security="sasl_ssl") as kafka:
        print(f"secured broker started in {kafka.start_seconds:.1f} s")
        kafka.add_user("app", KNOWN_PASSWORD)
        grant_app(kafka, "app")
        yield kafka


def grant_app(kafka: LocalKafka, user: str, *, group: bool = True) -> None:
    kafka.grant(user, "topic", PREFIX, "READ", "WRITE", "DESCRIBE", "CREATE", prefixed=True)
    if group:
        kafka.grant(user, "group", PREFIX, "READ", prefixed=True)
        # pc dlq show reads with a throw-away group pc-dlq-show-<random>, redrive with its own
        kafka.grant(user, "group", "pc-dlq-", "READ", prefixed=True)
    kafka.grant(user, "transactional_id", PREFIX, "WRITE", "DESCRIBE", prefixed=True)


def unique(what: str) -> str:
    return f"{PREFIX}{what}-{uuid.uuid4().hex[:8]}"


def new_topic(kafka: LocalKafka, name: str, partitions: int = 1) -> str:
    return create_topic(
        kafka.bootstrap_servers, name, partitions=partitions, client_config=kafka.client_config()
    )


def consumer_config(kafka: LocalKafka, user: str, group: str, **more: Any) -> dict[str, Any]:
    """What an application passes: its credentials once, in the consumer's configuration."""
    return {
        **kafka.client_config(user),
        "group.id": group,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 50,
        **more,
    }


def committed(kafka: LocalKafka, group: str, topic: str, partitions: int = 1) -> dict[int, int]:
    """The group's committed offsets, read as the super user (-1001: none; -1 when the
    group's coordinator did not answer within 30 s)."""
    consumer = Consumer({**kafka.client_config(), "group.id": group})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = consumer.committed(
                    [TopicPartition(topic, p) for p in range(partitions)], 30
                )
                return {tp.partition: tp.offset for tp in answer}
            except KafkaException:  # e.g. NOT_COORDINATOR while the offsets topic loads
                if time.monotonic() > deadline:
                    return dict.fromkeys(range(partitions), -1)
                time.sleep(0.5)
    finally:
        consumer.close()


def read_all(kafka: LocalKafka, topic: str, *, read_committed: bool = True) -> list[Any]:
    """Every record of ``topic`` (with headers), read as the super user."""
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": "unused",
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if read_committed else "read_uncommitted",
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending, out = set(partitions), []
        deadline = time.monotonic() + 30
        while pending:
            assert time.monotonic() < deadline, f"reading {topic} did not reach its end"
            for msg in consumer.consume(500, timeout=0.2):
                error = msg.error()
                if error is None:
                    out.append(msg)
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                else:
                    raise AssertionError(f"reading {topic}: {error}")
        return out
    finally:
        consumer.close()


def wait_for(
    condition: Callable[[], object], *, timeout: float, what: str, show: Any = None
) -> float:
    """Wait until ``condition()``; returns the seconds it took (fails the test after timeout)."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            detail = f"; {show()}" if show is not None else ""
            pytest.fail(f"timed out after {timeout} s waiting for {what}{detail}")
        time.sleep(0.05)
    return time.monotonic() - began
