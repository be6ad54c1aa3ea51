"""With ``Options.value_serializer`` / ``key_serializer`` set, every output value / key goes
through it, str included: a JSON serializer writes ``"hello"`` (with quotes), and a Schema
Registry serializer frames a str (magic byte and schema id) like any other value. Encoding a
str as bare UTF-8 instead writes records that the matching deserializer cannot read."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka.serialization import SerializationContext, Serializer

from parallel_consumer import Options, PollContext, ProducerRecord


class Framed(Serializer):  # type: ignore[misc]
    """What a Schema Registry serializer writes: magic byte 0, a 4-byte schema id, the data."""

    def __call__(self, obj: Any, ctx: SerializationContext | None = None) -> bytes | None:
        return None if obj is None else b"\x00\x00\x00\x00\x07" + json.dumps(obj).encode()


def test_a_str_output_goes_through_the_configured_serializers(harness, cluster, wait_until):
    # Given serializers for keys and values, and a handler whose output key and value are str
    cluster.create_topic("t")
    cluster.create_topic("out")
    cluster.produce("t", b"x")
    pc = harness.make(Options(key_serializer=Framed(), value_serializer=Framed()))

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord:
        return ProducerRecord("out", "hello", key="k1")

    wait_until(lambda: len(cluster.records("out")) == 1)
    pc.close()
    # Then both were serialized, as a consumer with the matching deserializer expects
    [output] = cluster.records("out")
    assert output.value() == b'\x00\x00\x00\x00\x07"hello"'
    assert output.key() == b'\x00\x00\x00\x00\x07"k1"'
