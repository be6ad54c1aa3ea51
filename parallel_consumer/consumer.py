"""ParallelConsumer: the facade users hold. It wires the parts and relays requests to them.

It owns no work state: every call is a message to the controller thread (or, before start, a
check of the configuration). Only this module constructs components.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import time
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from parallel_consumer._aio import AsyncParallelConsumer, CloseSeam, refuse_blocking_on
from parallel_consumer._clock import Clock, SystemClock
from parallel_consumer._signals import StopSignals, closing_on_signals
from parallel_consumer._telemetry_choice import chosen_telemetry
from parallel_consumer.client_config import checked_consumer_config, checked_producer_config
from parallel_consumer.context import PollContext
from parallel_consumer.engine.closing import (
    FINAL_COMMIT_TIMEOUT,
    STOP_TIMEOUT,
    checked_close_timeout,
)
from parallel_consumer.engine.controller import Controller
from parallel_consumer.engine.letters import DeadLetters
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.health import HealthReport
from parallel_consumer.hooks import Hooks, guarded
from parallel_consumer.kafka.committers import (
    Committer,
    ConsumerCommitter,
    ShareCommitter,
    TransactionalCommitter,
)
from parallel_consumer.kafka.dead_letter_topics import dead_letter_topics, prepare_topics
from parallel_consumer.kafka.poller import Poller, RebalanceCallback
from parallel_consumer.kafka.pollers import make_poller
from parallel_consumer.kafka.producer import Outputs, start_outputs
from parallel_consumer.kafka.share.poller import SharePoller
from parallel_consumer.kafka.share.settings import check_share_group, read_settings
from parallel_consumer.options import Options, RunnerKind
from parallel_consumer.produce import ProduceResult
from parallel_consumer.runners.asyncio_loop import AsyncioRunner
from parallel_consumer.runners.base import Runner, check_signature
from parallel_consumer.runners.choice import make_runner, runner_kind_for
from parallel_consumer.runners.processes import pickled_handler
from parallel_consumer.serialization import Codecs, deserializing
from parallel_consumer.status import Lifecycle, Statistics

if TYPE_CHECKING:
    from parallel_consumer.telemetry import Telemetry

__all__ = ["ParallelConsumer"]

log = logging.getLogger("parallel_consumer")

F = TypeVar("F", bound=Callable[[PollContext], object])
OnProduced = Callable[[ProduceResult], object]

_instances = itertools.count(1)
_REQUEST_TIMEOUT = 10.0


class ParallelConsumer:
    """Consume Kafka records with far more concurrency than partitions.

    ``consumer_config`` is a confluent-kafka (librdkafka) consumer configuration; ``group.id``
    and ``bootstrap.servers`` are required and auto-commit must stay off. ``producer_config``
    configures the producer that :meth:`poll_and_produce` outputs go through (by default the
    consumer's ``bootstrap.servers``, idempotent); in the transactional commit mode it must
    hold a ``transactional.id`` prefix. ``hooks`` receives engine events for metrics and
    tracing (see :class:`~parallel_consumer.hooks.Hooks`). OpenTelemetry metrics and tracing go
    to the global providers when the application set them; ``telemetry`` takes a
    :class:`~parallel_consumer.telemetry.Telemetry` with explicit ones, or False for none.
    ``clock``, ``consumer_factory`` and ``producer_factory`` are for tests (see
    :mod:`parallel_consumer.testing`), as is ``admin_factory`` (the admin client that checks or
    creates dead-letter topics).
    """

    def __init__(
        self,
        consumer_config: Mapping[str, Any],
        options: Options | None = None,
        *,
        producer_config: Mapping[str, Any] | None = None,
        hooks: Hooks | None = None,
        telemetry: Telemetry | Literal[False] | None = None,
        clock: Clock | None = None,
        consumer_factory: Callable[[dict[str, Any]], Any] | None = None,
        producer_factory: Callable[[dict[str, Any]], Any] | None = None,
        admin_factory: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        if options is None:
            options = Options()
        elif not isinstance(options, Options):
            raise ConfigurationError(f"options must be an Options instance, got {options!r}")
        if producer_config is not None and not isinstance(producer_config, Mapping):
            raise ConfigurationError("producer_config must be a dict of librdkafka settings")
        config = checked_consumer_config(consumer_config)
        telemetry = chosen_telemetry(telemetry)
        self._telemetry = telemetry
        if telemetry is not None:
            hooks = telemetry.attach(
                hooks,
                group=config["group.id"],
                statistics=self.statistics,
                max_metadata_bytes=options.max_metadata_bytes,
                health=self.health,
            )
        safe_hooks = guarded(hooks)
        self._hooks = safe_hooks
        self._options = options
        self._producer_config = checked_producer_config(producer_config, config, options)
        self._producer_factory = producer_factory or Producer
        self._admin_factory = admin_factory or AdminClient
        self._group = str(config["group.id"])
        self._topics: list[str] = []
        self._name = f"{options.name}-{next(_instances)}"
        self._clock = clock or SystemClock()
        self._subscribed = False
        self._handler: Callable[[PollContext], object] | None = None
        self._consumer_config = config
        #: The application's loop, once ``async with`` bound the consumer to it, and the
        #: asyncio runner on it (for async def handlers).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_runner: AsyncioRunner | None = None
        self._face: AsyncParallelConsumer | None = None
        try:
            self._poller: Poller | SharePoller = make_poller(
                options,
                config,
                post=self._post,
                name=self._name,
                consumer_factory=consumer_factory,
                producer_factory=self._producer_factory,
                admin_factory=self._admin_factory,
            )
        except KafkaException as exc:
            raise ConfigurationError(f"invalid consumer_config: {exc}") from exc
        committer: Committer = (
            TransactionalCommitter(self._poller)
            if options.transactional
            else ShareCommitter(self._poller, options.commit_mode)
            if options.share_group
            else ConsumerCommitter(self._poller, options.commit_mode)
        )
        self._controller = Controller(
            options,
            name=self._name,
            runner=self._make_runner(options.runner or RunnerKind.THREADS),
            poller=self._poller,
            committer=committer,
            clock=self._clock,
            hooks=safe_hooks,
            sampling=telemetry.sampling() if telemetry is not None else None,
        )

    def _make_runner(self, kind: RunnerKind) -> Runner:
        return make_runner(
            kind, self._options, self._clock, name=self._name, hooks=self._hooks, loop=self._loop
        )

    def _post(self, event: Any) -> None:
        self._controller.post(event)

    # -- set-up -------------------------------------------------------------------------------

    def subscribe(
        self,
        topics: str | list[str] | tuple[str, ...],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
    ) -> None:
        """Subscribe to topics (a name, a list of names, or a ``^regex``) before :meth:`poll`.

        ``on_assign(consumer, partitions)`` / ``on_revoke(consumer, partitions)`` run after this
        library's own handling (``on_revoke`` also for lost partitions), on the poller thread.
        """
        if self.lifecycle is not Lifecycle.NEW:
            raise ConfigurationError("subscribe() must be called before processing starts")
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ConfigurationError(f"subscribe() needs topic names or a '^regex', got {topics!r}")
        for callback in (on_assign, on_revoke):
            if callback is not None and not callable(callback):
                raise ConfigurationError(f"rebalance callbacks must be callable, got {callback!r}")
        self._poller.subscribe(names, on_assign, on_revoke)
        self._subscribed = True
        self._topics = names

    def poll(self, handler: F) -> F:
        """Register ``handler`` and start processing in the background; returns ``handler``.

        Use as a decorator. The handler receives a :class:`PollContext`; returning normally marks
        its records done, raising retries them (``Retry(delay=...)`` picks the delay). An
        ``async def`` handler runs on the asyncio runner (see :class:`RunnerKind`).
        """
        if self._options.transactional:
            raise ConfigurationError(
                "CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER commits offsets with the outputs of "
                "poll_and_produce; register the handler with poll_and_produce, or choose a "
                "consumer commit mode"
            )
        self._register("poll", handler, None)
        return handler

    @overload
    def poll_and_produce(self, handler: F, *, on_produced: OnProduced | None = None) -> F: ...

    @overload
    def poll_and_produce(
        self, handler: None = None, *, on_produced: OnProduced | None = None
    ) -> Callable[[F], F]: ...

    def poll_and_produce(
        self, handler: F | None = None, *, on_produced: OnProduced | None = None
    ) -> F | Callable[[F], F]:
        """Register a handler whose return values are produced, and start processing.

        Use as ``@pc.poll_and_produce`` or ``@pc.poll_and_produce(on_produced=...)``. The
        handler returns a :class:`~parallel_consumer.ProducerRecord`, a list of them, or
        ``None``. Its records count as done only once the broker acknowledged every output; an
        output that is not delivered fails them (:class:`~parallel_consumer.ProduceError`) and
        they are retried. ``on_produced(result)`` runs for each acknowledged output, on the
        engine's controller thread: keep it short. Under
        ``CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER`` outputs and input offsets commit
        atomically (exactly-once, see docs/exactly-once.md).
        """
        if handler is None:

            def register(function: F) -> F:
                return self.poll_and_produce(function, on_produced=on_produced)

            return register
        if on_produced is not None and not callable(on_produced):
            raise ConfigurationError(f"on_produced must be callable, got {on_produced!r}")
        self._register("poll_and_produce", handler, on_produced)
        return handler

    def _register(
        self, via: str, handler: Callable[[PollContext], object], on_produced: OnProduced | None
    ) -> None:
        if not callable(handler):
            raise ConfigurationError(f"{via}() needs a callable handler, got {handler!r}")
        check_signature(handler, via)
        if self.lifecycle in (Lifecycle.CLOSING, Lifecycle.CLOSED):
            raise ConfigurationError(
                f"{via}() on a closed ParallelConsumer: it cannot start again; make a new one"
            )
        if self._handler is not None:
            raise ConfigurationError(
                f"a handler is already registered ({self._handler!r}); one ParallelConsumer "
                "runs one handler"
            )
        if not self._subscribed:
            raise ConfigurationError(f"call subscribe() before registering a handler with {via}()")
        if self.lifecycle is not Lifecycle.NEW:
            raise ConfigurationError(f"cannot register a handler when {self.lifecycle.name}")
        kind = runner_kind_for(handler, self._options)
        runner = None
        if kind is not (self._options.runner or RunnerKind.THREADS) or self._loop is not None:
            # An async def handler picked the asyncio runner, or `async with` bound the
            # consumer to the caller's loop.
            runner = self._make_runner(kind)
            if isinstance(runner, AsyncioRunner) and self._loop is not None:
                self._loop_runner = runner
        outputs = None
        dead_letters = None
        if self._options.share_group:
            # Before anything starts: a broker without share groups, a deadline beyond the
            # acquisition lock, more retries than the broker delivers (kafka/share/settings.py).
            check_share_group(
                self._options, read_settings(self._admin_factory, self._consumer_config)
            )
        if self._options.dead_lettering:
            # Before anything starts: a missing dead-letter topic is a configuration error.
            topics = dead_letter_topics(self._options, self._topics)
            prepare_topics(self._admin_factory, self._producer_config, topics)
            trace_id = self._telemetry.trace_id if self._telemetry is not None else None
            dead_letters = DeadLetters(self._options, self._group, trace_id)
        produces = via == "poll_and_produce"
        if produces or dead_letters is not None:
            outputs = self._start_outputs()  # dead letters go through the library's producer
        codecs = Codecs.of(self._options, produces=produces)
        call = deserializing(handler, codecs, is_async=kind is RunnerKind.ASYNCIO)
        if kind is RunnerKind.PROCESS and call is not handler:
            pickled_handler(call)  # the (de)serializers go to the worker processes too
        if self._telemetry is not None:
            call = self._telemetry.wrap(
                call, is_async=kind is RunnerKind.ASYNCIO, produces=produces
            )
        self._controller.start(
            call,
            runner=runner,
            outputs=outputs,
            on_produced=on_produced,
            produces=produces,
            dead_letters=dead_letters,
        )
        self._handler = handler
        self._poller.start()

    def _start_outputs(self) -> Outputs:
        outputs = start_outputs(
            self._producer_factory,
            self._producer_config,
            post=self._post,
            transactional=self._options.transactional,
            name=self._name,
        )
        if self._options.transactional:
            self._poller.run_transactions(outputs)
        return outputs

    # -- running ------------------------------------------------------------------------------

    @property
    def lifecycle(self) -> Lifecycle:
        return self._controller.lifecycle

    @property
    def failure(self) -> BaseException | None:
        """The internal failure that stopped processing, if any."""
        return self._controller.failure

    def wait(self, timeout: float | None = None) -> bool:
        """Block until processing has stopped; re-raise the failure if it failed.

        Returns False if ``timeout`` passed first, True once stopped.
        """
        refuse_blocking_on(self._loop, "wait")
        try:
            self._controller.stopped.result(timeout)
        except FutureTimeout:
            return False
        return True

    def pause(self) -> None:
        """Stop dispatching and fetching; in-flight calls finish and commits go on."""
        self._ask("pause")

    def resume(self) -> None:
        self._ask("resume")

    def statistics(self) -> Statistics:
        """A consistent snapshot of counters, queues and partitions (see :class:`Statistics`)."""
        answer = self._ask("statistics")
        if answer is None:  # not running: the controller thread is not there to ask
            return self._controller.statistics()
        result: Statistics = answer
        return result

    def health(self) -> HealthReport:
        """Whether the consumer is alive and making progress: per-partition progress, stalled
        partitions and the reasons (see :class:`~parallel_consumer.health.HealthReport` and
        docs/health.md). Thread-safe and cheap; meant for liveness probes."""
        answer = self._ask("health")
        if answer is None:  # not running: the controller thread is not there to ask
            return self._controller.health()
        result: HealthReport = answer
        return result

    def _ask(self, action: str) -> Any:
        """Ask the controller thread; None if it is not running (or stops before answering)."""
        if self.lifecycle in (Lifecycle.NEW, Lifecycle.CLOSED):
            return None
        reply = self._controller.request(action)
        stopped = self._controller.stopped
        deadline = time.monotonic() + _REQUEST_TIMEOUT
        while time.monotonic() < deadline:
            try:
                return reply.result(0.05)
            except FutureTimeout:
                if stopped.done() and not reply.done():
                    return None  # it stopped before it could answer: it never will
        raise TimeoutError(f"the controller did not answer {action}() within 10s")

    def close(self, drain: bool = False, timeout: float | None = None) -> None:
        """Stop processing, commit what finished, close the Kafka client; re-raise a failure.

        By default no call starts any more, calls in flight may finish within ``timeout``
        (default ``Options.shutdown_timeout``, 30 s), what finished is committed and the
        consumer leaves its group; records not started are processed again by the partitions'
        next owner. ``drain=True`` first runs every buffered record (and retry) within
        ``timeout``. The final commit and closing the client take up to ~10 s more.

        An interrupt (Ctrl-C) while waiting closes fast instead of raising: calls still running
        are abandoned (processed again later) and what finished is committed.
        """
        timeout = self._close_timeout(timeout)
        if self.lifecycle is Lifecycle.NEW:
            self._close_unstarted()
            return
        refuse_blocking_on(self._loop, "close")
        self._request_close(drain=drain, timeout=timeout)
        grace = timeout + FINAL_COMMIT_TIMEOUT + STOP_TIMEOUT + 5.0
        try:
            try:
                stopped = self.wait(grace)
            except KeyboardInterrupt:
                log.warning(
                    "interrupted while closing: closing now (calls still running are not "
                    "committed and will be processed again; what finished is committed)"
                )
                self._request_close(drain=False, timeout=0.0)
                stopped = self.wait(FINAL_COMMIT_TIMEOUT + STOP_TIMEOUT + 5.0)
            if not stopped:
                raise TimeoutError(f"ParallelConsumer did not close within {grace:.0f}s")
        finally:
            self._closed()

    def run(
        self, *, drain: bool = False, timeout: float | None = None, handle_signals: bool = True
    ) -> None:
        """Process records until stopped, then close: the main loop of a service.

        Blocks while the registered handler processes records. Called from the main thread
        (and unless ``handle_signals=False``), it handles SIGTERM and SIGINT while it runs:
        the first one closes gracefully, as :meth:`close` does with the same ``drain`` and
        ``timeout`` (no new call starts, calls in flight may finish, what finished is
        committed, the consumer leaves its group); a second one closes fast (calls still
        running are abandoned and processed again later; what finished is committed). The
        previous handlers are restored when it returns. Another thread may end it with
        :meth:`close`. Returns once closed; raises the failure that stopped processing, if any.
        Applications that own their signals call :meth:`close` from their own handler
        instead (docs/lifecycle.md).
        """
        if self._handler is None:
            raise RuntimeError(
                "run() needs a handler: register one with @pc.poll or @pc.poll_and_produce "
                "(after subscribe()) first"
            )
        refuse_blocking_on(self._loop, "run")
        close_timeout = self._close_timeout(timeout)

        on_signal = closing_on_signals(self._request_close, drain, close_timeout)
        interrupts = 0
        try:
            with StopSignals(on_signal, install=handle_signals):
                while True:
                    try:
                        if self.wait(0.5):
                            break
                    except KeyboardInterrupt:
                        # (no handler of ours: handle_signals=False, or another thread's
                        # signal set-up) Ctrl-C closes as the signals above do.
                        interrupts += 1
                        on_signal(signal.SIGINT, interrupts)
        finally:
            self._closed()

    def _close_timeout(self, timeout: float | None) -> float:
        return checked_close_timeout(timeout, self._options.shutdown_timeout)

    def _close_unstarted(self) -> None:
        self._poller.close_unstarted()
        self._controller.lifecycle = Lifecycle.CLOSED
        self._controller.stopped.set_result(None)

    def _request_close(self, drain: bool, timeout: float) -> None:
        """Ask the controller to close (or to close sooner, if closing already): never blocks,
        so a signal handler may call it."""
        if self.lifecycle is not Lifecycle.CLOSED:
            self._controller.request("close", drain=drain, timeout=timeout)

    def _closed(self) -> None:
        if self._telemetry is not None:
            self._telemetry.closed()  # its gauges stop reporting, even after a failure

    def __enter__(self) -> ParallelConsumer:
        return self

    async def __aenter__(self) -> AsyncParallelConsumer:
        """Bind the consumer to the running event loop: ``async def`` handlers registered from
        now on run there (docs/async-handlers.md). Must come before the handler."""
        loop = asyncio.get_running_loop()
        if self.lifecycle is not Lifecycle.NEW or self._handler is not None:
            raise ConfigurationError(
                "enter `async with ParallelConsumer(...)` before registering the handler: its "
                "async def handler then runs on this event loop"
            )
        if self._loop is not None and self._loop is not loop:
            raise ConfigurationError("this ParallelConsumer is bound to another event loop")
        self._loop = loop

        seam = CloseSeam(
            self._request_close,
            self._close_timeout,
            self._controller.stopped,
            lambda: self._loop_runner,
            self._close_unstarted,
            self._closed,
        )
        self._face = AsyncParallelConsumer(self, seam, loop)
        return self._face

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._face is not None
        await self._face.close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<ParallelConsumer {self._name} {self.lifecycle.name} "
            f"{self._options.ordering.name} max_concurrency={self._options.max_concurrency}>"
        )
