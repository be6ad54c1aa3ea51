"""Fixtures for the telemetry tests on the fakes: in-memory OpenTelemetry readers and exporters
(the SDK's own), and ParallelConsumers over a FakeCluster that are closed after each test."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from parallel_consumer import Options, ParallelConsumer, ParallelConsumerError
from parallel_consumer.telemetry import Telemetry
from parallel_consumer.testing.fakes import FakeCluster, FakeProducer


def wait_for(condition: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    """Re-check ``condition`` until true; fail after ``timeout`` real seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(0.005)


class Otel:
    """An SDK meter provider with an in-memory reader and a tracer provider with an in-memory
    exporter, plus readers of what they hold."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.exporter))

    def telemetry(self, *, metrics: bool = True, tracing: bool = True, **kw: Any) -> Telemetry:
        return Telemetry(
            meter_provider=self.meters if metrics else None,
            tracer_provider=self.tracers if tracing else None,
            **kw,
        )

    def points(self, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        """The data points of metric ``name`` by their sorted attributes: a number for sums and
        gauges, the count for histograms."""
        data = self.reader.get_metrics_data()
        out: dict[tuple[tuple[str, Any], ...], Any] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        key = tuple(sorted(point.attributes.items()))
                        out[key] = point.value if hasattr(point, "value") else point.count
        return out

    def names(self) -> set[str]:
        data = self.reader.get_metrics_data()
        return {
            metric.name
            for resource in (data.resource_metrics if data else ())
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }

    def spans(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def close(self) -> None:
        self.meters.shutdown()
        self.tracers.shutdown()


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    yield o
    o.close()


class Consumers:
    """ParallelConsumers over one FakeCluster, closed at the end of the test."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.instances: list[ParallelConsumer] = []
        self.producers: list[FakeProducer] = []

    def _producer(self, config: dict[str, Any]) -> FakeProducer:
        producer = self.cluster.producer(config)
        self.producers.append(producer)
        return producer

    def make(
        self,
        options: Options | None = None,
        *,
        telemetry: Telemetry | None = None,
        hooks: Any = None,
        topics: tuple[str, ...] = ("t",),
    ) -> ParallelConsumer:
        pc = ParallelConsumer(
            {"bootstrap.servers": "fake:9092", "group.id": "g"},
            options,
            hooks=hooks,
            telemetry=telemetry,
            consumer_factory=self.cluster.consumer,
            producer_factory=self._producer,
            admin_factory=self.cluster.admin,
        )
        pc.subscribe(list(topics))
        self.instances.append(pc)
        return pc

    def close_all(self) -> None:
        for pc in self.instances:
            with contextlib.suppress(ParallelConsumerError):
                pc.close(drain=False, timeout=5.0)


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
def consumers(cluster: FakeCluster) -> Iterator[Consumers]:
    c = Consumers(cluster)
    yield c
    c.close_all()


@pytest.fixture
def wait() -> Callable[..., None]:
    return wait_for
