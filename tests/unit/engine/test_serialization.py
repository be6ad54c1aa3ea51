"""Keys and values through confluent-kafka's serializer API, and failures that no retry mends
(undecodable records, outputs of the wrong type, dead letters with nowhere to go)."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest
from confluent_kafka.serialization import (
    Deserializer,
    IntegerSerializer,
    SerializationContext,
    Serializer,
    StringDeserializer,
    StringSerializer,
)

from parallel_consumer import ConfigurationError, DeadLetter, Options, PollContext, ProducerRecord
from parallel_consumer import dead_letter as dl
from parallel_consumer.errors import InvalidOutput, SerializationError


class JsonDeserializer(Deserializer):  # type: ignore[misc]
    def __call__(self, value: bytes | None, ctx: SerializationContext | None = None) -> Any:
        return None if value is None else json.loads(value)


class JsonSerializer(Serializer):  # type: ignore[misc]
    def __call__(self, obj: Any, ctx: SerializationContext | None = None) -> bytes | None:
        return None if obj is None else json.dumps(obj, sort_keys=True).encode()


def test_the_handler_sees_deserialized_keys_and_values_and_the_raw_bytes(
    harness, cluster, wait_until
):
    cluster.create_topic("t")
    cluster.produce("t", b'{"n": 1}', key=b"k1")
    seen: list[tuple[Any, Any, Any]] = []
    pc = harness.make(
        Options(key_deserializer=StringDeserializer(), value_deserializer=JsonDeserializer())
    )

    @pc.poll
    def handle(ctx: PollContext) -> None:
        seen.append((ctx.key, ctx.value, ctx.record.raw_value))

    wait_until(lambda: len(seen) == 1)
    pc.close()
    assert seen == [("k1", {"n": 1}, b'{"n": 1}')]


def test_an_undecodable_record_is_dead_lettered_once_with_its_raw_bytes_and_the_batch_goes_on(
    harness, cluster, wait_until
):
    # Given a batch of three records, the middle one not JSON, and retries forever by default
    cluster.create_topic("t")
    for value in (b'{"n": 0}', b"not json", b'{"n": 2}'):
        cluster.produce("t", value)
    handled: list[Any] = []
    pc = harness.make(
        Options(
            batch_size=3,
            max_concurrency=1,
            value_deserializer=JsonDeserializer(),
            dead_letter_topic="dlq",
        )
    )

    @pc.poll
    def handle(ctx: PollContext) -> None:
        handled.extend(record.value for record in ctx)

    # Then the two good records ran, and the bad one went to the dead-letter topic at once
    wait_until(lambda: len(cluster.records("dlq")) == 1)
    wait_until(lambda: cluster.committed("g", "t", 0) == (3, None))
    pc.close()
    assert handled == [{"n": 0}, {"n": 2}]
    [letter] = cluster.records("dlq")
    assert letter.value() == b"not json"
    info = dl.read_dead_letter(letter.headers())
    assert info is not None
    assert info.offset == 1
    assert info.reason == dl.Reason.NON_RETRYABLE
    assert info.error_type.endswith("SerializationError")
    assert "could not deserialize the value of t[0]@1" in info.error_message


def test_outputs_are_serialized_for_their_topic(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.create_topic("out")
    cluster.produce("t", b"7")
    pc = harness.make(
        Options(
            value_deserializer=StringDeserializer(),
            key_serializer=IntegerSerializer(),
            value_serializer=JsonSerializer(),
        )
    )

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord:
        return ProducerRecord("out", {"seen": ctx.value}, key=int(ctx.value))

    wait_until(lambda: len(cluster.records("out")) == 1)
    pc.close()
    [output] = cluster.records("out")
    assert output.value() == b'{"seen": "7"}'
    assert output.key() == IntegerSerializer()(7, None)


def test_str_outputs_need_no_serializer_even_when_one_is_set(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.create_topic("out")
    cluster.produce("t", b"x")
    pc = harness.make(Options(value_serializer=StringSerializer()))
    pc.poll_and_produce(lambda ctx: ProducerRecord("out", "plain"))
    wait_until(lambda: len(cluster.records("out")) == 1)
    pc.close()
    assert cluster.records("out")[0].value() == b"plain"


@pytest.mark.parametrize(
    "returned",
    [
        pytest.param(lambda: "not a record", id="a-str"),
        pytest.param(lambda: [ProducerRecord("out", b"ok"), 3], id="a-list-with-an-int"),
        pytest.param(lambda: ProducerRecord("out", {"a": 1}), id="an-object-without-serializer"),
    ],
)
def test_an_invalid_output_is_never_retried_and_names_the_record(
    harness, cluster, wait_until, returned
):
    # Given a handler returning the wrong thing, with retries forever and a dead-letter topic
    cluster.create_topic("t")
    cluster.create_topic("out")
    cluster.produce("t", b"x")
    calls: list[int] = []
    pc = harness.make(Options(dead_letter_topic="dlq", retry_delay=0))

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> Any:
        calls.append(ctx.offset)
        return returned()

    # Then it is dead-lettered after one call, its error naming what was returned
    wait_until(lambda: len(cluster.records("dlq")) == 1)
    pc.close()
    assert calls == [0]
    info = dl.read_dead_letter(cluster.records("dlq")[0].headers())
    assert info is not None
    assert info.error_type.endswith("InvalidOutput")
    assert info.reason == dl.Reason.NON_RETRYABLE
    assert cluster.records("out") == []


def test_a_dead_letter_with_dead_lettering_off_is_retried_with_a_warning_not_a_stop(
    harness, cluster, wait_until, caplog
):
    # Given default options (no dead-letter topic) and a handler that dead-letters key a once
    cluster.create_topic("t")
    cluster.produce("t", b"a0", key=b"a")
    cluster.produce("t", b"b0", key=b"b")
    calls: list[bytes] = []
    done = threading.Event()
    pc = harness.make(Options(retry_delay=0.01))

    @pc.poll
    def handle(ctx: PollContext) -> None:
        calls.append(ctx.value or b"")
        if ctx.value == b"a0" and calls.count(b"a0") == 1:
            raise DeadLetter("bad order")
        if calls.count(b"a0") == 2:
            done.set()

    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        wait_until(done.is_set)
        pc.close()
    # Then the consumer kept running, the record ran again, and the warning named it
    assert pc.failure is None
    assert calls.count(b"a0") == 2
    assert b"b0" in calls
    assert cluster.committed("g", "t", 0) == (2, None)
    assert "t[0]@0 is to be dead-lettered" in caplog.text
    assert "dead-lettering is off" in caplog.text


def test_a_codec_that_is_not_callable_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="value_deserializer must be a callable"):
        Options(value_deserializer="json")  # type: ignore[arg-type]


def test_async_handlers_see_deserialized_values(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"hello")
    seen: list[Any] = []
    pc = harness.make(Options(value_deserializer=StringDeserializer()))

    @pc.poll
    async def handle(ctx: PollContext) -> None:
        seen.append(ctx.value)

    wait_until(lambda: seen == ["hello"])
    pc.close()


def test_error_types_are_exported_where_users_catch_them():
    assert issubclass(InvalidOutput, TypeError)
    assert issubclass(SerializationError, Exception)
