"""OpenTelemetry on the real broker, read with the SDK's in-memory reader and exporter: the
counters against the engine's counts, the per-partition gauges against ``statistics()``, and
spans parented on the records' ``traceparent``, current in each runner, carried by outputs.

``traced_child`` is module-level: process-runner workers are spawned and import it by name.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from engine_support import wait_until
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from parallel_consumer import (
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    ProducerRecord,
    RunnerKind,
)
from parallel_consumer.telemetry import Telemetry
from parallel_consumer.testing import create_topic
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.timeout(120)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-01"


class Otel:
    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.exporter))

    def points(self, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        data = self.reader.get_metrics_data()
        out: dict[tuple[tuple[str, Any], ...], Any] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            key = tuple(sorted(point.attributes.items()))
                            out[key] = point.value if hasattr(point, "value") else point.count
        return out


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    yield o
    o.meters.shutdown()
    o.tracers.shutdown()


def _produce(bootstrap: str, topic: str, n: int, partitions: int, *, traced: bool) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(n):
        headers = [("traceparent", TRACEPARENT.encode())] if traced and i % 2 == 0 else None
        producer.produce(
            topic, b"v%d" % i, key=b"k%d" % i, partition=i % partitions, headers=headers
        )
    assert producer.flush(30) == 0


def _read(bootstrap: str, topic: str, n: int) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "pc-telemetry-reader"})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        out: list[Any] = []
        wait_until(
            lambda: (
                out.extend(m for m in consumer.consume(50, 0.2) if m.error() is None)
                or len(out) >= n
            ),
            timeout=30,
            what=f"{n} outputs in {topic}",
        )
        return out
    finally:
        consumer.close()


def _attrs(group: str, topic: str | None = None, partition: int | None = None) -> tuple[Any, ...]:
    attributes: dict[str, Any] = {"group": group, "pcinstance": "it"}
    if topic is not None:
        attributes.update(topic=topic, partition=partition)
    return tuple(sorted(attributes.items()))


def test_counters_and_gauges_match_the_engine_on_the_broker(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], otel: Otel
) -> None:
    # Given 40 records on 2 partitions and a handler that fails the first attempt of 3 of them
    name = topic(2)
    _produce(kafka.bootstrap_servers, name, 40, 2, traced=False)
    group = consumer_config["group.id"]

    def handler(ctx: PollContext) -> None:
        if ctx.offset in (1, 5, 9) and ctx.partition == 0 and ctx.attempts == 0:
            raise ValueError("first attempt fails")

    pc = ParallelConsumer(
        consumer_config,
        Options(ordering=ProcessingOrder.KEY, commit_interval=0.1, retry_delay=0),
        telemetry=Telemetry(
            meter_provider=otel.meters, instance="it", histogram_sample_interval=None
        ),
    )
    try:
        pc.subscribe(name)
        pc.poll(handler)
        # When every record is processed and committed
        wait_until(
            lambda: (
                (s := pc.statistics()).records_succeeded == 40
                and len(s.partitions) == 2
                and all(p.committed_offset == 20 and not p.dirty for p in s.partitions)
            ),
            timeout=60,
            what="40 records processed and committed",
            show=pc.statistics,
        )
        stats = pc.statistics()
        # Then the counters match the engine's counts, per partition
        assert otel.points("pc.processed.records") == {
            _attrs(group, name, 0): 20,
            _attrs(group, name, 1): 20,
        }
        assert otel.points("pc.failed.records") == {_attrs(group, name, 0): 3}
        assert stats.records_failed == 3
        assert sum(otel.points("pc.end.to.end.latency").values()) == 40
        # And the per-partition gauges match statistics()
        for meter, field in [
            ("pc.partition.incomplete.offsets", "incomplete"),
            ("pc.partition.highest.completed.offset", "highest_succeeded"),
            ("pc.partition.highest.sequential.succeeded.offset", "highest_sequential_succeeded"),
            ("pc.partition.highest.seen.offset", "highest_seen"),
            ("pc.partition.latest.committed.offset", "committed_offset"),
            ("pc.partition.assignment.epoch", "epoch"),
        ]:
            expected = {
                _attrs(group, p.topic, p.partition): getattr(p, field) for p in stats.partitions
            }
            assert otel.points(meter) == expected, meter
        assert otel.points("pc.partitions.number") == {_attrs(group): 2}
        assert otel.points("pc.incomplete.offsets.total") == {_attrs(group): 0}
        assert otel.points("pc.commit.latency")[_attrs(group)] >= 2
    finally:
        pc.close()


def test_retry_dead_letter_and_skip_counters_match_the_run(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], otel: Otel
) -> None:
    from parallel_consumer import errors

    # Given 10 records: offset 3 fails once, 2 and 5 are dead-lettered, 7 is skipped
    name = topic(1)
    create_topic(kafka.bootstrap_servers, f"{name}.dlq")
    _produce(kafka.bootstrap_servers, name, 10, 1, traced=False)
    group = consumer_config["group.id"]

    def handler(ctx: PollContext) -> None:
        if ctx.offset == 3 and ctx.attempts == 0:
            raise ValueError("first attempt fails")
        if ctx.offset in (2, 5):
            raise errors.DeadLetter("bad record")  # type: ignore[attr-defined]
        if ctx.offset == 7:
            raise errors.Skip("not for us")  # type: ignore[attr-defined]

    pc = ParallelConsumer(
        consumer_config,
        Options(commit_interval=0.1, retry_delay=0, dead_letter_topic=f"{name}.dlq"),  # type: ignore[call-arg]
        telemetry=Telemetry(
            meter_provider=otel.meters, instance="it", histogram_sample_interval=None
        ),
    )
    try:
        pc.subscribe(name)
        pc.poll(handler)
        # When the partition is committed to its end
        wait_until(
            lambda: any(p.committed_offset == 10 for p in pc.statistics().partitions),
            timeout=60,
            what="the partition committed to its end",
            show=pc.statistics,
        )
    finally:
        pc.close()
    # Then the counters match: one retry, two dead letters (in the topic too), one skip
    assert sum(otel.points("pc.retries").values()) == 1
    assert sum(otel.points("pc.dead.lettered.records").values()) == 2
    assert sum(otel.points("pc.skipped.records").values()) == 1
    assert len(_read(kafka.bootstrap_servers, f"{name}.dlq", 2)) == 2
    assert otel.points("pc.processed.records") == {_attrs(group, name, 0): 7}
    # (failed attempts as statistics().records_failed counts them: Skip and DeadLetter are the
    # handler's decisions, counted by their own counters)
    assert otel.points("pc.failed.records") == {_attrs(group, name, 0): 1}
    assert pc.statistics().records_failed == 1


class Spans:
    """What handlers saw as their current span, by (partition, offset)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], tuple[str, str]] = {}
        self.lock = threading.Lock()

    def add(self, ctx: PollContext) -> None:
        span = trace.get_current_span().get_span_context()
        with self.lock:
            self.seen[(ctx.partition, ctx.offset)] = (
                trace.format_trace_id(span.trace_id),
                trace.format_span_id(span.span_id),
            )


def traced_child(ctx: PollContext) -> ProducerRecord:
    """In a worker process (no SDK there): report the current span in the output."""
    span = trace.get_current_span().get_span_context()
    ids = f"{trace.format_trace_id(span.trace_id)}:{trace.format_span_id(span.span_id)}"
    return ProducerRecord(f"{ctx.topic}-out", f"{ctx.offset}:{ids}", key=ctx.key, partition=0)


@pytest.mark.parametrize("runner", ["threads", "asyncio", "process"])
def test_spans_are_parented_current_and_carried_by_outputs_on_the_broker(
    runner: str,
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    otel: Otel,
) -> None:
    # Given 6 records, every other one carrying a traceparent
    name = topic(1)
    out = f"{name}-out"
    create_topic(kafka.bootstrap_servers, out)
    _produce(kafka.bootstrap_servers, name, 6, 1, traced=True)
    spans = Spans()

    def threaded(ctx: PollContext) -> ProducerRecord:
        spans.add(ctx)
        return ProducerRecord(out, f"{ctx.offset}", key=ctx.key, partition=0)

    async def asynchronous(ctx: PollContext) -> ProducerRecord:
        spans.add(ctx)
        return ProducerRecord(out, f"{ctx.offset}", key=ctx.key, partition=0)

    handler: Any = {"threads": threaded, "asyncio": asynchronous, "process": traced_child}[runner]
    options = Options(
        commit_interval=0.1,
        runner=RunnerKind(runner) if runner != "threads" else None,
        processes=1 if runner == "process" else None,
    )
    pc = ParallelConsumer(
        consumer_config, options, telemetry=Telemetry(tracer_provider=otel.tracers)
    )
    try:
        pc.subscribe(name)
        # When they are processed by a poll_and_produce handler
        pc.poll_and_produce(handler)
        outputs = _read(kafka.bootstrap_servers, out, 6)
    finally:
        pc.close()
    headers = {int(m.value().split(b":")[0]): dict(m.headers() or []) for m in outputs}
    assert sorted(headers) == list(range(6))
    if runner == "process":
        # Then in the worker the record's own context is current (no SDK there to start a
        # span), and the output carries it; records without one carry none
        for m in outputs:
            offset, trace_id, span_id = m.value().decode().split(":")
            if int(offset) % 2 == 0:
                assert (trace_id, span_id) == (TRACE_ID, PARENT_SPAN)
                assert headers[int(offset)]["traceparent"] == TRACEPARENT.encode()
            else:
                assert "traceparent" not in headers[int(offset)]
        return
    # Then each record had its own span, parented on its traceparent, current in the handler
    finished = {
        s.attributes["messaging.kafka.offset"]: s for s in otel.exporter.get_finished_spans()
    }
    assert sorted(finished) == list(range(6))
    for offset, span in finished.items():
        ids = (
            trace.format_trace_id(span.context.trace_id),
            trace.format_span_id(span.context.span_id),
        )
        assert spans.seen[(0, offset)] == ids
        assert span.attributes["messaging.destination.name"] == name
        assert span.attributes["messaging.consumer.group.name"] == consumer_config["group.id"]
        if offset % 2 == 0:
            assert ids[0] == TRACE_ID
            assert trace.format_span_id(span.parent.span_id) == PARENT_SPAN
        else:
            assert span.parent is None
        # And its output carries the span's context onward
        assert headers[offset]["traceparent"].startswith(f"00-{ids[0]}-{ids[1]}-".encode())
