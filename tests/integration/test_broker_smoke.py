"""The test broker is real and does what this library relies on.

Runs against the session ``kafka`` fixture (Apache Kafka by default; ``PC_TEST_KAFKA_BACKEND=tansu``
shows which checks Tansu cannot pass, as skips with reasons).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from parallel_consumer.testing import LocalKafka, create_topic, produce_records, read_topic
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka


def wait_for(
    condition: Callable[[], bool], *, timeout: float, what: str, step: Callable[[], None]
) -> None:
    """Run ``step`` until ``condition`` holds, failing with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        step()


def test_records_produced_are_consumed_by_a_group(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any]
) -> None:
    # Given a topic with 3 partitions and 30 keyed records
    name = topic(3)
    produced = produce_records(
        kafka.bootstrap_servers, name, 30, keys=[f"key-{i}" for i in range(12)]
    )

    # When a consumer group reads it
    consumer = Consumer(consumer_config)
    consumer.subscribe([name])
    seen: list[tuple[int, int, bytes | None]] = []
    try:
        wait_for(
            lambda: len(seen) >= 30,
            timeout=30,
            what="30 records",
            step=lambda: seen.extend(
                (m.partition(), m.offset(), m.value())
                for m in consumer.consume(100, timeout=0.2)
                if m.error() is None
            ),
        )
    finally:
        consumer.close()

    # Then it sees exactly what was produced, as read_topic does
    assert sorted(seen) == sorted((r.partition, r.offset, r.value) for r in produced)
    assert read_topic(kafka.bootstrap_servers, name) == sorted(produced)
    assert {r.partition for r in produced} == {0, 1, 2}  # keys spread over partitions


@pytest.fixture
def committer(consumer_config: dict[str, Any]) -> Iterator[Consumer]:
    consumer = Consumer(consumer_config)
    yield consumer
    consumer.close()


@pytest.mark.kafka_requires("commit_metadata")
def test_commit_metadata_of_4000_characters_round_trips(
    topic: TopicFactory, committer: Consumer
) -> None:
    name = topic(1)
    metadata = "".join(chr(ord("a") + i % 26) for i in range(4000))

    committer.commit(offsets=[TopicPartition(name, 0, 5, metadata=metadata)], asynchronous=False)

    [committed] = committer.committed([TopicPartition(name, 0)], timeout=10)
    assert committed.error is None
    assert committed.offset == 5
    assert committed.metadata == metadata


@pytest.mark.kafka_requires("commit_metadata")
def test_commit_metadata_over_the_broker_limit_is_rejected(
    topic: TopicFactory, committer: Consumer
) -> None:
    # offset.metadata.max.bytes defaults to 4096: what production clusters enforce on offset maps
    name = topic(1)

    with pytest.raises(KafkaException) as raised:
        committer.commit(
            offsets=[TopicPartition(name, 0, 5, metadata="x" * 4097)], asynchronous=False
        )

    assert raised.value.args[0].code() == KafkaError.OFFSET_METADATA_TOO_LARGE


@pytest.mark.kafka_requires("transactions")
def test_committed_transaction_is_visible_and_aborted_one_is_not(
    kafka: KafkaBroker, topic: TopicFactory, group_id: str
) -> None:
    name = topic(1)
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"tx-{group_id}"}
    )
    producer.init_transactions(30)

    producer.begin_transaction()
    for i in range(3):
        producer.produce(name, value=f"committed-{i}".encode())
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(name, value=f"aborted-{i}".encode())
    producer.flush(30)  # the records reach the log; abort_transaction would drop queued ones
    producer.abort_transaction(30)

    committed_view = [r.value for r in read_topic(kafka.bootstrap_servers, name)]
    assert committed_view == [b"committed-0", b"committed-1", b"committed-2"]
    raw = read_topic(kafka.bootstrap_servers, name, isolation="read_uncommitted")
    assert [r.value for r in raw] == [*committed_view, b"aborted-0", b"aborted-1", b"aborted-2"]


def test_two_consumers_split_partitions_and_rebalance_when_one_leaves(
    topic: TopicFactory, consumer_config: dict[str, Any]
) -> None:
    name = topic(4)
    first, second = Consumer(consumer_config), Consumer(consumer_config)
    members = [first]
    open_consumers = [first, second]

    def poll_all() -> None:
        for consumer in members:
            consumer.poll(0.05)

    def assigned(consumer: Consumer) -> set[int]:
        return {tp.partition for tp in consumer.assignment()}

    try:
        # Given one member owning all four partitions
        first.subscribe([name])
        wait_for(lambda: assigned(first) == {0, 1, 2, 3}, timeout=30, what="first", step=poll_all)

        # When a second member joins, the partitions are split between them
        second.subscribe([name])
        members = [first, second]
        wait_for(
            lambda: len(assigned(first)) == 2 and len(assigned(second)) == 2,
            timeout=30,
            what="a 2+2 split",
            step=poll_all,
        )
        assert assigned(first) | assigned(second) == {0, 1, 2, 3}

        # And when it leaves, the first member gets everything back
        open_consumers.remove(second)
        second.close()
        members = [first]
        wait_for(lambda: assigned(first) == {0, 1, 2, 3}, timeout=30, what="all 4", step=poll_all)
    finally:
        for consumer in open_consumers:
            consumer.close()


@pytest.fixture
def own_kafka(kafka: KafkaBroker) -> Iterator[LocalKafka]:
    """A broker of the session's backend that this test alone may restart."""
    assert kafka.backend in ("apache", "tansu")
    with LocalKafka(backend=kafka.backend) as broker:  # type: ignore[arg-type]
        yield broker


@pytest.mark.kafka_requires("restart", "persistence_across_restart")
def test_records_and_committed_offsets_survive_restart(own_kafka: LocalKafka) -> None:
    name = create_topic(own_kafka.bootstrap_servers, "survivor", partitions=2)
    produced = produce_records(own_kafka.bootstrap_servers, name, 20, partitions=[0, 1])
    config = {"bootstrap.servers": own_kafka.bootstrap_servers, "group.id": "survivor-group"}
    consumer = Consumer(config)
    consumer.commit(offsets=[TopicPartition(name, 1, 7, metadata="map")], asynchronous=False)
    consumer.close()

    own_kafka.restart()
    print(f"restart of {own_kafka.backend} took {own_kafka.start_seconds:.2f} s")

    assert read_topic(own_kafka.bootstrap_servers, name) == sorted(produced)
    consumer = Consumer(config)
    try:
        [committed] = consumer.committed([TopicPartition(name, 1)], timeout=30)
    finally:
        consumer.close()
    assert (committed.offset, committed.metadata) == (7, "map")
