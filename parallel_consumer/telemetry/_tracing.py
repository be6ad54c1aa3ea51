"""Tracing: one span per processed record, parented on the record's ``traceparent`` header.

The span is made current *inside* the handler by wrapping the handler itself (not by runner
hooks): a plain function is wrapped by :class:`TracedHandler`, an ``async def`` one by
:class:`AsyncTracedHandler`, whose span lives in the call's own task, so context variables work
as asyncio means them to. Both are picklable: with ``runner="process"`` the wrapper travels to the
worker process with the handler, the parent context travels in the record's headers (which the
process runner copies), and the span is created there with the worker's global tracer provider
(configure the SDK in the handler's module to export from the workers; without an SDK the
incoming context itself is current, so the user's logs and outputs keep the trace).

With ``batch_size > 1`` each record still gets its own span, parented on its own context, and the
handler runs under one ``process batch`` span that links to every record span: that is the
current span inside the handler, and the context produced records carry.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Link, Span, SpanKind, Tracer, TracerProvider

from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.produce import ProducerRecord, outputs_of

__all__ = [
    "AsyncTracedHandler",
    "TracedHandler",
    "extract_context",
    "inject_headers",
    "trace_id_of",
]

INSTRUMENTATION = "parallel_consumer"
Headers = Sequence[tuple[str, bytes | str | None]]


class _HeaderGetter(Getter[Headers]):
    """Reads a Kafka header list (the last value of a repeated header wins, as in Java)."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        found = None
        for name, value in carrier:
            if name.lower() == key.lower() and value is not None:
                found = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return None if found is None else [found]

    def keys(self, carrier: Headers) -> list[str]:
        return [name for name, _ in carrier]


_GETTER = _HeaderGetter()


def extract_context(headers: Headers | None) -> Context:
    """The trace context in a record's headers (W3C ``traceparent`` with the default
    propagator), or an empty context."""
    return propagate.extract(headers or [], getter=_GETTER)


def inject_headers(
    headers: Sequence[tuple[str, bytes | None]] = (), context: Context | None = None
) -> list[tuple[str, bytes | None]]:
    """``headers`` plus the current (or ``context``'s) trace context, for a record you produce
    yourself inside a handler. Headers the propagator writes replace ones of the same name."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    if not carrier:
        return list(headers)
    kept = [(k, v) for k, v in headers if k not in carrier]
    return kept + [(k, v.encode()) for k, v in carrier.items()]


def _with_context(value: object) -> object:
    """A poll_and_produce return value whose records carry the current trace context (records
    that already carry a ``traceparent`` keep theirs)."""
    try:
        records = outputs_of(value)
    except TypeError:
        return value  # the engine reports the wrong type; tracing does not hide it
    if not records:
        return value
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return value
    out = []
    for record in records:
        names = {name for name, _ in record.headers}
        if "traceparent" in names:
            out.append(record)
            continue
        extra = [(k, v.encode()) for k, v in carrier.items() if k not in names]
        out.append(
            ProducerRecord(
                record.topic, record.value, record.key, [*record.headers, *extra], record.partition
            )
        )
    return out[0] if isinstance(value, ProducerRecord) else out


class _TraceIds:
    """Trace ids of records whose last attempt failed and that had no incoming context (their
    span started a new trace), for the dead-letter header ``pc.dlq.trace.id``. Bounded; worker
    threads write, the controller thread reads (single dict operations, atomic in CPython)."""

    LIMIT = 10_000

    def __init__(self) -> None:
        self._ids: OrderedDict[tuple[str, int, int], str] = OrderedDict()
        self._lock = threading.Lock()

    def failed(self, key: tuple[str, int, int], trace_id: str) -> None:
        with self._lock:
            self._ids[key] = trace_id
            if len(self._ids) > self.LIMIT:
                self._ids.popitem(last=False)

    def succeeded(self, key: tuple[str, int, int]) -> None:
        if self._ids:
            with self._lock:
                self._ids.pop(key, None)

    def get(self, key: tuple[str, int, int]) -> str | None:
        return self._ids.get(key)


class TracedHandler:
    """A plain handler wrapped so each call runs under its records' spans (see module doc)."""

    def __init__(
        self,
        handler: Any,
        *,
        group: str,
        produces: bool,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.handler = handler
        self._group = group
        self._produces = produces
        self._provider = tracer_provider
        self._tracer: Tracer | None = None
        self.trace_ids = _TraceIds()

    def __getstate__(self) -> dict[str, Any]:
        # A tracer provider does not travel to worker processes: they use their global one.
        return {"handler": self.handler, "group": self._group, "produces": self._produces}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.handler = state["handler"]
        self._group = state["group"]
        self._produces = state["produces"]
        self._provider = None
        self._tracer = None
        self.trace_ids = _TraceIds()

    @property
    def tracer(self) -> Tracer:
        if self._tracer is None:
            self._tracer = trace.get_tracer(INSTRUMENTATION, tracer_provider=self._provider)
        return self._tracer

    def __call__(self, context: PollContext) -> object:
        with self._spans(context):
            value = self.handler(context)
            return _with_context(value) if self._produces else value

    @contextlib.contextmanager
    def _spans(self, context: PollContext) -> Iterator[None]:
        tracer = self.tracer
        records = context.records
        with contextlib.ExitStack() as stack:
            if len(records) == 1:
                record = records[0]
                spans = [
                    stack.enter_context(
                        tracer.start_as_current_span(
                            f"process {record.topic}",
                            context=extract_context(record.headers),
                            kind=SpanKind.CONSUMER,
                            attributes=self._attributes(record),
                        )
                    )
                ]
            else:
                spans = [stack.enter_context(self._record_span(r)) for r in records]
                stack.enter_context(
                    tracer.start_as_current_span(
                        "process batch",
                        context=Context(),
                        kind=SpanKind.CONSUMER,
                        links=[Link(s.get_span_context()) for s in spans],
                        attributes={
                            "messaging.system": "kafka",
                            "messaging.operation.type": "process",
                            "messaging.batch.message_count": len(spans),
                            "messaging.consumer.group.name": self._group,
                        },
                    )
                )
            try:
                yield
            except BaseException as exc:
                if len(spans) > 1:
                    # (The current span records the exception itself as it leaves.)
                    for span in spans:
                        span.record_exception(exc)
                        span.set_status(trace.Status(trace.StatusCode.ERROR, repr(exc)))
                self._remember(records, spans, failed=True)
                raise
            self._remember(records, spans, failed=False)

    @contextlib.contextmanager
    def _record_span(self, record: RecordContext) -> Iterator[Span]:
        """A record's span in a batch: started and ended with the call, never current."""
        span = self.tracer.start_span(
            f"process {record.topic}",
            context=extract_context(record.headers),
            kind=SpanKind.CONSUMER,
            attributes=self._attributes(record),
        )
        try:
            yield span
        finally:
            span.end()

    def _remember(
        self, records: Sequence[RecordContext], spans: Sequence[Span], *, failed: bool
    ) -> None:
        for record, span in zip(records, spans, strict=True):
            key = (record.topic, record.partition, record.offset)
            if failed:
                span_context = span.get_span_context()
                if span_context.is_valid:
                    self.trace_ids.failed(key, trace.format_trace_id(span_context.trace_id))
            else:
                self.trace_ids.succeeded(key)

    def _attributes(self, record: RecordContext) -> Mapping[str, Any]:
        return {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.destination.name": record.topic,
            "messaging.destination.partition.id": str(record.partition),
            "messaging.kafka.offset": record.offset,
            "messaging.consumer.group.name": self._group,
            "pc.attempt": record.attempts + 1,
        }

    def trace_id(self, record: RecordContext) -> str | None:
        """The trace id of ``record``'s processing spans: its incoming context's, or the one
        its last failed attempt started (the value of the dead-letter header
        ``pc.dlq.trace.id``)."""
        return trace_id_of(record.headers) or self.trace_ids.get(
            (record.topic, record.partition, record.offset)
        )

    def __repr__(self) -> str:
        return f"<TracedHandler {self.handler!r}>"


class AsyncTracedHandler(TracedHandler):
    """The ``async def`` form: the spans are opened inside the call's task."""

    async def __call__(self, context: PollContext) -> object:
        with self._spans(context):
            value = await self.handler(context)
            return _with_context(value) if self._produces else value


def trace_id_of(headers: Headers | None) -> str | None:
    """The 32-hex-digit trace id in ``headers``' trace context, or None."""
    span_context = trace.get_current_span(extract_context(headers)).get_span_context()
    if not span_context.is_valid:
        return None
    return trace.format_trace_id(span_context.trace_id)
