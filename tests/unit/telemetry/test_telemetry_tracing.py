"""Tracing on the fakes: a span per record parented on its ``traceparent``, current inside the
handler in the thread, asyncio and process runners, and carried onward by produced records.

``child_handler`` is module-level: worker processes are spawned and import it by name.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from parallel_consumer import (
    DeadLetter,
    Options,
    PollContext,
    ProducerRecord,
    RecordContext,
    RunnerKind,
)
from parallel_consumer.dead_letter import read_dead_letter
from parallel_consumer.telemetry import inject_headers, trace_id_of
from parallel_consumer.telemetry._tracing import TracedHandler
from parallel_consumer.testing.fakes import Message

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-01".encode()


def _seed(cluster: Any, n: int) -> None:
    cluster.create_topic("t", 1)
    cluster.create_topic("out", 1)
    for i in range(n):
        headers = [("traceparent", TRACEPARENT)] if i % 2 == 0 else None
        cluster.produce("t", b"v%d" % i, key=b"k%d" % i, partition=0, headers=headers)


def _current() -> tuple[str, str]:
    context = trace.get_current_span().get_span_context()
    return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)


def _header(message: Any, name: str) -> bytes | None:
    return dict(message.headers() or []).get(name)


def _check_record_spans(otel: Any, seen: dict[int, tuple[str, str]], n: int) -> None:
    spans = {s.attributes["messaging.kafka.offset"]: s for s in otel.spans()}
    assert sorted(spans) == list(range(n))
    for offset, span in spans.items():
        assert span.kind is SpanKind.CONSUMER
        assert span.name == "process t"
        assert span.attributes["messaging.system"] == "kafka"
        assert span.attributes["messaging.destination.name"] == "t"
        assert span.attributes["messaging.destination.partition.id"] == "0"
        assert span.attributes["messaging.consumer.group.name"] == "g"
        assert span.attributes["pc.attempt"] == 1
        ids = (
            trace.format_trace_id(span.context.trace_id),
            trace.format_span_id(span.context.span_id),
        )
        # The span was the current one inside the handler
        assert seen[offset] == ids
        if offset % 2 == 0:  # parented on the record's traceparent
            assert span.parent is not None
            assert trace.format_span_id(span.parent.span_id) == PARENT_SPAN
            assert ids[0] == TRACE_ID
        else:  # no incoming context: a new trace
            assert span.parent is None
            assert ids[0] != TRACE_ID


def test_thread_runner_span_per_record_parented_and_current(otel, consumers, wait):
    _seed(consumers.cluster, 4)
    seen: dict[int, tuple[str, str]] = {}
    lock = threading.Lock()

    def handler(ctx: PollContext) -> None:
        with lock:
            seen[ctx.offset] = _current()

    pc = consumers.make(Options(commit_interval=0.05), telemetry=otel.telemetry(metrics=False))
    pc.poll(handler)
    wait(lambda: len(otel.spans()) == 4, what="4 spans")
    _check_record_spans(otel, seen, 4)


def test_asyncio_runner_span_is_current_inside_the_task(otel, consumers, wait):
    _seed(consumers.cluster, 4)
    seen: dict[int, tuple[str, str]] = {}

    async def handler(ctx: PollContext) -> None:
        seen[ctx.offset] = _current()

    pc = consumers.make(Options(commit_interval=0.05), telemetry=otel.telemetry(metrics=False))
    pc.poll(handler)
    wait(lambda: len(otel.spans()) == 4, what="4 spans")
    _check_record_spans(otel, seen, 4)


def test_a_failed_attempt_marks_its_span_and_the_retry_counts_its_attempt(otel, consumers, wait):
    _seed(consumers.cluster, 1)

    def handler(ctx: PollContext) -> None:
        if ctx.attempts == 0:
            raise ValueError("first attempt fails")

    pc = consumers.make(
        Options(commit_interval=0.05, retry_delay=0), telemetry=otel.telemetry(metrics=False)
    )
    pc.poll(handler)
    wait(lambda: len(otel.spans()) == 2, what="2 spans")
    first, second = sorted(otel.spans(), key=lambda s: s.attributes["pc.attempt"])
    assert first.status.status_code is trace.StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert second.status.status_code is trace.StatusCode.UNSET
    assert second.attributes["pc.attempt"] == 2


def test_produced_records_carry_the_span_context_onward(otel, consumers, wait):
    _seed(consumers.cluster, 2)
    seen: dict[int, tuple[str, str]] = {}

    def handler(ctx: PollContext) -> ProducerRecord:
        seen[ctx.offset] = _current()
        return ProducerRecord("out", ctx.value, ctx.key, headers={"app": "kept"})

    pc = consumers.make(Options(commit_interval=0.05), telemetry=otel.telemetry(metrics=False))
    pc.poll_and_produce(handler)
    wait(lambda: len(consumers.cluster._logs["out"][0]) == 2, what="2 outputs")
    for output in consumers.cluster._logs["out"][0]:
        offset = int(output.value()[1:])
        trace_id, span_id = seen[offset]
        traceparent = _header(output, "traceparent")
        assert traceparent is not None
        assert traceparent.startswith(f"00-{trace_id}-{span_id}-".encode())
        assert _header(output, "app") == b"kept"


def test_a_batch_runs_under_a_batch_span_linked_to_each_record_span(otel, consumers, wait):
    _seed(consumers.cluster, 2)
    seen: list[tuple[str, str]] = []

    def handler(ctx: PollContext) -> None:
        seen.append(_current())

    pc = consumers.make(
        Options(commit_interval=0.05, batch_size=2, max_concurrency=1),
        telemetry=otel.telemetry(metrics=False),
    )
    pc.poll(handler)
    wait(lambda: len(otel.spans()) == 3, what="2 record spans and a batch span")
    batch = next(s for s in otel.spans() if s.name == "process batch")
    records = [s for s in otel.spans() if s.name == "process t"]
    assert seen == [
        (trace.format_trace_id(batch.context.trace_id), trace.format_span_id(batch.context.span_id))
    ]
    assert batch.parent is None
    assert {link.context.span_id for link in batch.links} == {s.context.span_id for s in records}
    assert {r.attributes["messaging.kafka.offset"] for r in records} == {0, 1}
    parented = next(r for r in records if r.attributes["messaging.kafka.offset"] == 0)
    assert trace.format_span_id(parented.parent.span_id) == PARENT_SPAN


def child_handler(ctx: PollContext) -> ProducerRecord:
    """Runs in a worker process: reports the span current there, and produces."""
    trace_id, span_id = _current()
    return ProducerRecord("out", f"{ctx.offset}:{trace_id}:{span_id}", ctx.key)


def test_process_runner_makes_the_records_context_current_in_the_worker(otel, consumers, wait):
    # Given records with and without a traceparent, and a handler in a worker process (which
    # has no SDK: its span is the propagated context itself)
    _seed(consumers.cluster, 2)
    pc = consumers.make(
        Options(commit_interval=0.05, runner=RunnerKind.PROCESS, processes=1),
        telemetry=otel.telemetry(metrics=False),
    )
    pc.poll_and_produce(child_handler)
    wait(lambda: len(consumers.cluster._logs["out"][0]) == 2, timeout=60, what="2 outputs")
    outputs = {int(m.value().split(b":")[0]): m for m in consumers.cluster._logs["out"][0]}
    # Then the record's context was current inside the worker, and its output carries it
    _offset, trace_id, span_id = outputs[0].value().decode().split(":")
    assert (trace_id, span_id) == (TRACE_ID, PARENT_SPAN)
    assert _header(outputs[0], "traceparent") == TRACEPARENT
    # And a record without one ran without a trace (nothing to continue, no SDK to start one)
    assert _header(outputs[1], "traceparent") is None


def test_inject_headers_adds_the_current_context_for_records_you_produce_yourself(otel):
    tracer = otel.tracers.get_tracer("t")
    with tracer.start_as_current_span("s") as span:
        headers = inject_headers([("traceparent", b"stale"), ("app", b"1")])
    context = span.get_span_context()
    assert headers[0] == ("app", b"1")
    assert trace_id_of(headers) == trace.format_trace_id(context.trace_id)
    assert inject_headers([("app", b"1")]) == [("app", b"1")]  # no current span: unchanged


def test_the_dead_letter_trace_id_is_the_records_trace(otel):
    traced = TracedHandler(
        lambda ctx: (_ for _ in ()).throw(ValueError("x")),
        group="g",
        produces=False,
        tracer_provider=otel.tracers,
    )
    with_parent = RecordContext(
        Message(topic="t", partition=0, offset=1, headers=[("traceparent", TRACEPARENT)])
    )
    without = RecordContext(Message(topic="t", partition=0, offset=2))
    for record in (with_parent, without):
        with contextlib.suppress(ValueError):
            traced(PollContext([record]))
    assert traced.trace_id(with_parent) == TRACE_ID
    started = next(s for s in otel.spans() if s.attributes["messaging.kafka.offset"] == 2)
    assert traced.trace_id(without) == trace.format_trace_id(started.context.trace_id)


def test_a_dead_letter_carries_the_trace_id_of_its_records_processing(otel, consumers, wait):
    # Given a record with a traceparent and one without, both dead-lettered by the handler
    _seed(consumers.cluster, 2)
    consumers.cluster.create_topic("t.dlq", 1)

    def handler(ctx: PollContext) -> None:
        raise DeadLetter("unusable")

    options = Options(commit_interval=0.05, dead_letter_topic="t.dlq")
    pc = consumers.make(options, telemetry=otel.telemetry(metrics=False))
    pc.poll(handler)
    wait(lambda: len(consumers.cluster.records("t.dlq")) == 2, what="2 dead letters")

    # Then each dead letter names the trace its record was processed in
    spans = {s.attributes["messaging.kafka.offset"]: s for s in otel.spans()}
    for letter in consumers.cluster.records("t.dlq"):
        info = read_dead_letter(letter.headers())
        assert info is not None
        span = spans[info.offset]
        assert info.trace_id == trace.format_trace_id(span.context.trace_id)
    by_offset = {
        read_dead_letter(m.headers()).offset: m for m in consumers.cluster.records("t.dlq")
    }
    assert read_dead_letter(by_offset[0].headers()).trace_id == TRACE_ID
