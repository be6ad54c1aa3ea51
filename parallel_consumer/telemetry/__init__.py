"""OpenTelemetry metrics and tracing for a ParallelConsumer (see docs/metrics.md and
docs/tracing.md).

As OpenTelemetry's instrumentation libraries do, a ParallelConsumer reports to the global
providers when the application set them (``metrics.set_meter_provider``,
``trace.set_tracer_provider``, or ``opentelemetry-instrument``) before making it: nothing to
pass. ``telemetry=Telemetry(...)`` gives explicit providers or an instance name;
``telemetry=False`` turns both off::

    from parallel_consumer.telemetry import Telemetry

    pc = ParallelConsumer(config, options, telemetry=Telemetry(instance="orders-1"))

Only the ``opentelemetry-api`` package is used here; install the SDK (``pip install
'parallel-consumer[otel]'``) and configure it to export. Metrics are on when a meter provider
is given or the global one was set before the Telemetry was made; tracing likewise with a
tracer provider. Off, they cost nothing: no instrument is created, no hook is installed and the
handler is not wrapped.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import metrics, trace

from parallel_consumer.context import RecordContext
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.hooks import (
    _METHODS,
    CallSampling,
    EngineHooks,
    Hooks,
    NoHooks,
    active_hooks,
    guarded,
)
from parallel_consumer.status import Statistics
from parallel_consumer.telemetry._metrics import (
    STATUS_VALUES,
    MetricsHooks,
    _Snapshots,
    register_gauges,
)
from parallel_consumer.telemetry._tracing import (
    INSTRUMENTATION,
    AsyncTracedHandler,
    TracedHandler,
    extract_context,
    inject_headers,
    trace_id_of,
)

__all__ = [
    "STATUS_VALUES",
    "Telemetry",
    "combine_hooks",
    "extract_context",
    "inject_headers",
    "trace_id_of",
]


def _is_set(provider: object) -> bool:
    """False for the API's placeholders: the proxy (nothing set yet) and the no-op providers."""
    name = type(provider).__name__
    return name not in {
        "ProxyTracerProvider",
        "NoOpTracerProvider",
        "_ProxyMeterProvider",
        "NoOpMeterProvider",
    }


class _Combined(EngineHooks):
    """Calls several Hooks objects in order; one that raises is logged and does not keep the
    others from their call."""

    def __init__(self, hooks: Sequence[Hooks]) -> None:
        self._hooks = tuple(hooks)
        safe = [guarded(h) for h in self._hooks]
        self.pc_active_hooks = frozenset().union(*(active_hooks(h) for h in safe))
        for name in _METHODS:
            methods = [getattr(h, name) for h in safe if name in active_hooks(h)]
            setattr(self, name, methods[0] if len(methods) == 1 else self._fan_out(methods))

    @staticmethod
    def _fan_out(methods: list[Callable[..., None]]) -> Callable[..., None]:
        def call(*args: object) -> None:
            for method in methods:
                method(*args)

        return call

    def __repr__(self) -> str:
        return f"<combined hooks {', '.join(map(repr, self._hooks))}>"


def combine_hooks(*hooks: Hooks | None) -> Hooks:
    """One Hooks object that calls each of ``hooks`` in turn (``None`` entries are left out),
    e.g. your own hooks beside the OpenTelemetry ones."""
    given = [h for h in hooks if h is not None and type(h) is not NoHooks]
    if not given:
        return NoHooks()
    if len(given) == 1:
        return given[0]
    return _Combined(given)  # type: ignore[return-value]


class Telemetry:
    """OpenTelemetry for one :class:`~parallel_consumer.ParallelConsumer`: pass it as
    ``ParallelConsumer(..., telemetry=...)``.

    ``meter_provider`` / ``tracer_provider``: None (the default) uses the global provider if
    one was set, and turns metrics / tracing off otherwise. ``instance`` is the ``pcinstance``
    attribute of every meter (default: a random id, as the Java library's ``pcInstanceTag``).
    ``slow_after``: seconds a handler call may take before its records count in
    ``pc.slow.records`` (the Java library's 10 s). ``histogram_sample_interval``: each
    histogram takes at most one sample per this many seconds (default 0.01: at most 100 a
    second, so their cost does not grow with throughput); ``None`` records every call.
    """

    def __init__(
        self,
        *,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        instance: str | None = None,
        slow_after: float = 10.0,
        histogram_sample_interval: float | None = 0.01,
    ) -> None:
        if instance is not None and (not isinstance(instance, str) or not instance):
            raise ConfigurationError(
                f"Telemetry(instance=) must be a non-empty string, got {instance!r}"
            )
        if (
            not isinstance(slow_after, int | float)
            or isinstance(slow_after, bool)
            or not slow_after >= 0
        ):
            raise ConfigurationError(
                f"Telemetry(slow_after=) must be seconds >= 0, got {slow_after!r}"
            )
        if histogram_sample_interval is not None and (
            not isinstance(histogram_sample_interval, int | float)
            or isinstance(histogram_sample_interval, bool)
            or not histogram_sample_interval >= 0
        ):
            raise ConfigurationError(
                "Telemetry(histogram_sample_interval=) must be seconds >= 0 or None (every "
                f"call), got {histogram_sample_interval!r}"
            )
        if meter_provider is None:
            global_meters = metrics.get_meter_provider()
            meter_provider = global_meters if _is_set(global_meters) else None
        if tracer_provider is None:
            global_tracers = trace.get_tracer_provider()
            tracer_provider = global_tracers if _is_set(global_tracers) else None
        self.meter_provider = meter_provider
        self.tracer_provider = tracer_provider
        self.instance = instance or uuid.uuid4().hex
        self.slow_after = float(slow_after)
        self.histogram_sample_interval = histogram_sample_interval
        self._group: str | None = None
        self._snapshots: list[_Snapshots[Any]] = []
        self._traced: TracedHandler | None = None
        #: The controller-side hooks feeding counters (None while metrics are off).
        self.metrics_hooks: MetricsHooks | None = None

    @classmethod
    def from_globals(cls) -> Telemetry | None:
        """A Telemetry over the global providers if the application set either, else None
        (what a ParallelConsumer made without ``telemetry=`` uses)."""
        if _is_set(metrics.get_meter_provider()) or _is_set(trace.get_tracer_provider()):
            return cls()
        return None

    @property
    def metrics_enabled(self) -> bool:
        return self.meter_provider is not None

    @property
    def tracing_enabled(self) -> bool:
        return self.tracer_provider is not None

    # -- called by ParallelConsumer --------------------------------------------------------------

    def attach(
        self,
        hooks: Hooks | None,
        *,
        group: str,
        statistics: Callable[[], Statistics],
        max_metadata_bytes: int,
        health: Callable[[], Any] | None = None,
    ) -> Hooks | None:
        """Bind to one consumer: register the gauges over ``statistics`` (and ``health``, once
        the consumer has one) and return the hooks to install (``hooks`` combined with the
        metrics hooks)."""
        if self._group is not None:
            raise ConfigurationError(
                f"{self!r} already serves a ParallelConsumer (group {self._group!r}); give "
                "each ParallelConsumer its own Telemetry (they may share the providers)"
            )
        self._group = group
        if self.meter_provider is None:
            return hooks
        meter = self.meter_provider.get_meter(INSTRUMENTATION)
        base = {"pcinstance": self.instance, "group": group}
        self._snapshots = register_gauges(
            meter, statistics, base=base, max_metadata_bytes=max_metadata_bytes, health=health
        )
        self.metrics_hooks = MetricsHooks(
            meter,
            base=base,
            slow_after=self.slow_after,
            sample_interval=self.histogram_sample_interval,
        )
        return combine_hooks(hooks, self.metrics_hooks)

    def sampling(self) -> CallSampling | None:
        """The engine's sample of handler calls for the histograms and ``pc.slow.records``
        (None while metrics are off or before :meth:`attach`)."""
        return None if self.metrics_hooks is None else self.metrics_hooks.sampling()

    def wrap(self, handler: Any, *, is_async: bool, produces: bool) -> Any:
        """The handler to run: ``handler`` itself while tracing is off, else a picklable
        wrapper that runs each call under its records' spans."""
        if self.tracer_provider is None:
            return handler
        kind = AsyncTracedHandler if is_async else TracedHandler
        self._traced = kind(
            handler,
            group=self._group or "",
            produces=produces,
            tracer_provider=self.tracer_provider,
        )
        return self._traced

    def closed(self) -> None:
        """The consumer closed: gauges stop reporting (instruments cannot be removed through
        the API; their callbacks return nothing from now on)."""
        for snapshots in self._snapshots:
            snapshots.close()

    # -- seams for the dead-letter writer -----------------------------------------------------

    def trace_id(self, record: RecordContext) -> str | None:
        """The trace id for ``record``'s dead-letter header ``pc.dlq.trace.id``: the trace its
        processing spans belong to (None while tracing is off or nothing is known)."""
        if self._traced is None:
            return None
        return self._traced.trace_id(record)

    def __repr__(self) -> str:
        on = [
            name
            for name, enabled in (
                ("metrics", self.metrics_enabled),
                ("tracing", self.tracing_enabled),
            )
            if enabled
        ]
        return f"<Telemetry {self.instance} {'+'.join(on) or 'off'}>"
