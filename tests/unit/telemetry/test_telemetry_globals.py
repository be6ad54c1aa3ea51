"""The library convention: with the SDK configured globally, a ParallelConsumer made without
``telemetry=`` reports metrics and spans; ``telemetry=False`` opts out; and without an SDK
nothing of OpenTelemetry is even loaded."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Consumers, Otel
from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.util._once import Once

from parallel_consumer import ConfigurationError, Options, ParallelConsumer, PollContext
from parallel_consumer.telemetry import Telemetry


@pytest.fixture
def global_otel(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> Otel:
    """``otel``'s providers set as the global ones, as an application (or
    ``opentelemetry-instrument``) sets them; the API's globals are put back afterwards."""
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    metrics.set_meter_provider(otel.meters)
    trace.set_tracer_provider(otel.tracers)
    return otel


def _run(consumers: Consumers, wait: Callable[..., None], **kw: Any) -> ParallelConsumer:
    for i in range(4):
        consumers.cluster.produce("t", b"v%d" % i, partition=0)
    pc = consumers.make(Options(commit_interval=0.05), **kw)
    pc.poll(lambda ctx: None)
    wait(lambda: pc.statistics().records_succeeded == 4)
    return pc


def test_global_providers_report_metrics_and_spans_without_passing_anything(
    global_otel: Otel, consumers: Consumers, wait: Callable[..., None]
) -> None:
    # Given the SDK set as the global meter and tracer providers
    consumers.cluster.create_topic("t", 1)
    # When a consumer is made without telemetry= and processes four records
    pc = _run(consumers, wait)
    # Then its spans and its metrics reached the global providers' exporter and reader
    wait(lambda: len(global_otel.spans()) == 4, what="a span per record")
    assert {s.name for s in global_otel.spans()} == {"process t"}
    wait(
        lambda: sum(global_otel.points("pc.processed.records").values()) == 4,
        what="the processed records counted",
    )
    pc.close()


def test_telemetry_false_opts_out_of_the_global_providers(
    global_otel: Otel, consumers: Consumers, wait: Callable[..., None]
) -> None:
    consumers.cluster.create_topic("t", 1)
    seen: list[bool] = []
    for i in range(4):
        consumers.cluster.produce("t", b"v%d" % i, partition=0)
    pc = consumers.make(Options(commit_interval=0.05), telemetry=False)  # type: ignore[arg-type]

    @pc.poll
    def handle(ctx: PollContext) -> None:
        seen.append(trace.get_current_span().get_span_context().is_valid)

    wait(lambda: pc.statistics().records_succeeded == 4)
    pc.close()
    assert seen == [False] * 4
    assert global_otel.spans() == ()
    assert "pc.processed.records" not in global_otel.names()


def test_an_explicit_telemetry_still_wins_over_the_global_providers(
    global_otel: Otel, consumers: Consumers, wait: Callable[..., None]
) -> None:
    # Given other providers passed explicitly
    other = Otel()
    try:
        consumers.cluster.create_topic("t", 1)
        pc = _run(consumers, wait, telemetry=other.telemetry(instance="explicit"))
        wait(lambda: len(other.spans()) == 4, what="spans on the explicit provider")
        pc.close()
        assert global_otel.spans() == ()
        points = other.points("pc.processed.records")
        assert all(dict(key)["pcinstance"] == "explicit" for key in points)
    finally:
        other.close()


def test_no_global_provider_makes_no_telemetry() -> None:
    # The API's placeholders (nothing set) are not an SDK: nothing to report to
    assert type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider"
    assert Telemetry.from_globals() is None


def test_telemetry_true_is_refused_with_what_to_pass() -> None:
    with pytest.raises(ConfigurationError, match="leave telemetry out"):
        ParallelConsumer(
            {"bootstrap.servers": "fake:9092", "group.id": "g"},
            telemetry=True,  # type: ignore[arg-type]
        )


def test_a_consumer_made_and_run_without_opentelemetry_imported_never_loads_it() -> None:
    # In a fresh interpreter: the application never imported OpenTelemetry, so it set no
    # provider; making and running a consumer must not load it (no cost, per record or other)
    code = """
import sys
from parallel_consumer import ParallelConsumer
from parallel_consumer.testing.fakes import FakeCluster
cluster = FakeCluster()
cluster.create_topic("t")
cluster.produce("t", b"x", partition=0)
pc = ParallelConsumer({"bootstrap.servers": "f:1", "group.id": "g"},
                      consumer_factory=cluster.consumer)
pc.subscribe("t")
pc.poll(lambda ctx: None)
pc.close()
print(pc._telemetry, sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None []"
