"""Deserializers and serializers from confluent-kafka's API on a real broker: the handler sees
objects, an undecodable record lands in the dead-letter topic with its raw bytes, and
``poll_and_produce`` outputs are serialized for their topic."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.serialization import (
    Deserializer,
    IntegerDeserializer,
    IntegerSerializer,
    SerializationContext,
    Serializer,
)
from dead_letter_support import read_with_headers
from engine_support import Engines, committed, wait_until

from parallel_consumer import (
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    ProducerRecord,
)
from parallel_consumer import dead_letter as dl
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka


class JsonDeserializer(Deserializer):  # type: ignore[misc]
    def __call__(self, value: bytes | None, ctx: SerializationContext | None = None) -> Any:
        return None if value is None else json.loads(value)


class JsonSerializer(Serializer):  # type: ignore[misc]
    def __call__(self, obj: Any, ctx: SerializationContext | None = None) -> bytes | None:
        return None if obj is None else json.dumps(obj, sort_keys=True).encode()


@pytest.fixture
def engines() -> Iterator[Engines]:
    started = Engines()
    yield started
    started.close_all()


def _committed_total(config: dict[str, Any], topic: str) -> int:
    try:
        return sum(offset for offset, _ in committed(config, topic, [0, 1]).values())
    except KafkaException:  # the group coordinator is not ready yet
        return -1


def test_objects_in_and_out_and_undecodable_records_dead_lettered_raw(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given 50 JSON values with integer keys, two of them not JSON
    source, sink = topic(2), topic(1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    to_int = IntegerSerializer()
    bad = {7, 31}
    for n in range(50):
        value = b"{oops" if n in bad else json.dumps({"n": n}).encode()
        producer.produce(source, value, key=to_int(n % 5, None), partition=n % 2)
    producer.flush(30)
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def handle(ctx: PollContext) -> ProducerRecord:
        key: int = ctx.key  # type: ignore[assignment]
        value: dict[str, int] = ctx.value  # type: ignore[assignment]
        with lock:
            seen.append((key, value["n"]))
        return ProducerRecord(sink, {"doubled": value["n"] * 2}, key=str(key))

    # When a consumer with deserializers, serializers and a dead-letter topic runs them
    options = Options(
        ordering=ProcessingOrder.KEY,
        key_deserializer=IntegerDeserializer(),
        value_deserializer=JsonDeserializer(),
        value_serializer=JsonSerializer(),
        dead_letter_topic=f"{source}.dlq",
        commit_interval=0.2,
    )
    pc = ParallelConsumer(consumer_config, options)
    engines._instances.append(pc)
    pc.subscribe([source])
    pc.poll_and_produce(handle)

    # Then every good record ran once with objects, and the committed offsets reach the end
    wait_until(
        lambda: _committed_total(consumer_config, source) == 50,
        timeout=60,
        what="every record committed",
    )
    assert sorted(n for _, n in seen) == [n for n in range(50) if n not in bad]
    assert all(key == n % 5 for key, n in seen)
    # And the outputs are JSON, serialized by the library
    outputs = read_with_headers(kafka.bootstrap_servers, sink)
    assert sorted(json.loads(o.value or b"")["doubled"] for o in outputs) == sorted(
        2 * n for n in range(50) if n not in bad
    )
    # And the two undecodable records are in the dead-letter topic with their raw bytes
    letters = read_with_headers(kafka.bootstrap_servers, f"{source}.dlq")
    assert [letter.value for letter in letters] == [b"{oops", b"{oops"]
    infos = [dl.read_dead_letter(letter.headers) for letter in letters]
    assert all(i is not None and i.reason == dl.Reason.NON_RETRYABLE for i in infos)
    assert sorted((i.partition, i.offset) for i in infos if i is not None) == [(1, 3), (1, 15)]
