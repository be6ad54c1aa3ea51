"""Deserializers with ``runner="process"``: docs/serialization.md says the (de)serializers
travel to the worker processes with the handler, so handlers there see objects too."""

from __future__ import annotations

from typing import Any

from confluent_kafka.serialization import StringDeserializer

from parallel_consumer import Options, PollContext, ProducerRecord


def copy_decoded(ctx: PollContext) -> ProducerRecord:
    """Module level: the workers import it by name. Outputs what the handler saw."""
    return ProducerRecord("out", f"{type(ctx.value).__name__}:{ctx.value}", key=ctx.key)


def test_a_handler_in_a_worker_process_sees_deserialized_values(harness, cluster, wait_until):
    # Given records and a value deserializer, with the process runner
    cluster.create_topic("t")
    cluster.create_topic("out")
    for i in range(3):
        cluster.produce("t", f"v{i}".encode(), key=b"k")
    pc = harness.make(
        Options(runner="process", processes=1, value_deserializer=StringDeserializer())
    )
    pc.poll_and_produce(copy_decoded)
    # Then every record runs once and the handler saw str values
    try:
        wait_until(lambda: len(cluster.records("out")) == 3, timeout=10)
    finally:
        stats: Any = pc.statistics()
        pc.close()
    assert sorted(m.value() for m in cluster.records("out")) == [b"str:v0", b"str:v1", b"str:v2"]
    assert stats.records_failed == 0
