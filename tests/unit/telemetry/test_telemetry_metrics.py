"""OpenTelemetry metrics on the fakes: counters fed by the hooks, gauges read from statistics(),
the record-fate hooks, combined hooks, and "no SDK configured"."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import metrics, trace

from parallel_consumer import ConfigurationError, NoHooks, Options, PollContext, RecordContext
from parallel_consumer.telemetry import STATUS_VALUES, Telemetry, combine_hooks
from parallel_consumer.telemetry._metrics import MetricsHooks, encoding_of
from parallel_consumer.testing.fakes import FakeCluster, Message

BASE = (("group", "g"), ("pcinstance", "i1"))


def _tp(topic: str, partition: int) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted({**dict(BASE), "topic": topic, "partition": partition}.items()))


def _fill(cluster: Any, n: int, partitions: int = 2) -> None:
    cluster.create_topic("t", partitions)
    for i in range(n):
        cluster.produce("t", b"v%d" % i, key=b"k%d" % i, partition=i % partitions)


def test_counters_match_the_processed_and_failed_counts_of_a_run(otel, consumers, wait):
    # Given 20 records on 2 partitions, and a handler that fails the first attempt of offset 2
    _fill(consumers.cluster, 20)
    pc = consumers.make(
        Options(commit_interval=0.05, retry_delay=0),
        telemetry=otel.telemetry(instance="i1", histogram_sample_interval=None),
    )

    def handler(ctx: PollContext) -> None:
        if ctx.offset == 2 and ctx.attempts == 0:
            raise ValueError("first attempt fails")

    # When they are all processed
    pc.poll(handler)
    wait(lambda: pc.statistics().records_succeeded == 20, what="20 records done")
    stats = pc.statistics()
    # Then the counters per partition add up to the engine's counts
    processed = otel.points("pc.processed.records")
    failed = otel.points("pc.failed.records")
    assert processed == {_tp("t", 0): 10, _tp("t", 1): 10}
    assert failed == {_tp("t", 0): 1, _tp("t", 1): 1}
    assert sum(processed.values()) == stats.records_succeeded
    assert sum(failed.values()) == stats.records_failed
    # One processing-time sample per handler call, one end-to-end latency per success
    assert otel.points("pc.user.function.processing.time") == {BASE: 22}
    assert sum(otel.points("pc.end.to.end.latency").values()) == 20


def test_gauges_show_per_partition_values_that_match_statistics(otel, consumers, wait):
    # Given records processed and committed on 2 partitions
    _fill(consumers.cluster, 10)
    pc = consumers.make(
        Options(commit_interval=0.05),
        telemetry=otel.telemetry(instance="i1", histogram_sample_interval=None),
    )
    pc.poll(lambda ctx: None)
    wait(
        lambda: (
            all(p.committed_offset == 5 and not p.dirty for p in pc.statistics().partitions)
            and len(pc.statistics().partitions) == 2
        ),
        what="both partitions committed at 5",
    )
    # When a reader collects
    stats = pc.statistics()
    # Then each per-partition gauge equals its PartitionSnapshot field
    fields = {
        "pc.partition.incomplete.offsets": "incomplete",
        "pc.partition.highest.completed.offset": "highest_succeeded",
        "pc.partition.highest.sequential.succeeded.offset": "highest_sequential_succeeded",
        "pc.partition.highest.seen.offset": "highest_seen",
        "pc.partition.latest.committed.offset": "committed_offset",
        "pc.partition.assignment.epoch": "epoch",
    }
    for name, field in fields.items():
        expected = {_tp(p.topic, p.partition): getattr(p, field) for p in stats.partitions}
        assert otel.points(name) == expected, name
    assert otel.points("pc.partitions.number") == {BASE: 2}
    assert otel.points("pc.status") == {BASE: STATUS_VALUES[stats.lifecycle]}
    assert otel.points("pc.inflight.records") == {BASE: 0}
    assert otel.points("pc.commits.sent") == {BASE: stats.commits_sent}
    # And the commits sent were timed and their encodings counted
    assert otel.points("pc.commit.latency")[BASE] >= 2


def test_gauges_report_nothing_once_the_consumer_is_closed(otel, consumers, wait):
    _fill(consumers.cluster, 2)
    pc = consumers.make(Options(commit_interval=0.05), telemetry=otel.telemetry())
    pc.poll(lambda ctx: None)
    wait(lambda: pc.statistics().records_succeeded == 2)
    assert otel.points("pc.partitions.number")
    pc.close()
    otel.reader.get_metrics_data()  # (cumulative points of the last collection are dropped)
    assert otel.points("pc.partitions.number") == {}


def test_no_sdk_configured_records_nothing_wraps_nothing_and_raises_nothing(consumers, wait):
    # Given no global providers and none passed
    assert type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider"
    assert type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider"
    telemetry = Telemetry()
    assert not telemetry.metrics_enabled
    assert not telemetry.tracing_enabled

    def handler(ctx: PollContext) -> None:
        assert not trace.get_current_span().get_span_context().is_valid

    # When a consumer runs with it
    _fill(consumers.cluster, 6)
    pc = consumers.make(Options(commit_interval=0.05), telemetry=telemetry)
    pc.poll(handler)
    wait(lambda: pc.statistics().records_succeeded == 6)
    pc.close()
    # Then no hook was installed, the handler ran unwrapped, and no instrument exists
    assert telemetry.metrics_hooks is None
    assert telemetry.wrap(handler, is_async=False, produces=False) is handler
    assert pc.failure is None
    assert repr(telemetry).endswith("off>")


def test_record_fate_hooks_count_retries_dead_letters_and_skips(otel):
    # (The engine's failure handling calls these; here they are called as it does.)
    hooks = MetricsHooks(otel.meters.get_meter("t"), base=dict(BASE), slow_after=10.0)
    record = RecordContext(Message(topic="t", partition=1, offset=5, value=b"x"))
    hooks.on_retry(record, ValueError("x"), 1.0)
    hooks.on_retry(record, ValueError("x"), 1.0)
    hooks.on_dead_letter(record, ValueError("x"), "retries-exhausted")
    hooks.on_skip(record, None, "skip")
    assert otel.points("pc.retries") == {_tp("t", 1): 2}
    reason = lambda r: tuple(sorted({**dict(_tp("t", 1)), "reason": r}.items()))  # noqa: E731
    assert otel.points("pc.dead.lettered.records") == {reason("retries-exhausted"): 1}
    assert otel.points("pc.skipped.records") == {reason("skip"): 1}


def test_a_slow_call_counts_its_records_as_slow(otel):
    hooks = MetricsHooks(otel.meters.get_meter("t"), base=dict(BASE), slow_after=0.5)
    messages = [Message(topic="t", partition=0, offset=i) for i in range(3)]
    hooks.sample_call(messages, [None, None, ValueError()], 0.75, False)
    hooks.sample_call(messages[:1], [None], 0.25, True)
    assert otel.points("pc.slow.records") == {_tp("t", 0): 3}


@pytest.mark.parametrize(
    ("metadata", "encoding"),
    [("bAAGNgA=", "BIT_SET"), ("bgABAAIAAQAC", "RUN_LENGTH"), ("", None), ("%%%%", None)],
)
def test_the_encoding_of_a_committed_map_is_read_from_its_magic_byte(metadata, encoding):
    found = encoding_of(metadata)
    assert (found.name if found else None) == encoding


def test_combined_hooks_all_run_even_when_one_raises():
    calls: list[str] = []

    class Broken(NoHooks):
        def on_commit(self, answers: Sequence[Any]) -> None:
            calls.append("broken")
            raise RuntimeError("exporter down")

    class Fine(NoHooks):
        def on_commit(self, answers: Sequence[Any]) -> None:
            calls.append("fine")

    combined = combine_hooks(Broken(), None, Fine())
    combined.on_commit([])
    assert calls == ["broken", "fine"]
    assert type(combine_hooks(None, NoHooks())) is NoHooks
    only = Fine()
    assert combine_hooks(only, None) is only


def test_one_telemetry_serves_one_consumer(otel, consumers):
    telemetry = otel.telemetry()
    consumers.make(telemetry=telemetry)
    with pytest.raises(ConfigurationError, match="already serves a ParallelConsumer"):
        consumers.make(telemetry=telemetry)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"instance": ""}, r"instance=\) must be a non-empty string"),
        ({"slow_after": -1}, r"slow_after=\) must be seconds >= 0"),
        ({"slow_after": "10"}, r"slow_after=\) must be seconds >= 0"),
        ({"histogram_sample_interval": -0.1}, r"histogram_sample_interval=\) must be seconds"),
    ],
)
def test_bad_telemetry_settings_are_named(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        Telemetry(**kwargs)


class CountingMeter:
    """A stand-in Meter that counts what reaches OpenTelemetry per record."""

    def __init__(self) -> None:
        self.records = 0
        self.callbacks: list[Any] = []

    def create_observable_counter(self, name: str, callbacks: list[Any], **kw: Any) -> None:
        self.callbacks.extend(callbacks)

    def create_histogram(self, name: str, **kw: Any) -> Any:
        meter = self

        class Histogram:
            def record(self, value: float, attributes: Any = None) -> None:
                meter.records += 1

        return Histogram()


def test_only_sampled_calls_reach_the_histograms():
    # Given the metrics hooks
    meter = CountingMeter()
    hooks = MetricsHooks(
        meter,  # type: ignore[arg-type]
        base=dict(BASE),
        slow_after=10.0,
        sample_interval=0.01,
    )
    messages = [
        Message(topic="t", partition=i % 2, offset=i, timestamp=(1, 1000)) for i in range(4)
    ]
    # When the engine hands over a slow call that is not a periodic sample, then a periodic one
    hooks.sample_call(messages, [None, None, None, ValueError()], 11.0, False)
    assert meter.records == 0
    hooks.sample_call(messages, [ValueError(), None, None, None], 0.001, True)
    # Then only the periodic one reached the histograms (processing time and end-to-end
    # latency, once each), and only the slow one counted as slow
    assert meter.records == 2
    assert hooks.slow == {("t", 0): 2, ("t", 1): 2}


def test_the_engine_samples_one_call_per_interval_plus_every_slow_call(otel, consumers, wait):
    # Given metrics that sample at most one call per hour and count calls over 50 ms as slow
    _fill(consumers.cluster, 20)
    pc = consumers.make(
        Options(commit_interval=0.05, ordering="partition"),
        telemetry=otel.telemetry(
            instance="i1", tracing=False, slow_after=0.05, histogram_sample_interval=3600
        ),
    )

    def handle(ctx: PollContext) -> None:
        if ctx.offset in (5, 8):
            time.sleep(0.1)

    # When 20 calls run, offsets 5 and 8 of both partitions slow
    pc.poll(handle)
    wait(lambda: pc.statistics().records_succeeded == 20)
    pc.close()
    # Then one call reached the histogram, the four slow ones counted as slow, and the totals
    # of every record came from the engine
    assert sum(otel.points("pc.user.function.processing.time").values()) == 1
    assert otel.points("pc.slow.records") == {_tp("t", 0): 2, _tp("t", 1): 2}
    assert otel.points("pc.processed.records") == {_tp("t", 0): 10, _tp("t", 1): 10}


def test_health_gauges_read_the_health_report_once_the_consumer_has_one(otel, consumers, wait):
    # (attach() takes ParallelConsumer.health as health=.)
    _fill(consumers.cluster, 2)
    pc = consumers.make(Options(commit_interval=0.05))
    pc.poll(lambda ctx: None)
    reports = []

    class Report:
        healthy = False
        stalled_partitions = (("t", 0), ("t", 1))

    def health() -> Report:
        reports.append(1)
        return Report()

    telemetry = otel.telemetry(instance="i1")
    telemetry.attach(
        None, group="g", statistics=pc.statistics, max_metadata_bytes=4096, health=health
    )
    assert otel.points("pc.healthy") == {BASE: 0}
    assert otel.points("pc.partitions.stalled") == {BASE: 2}
    assert len(reports) == 1  # one report per collection, shared by both gauges
    telemetry.closed()
    otel.reader.get_metrics_data()
    assert otel.points("pc.healthy") == {}


def _slow_points(reader: Any) -> dict[tuple[str, int], int]:
    data = reader.get_metrics_data()
    out: dict[tuple[str, int], int] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "pc.slow.records":
                    for point in metric.data.data_points:
                        attrs = point.attributes
                        out[(attrs["topic"], attrs["partition"])] = point.value
    return out


def test_a_call_abandoned_past_its_deadline_counts_as_slow():
    """Claim: pc.slow.records is exact: every call longer than slow_after is
    sampled. (Before the change on_work_done, which _abandon calls, counted it.)

    Reproduction: Telemetry(slow_after=0.05) with an in-memory reader, processing_timeout=0.3,
    a handler whose first call of offset 0 takes 1.5 s: the engine abandons it after 0.3 s
    (far longer than slow_after) and retries the record, which then succeeds fast. The late
    result of the abandoned call is ignored (_work_done returns before _sample).

    Before the fix: pc.slow.records reports nothing for t[0], although a call of its record ran
    (and was abandoned) far beyond slow_after.
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from parallel_consumer import Options, ParallelConsumer
    from parallel_consumer.telemetry import Telemetry

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    cluster.produce("t", b"0", partition=0)
    attempts: list[int] = []
    done = threading.Event()
    first_returned = threading.Event()

    def handle(ctx: PollContext) -> None:
        attempts.append(ctx.offset)
        if len(attempts) == 1:
            time.sleep(1.5)
            first_returned.set()
            return
        done.set()

    pc = ParallelConsumer(
        {"bootstrap.servers": "fake:9092", "group.id": "g"},
        Options(processing_timeout=0.3, max_concurrency=2),
        telemetry=Telemetry(meter_provider=meters, slow_after=0.05),
        consumer_factory=cluster.consumer,
        producer_factory=cluster.producer,
        admin_factory=cluster.admin,
    )
    pc.subscribe(["t"])
    try:
        pc.poll(handle)
        assert done.wait(10), "the record was retried after its deadline"
        assert first_returned.wait(10)  # the abandoned call returned (its result is ignored)
        assert pc.statistics().deadline_exceeded == 1
        assert _slow_points(reader).get(("t", 0), 0) >= 1
    finally:
        pc.close(drain=False, timeout=5)
        meters.shutdown()
