"""ParallelConsumer: the facade users hold. It wires the parts and relays requests to them.

It owns no work state: every call is a message to the controller thread (or, before start, a
check of the configuration). Only this module constructs components.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from types import TracebackType
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException

from parallel_consumer._clock import Clock, SystemClock
from parallel_consumer._closing import FINAL_COMMIT_TIMEOUT, STOP_TIMEOUT
from parallel_consumer._controller import Controller
from parallel_consumer._poller import Poller, RebalanceCallback
from parallel_consumer.commit import ConsumerCommitter
from parallel_consumer.context import PollContext
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.hooks import Hooks, guarded
from parallel_consumer.options import Options, RunnerKind
from parallel_consumer.runners.asyncio_loop import AsyncioRunner
from parallel_consumer.runners.base import Runner
from parallel_consumer.runners.processes import ProcessRunner, pickled_handler
from parallel_consumer.runners.threads import ThreadRunner
from parallel_consumer.status import Lifecycle, Statistics

__all__ = ["ParallelConsumer"]

log = logging.getLogger("parallel_consumer")

F = TypeVar("F", bound=Callable[[PollContext], object])

_instances = itertools.count(1)
_REQUEST_TIMEOUT = 10.0


def _checked_config(config: object) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise ConfigurationError(
            f"consumer_config must be a dict of librdkafka settings, got {type(config).__name__}"
        )
    result = dict(config)
    group = result.get("group.id")
    if not isinstance(group, str) or not group:
        raise ConfigurationError(
            "consumer_config needs 'group.id': committed offsets and offset maps belong to a "
            "consumer group"
        )
    if not result.get("bootstrap.servers"):
        raise ConfigurationError("consumer_config needs 'bootstrap.servers' (host:port[,...])")
    auto_commit = result.get("enable.auto.commit", False)
    if str(auto_commit).strip().lower() not in ("false", "0"):
        raise ConfigurationError(
            "consumer_config sets 'enable.auto.commit' to true: ParallelConsumer commits offsets "
            "itself (with the map of finished records), so remove it or set it to False"
        )
    if "on_commit" in result:
        raise ConfigurationError(
            "consumer_config sets 'on_commit': ParallelConsumer needs that callback to know "
            "when commits are acknowledged; read commit counts from statistics() instead"
        )
    result["enable.auto.commit"] = False
    return result


def _is_async(handler: Callable[..., object]) -> bool:
    """An ``async def`` function, a partial of one, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - the method, not callable()
    )


class ParallelConsumer:
    """Consume Kafka records with far more concurrency than partitions.

    ``consumer_config`` is a confluent-kafka (librdkafka) consumer configuration; ``group.id``
    and ``bootstrap.servers`` are required and auto-commit must stay off. ``producer_config`` is
    reserved for producing results (not available yet). ``hooks`` receives engine events for
    metrics and tracing (see :class:`~parallel_consumer.hooks.Hooks`). ``clock`` and
    ``consumer_factory`` are for tests (see :mod:`parallel_consumer.testing`).
    """

    def __init__(
        self,
        consumer_config: Mapping[str, Any],
        options: Options | None = None,
        *,
        producer_config: Mapping[str, Any] | None = None,
        hooks: Hooks | None = None,
        clock: Clock | None = None,
        consumer_factory: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        if options is None:
            options = Options()
        elif not isinstance(options, Options):
            raise ConfigurationError(f"options must be an Options instance, got {options!r}")
        if producer_config is not None and not isinstance(producer_config, Mapping):
            raise ConfigurationError("producer_config must be a dict of librdkafka settings")
        config = _checked_config(consumer_config)
        safe_hooks = guarded(hooks)
        self._hooks = safe_hooks
        self._options = options
        self._producer_config = None if producer_config is None else dict(producer_config)
        self._name = f"{options.name}-{next(_instances)}"
        self._clock = clock or SystemClock()
        self._subscribed = False
        self._handler: Callable[[PollContext], object] | None = None
        try:
            self._poller = Poller(
                consumer_factory or Consumer,
                config,
                post=self._post,
                limit=options.buffer_limit,
                fetch_batch=options.fetch_batch_size,
                name=self._name,
            )
        except KafkaException as exc:
            raise ConfigurationError(f"invalid consumer_config: {exc}") from exc
        self._controller = Controller(
            options,
            name=self._name,
            runner=self._make_runner(options.runner or RunnerKind.THREADS),
            poller=self._poller,
            committer=ConsumerCommitter(self._poller, options.commit_mode),
            clock=self._clock,
            hooks=safe_hooks,
        )

    def _make_runner(self, kind: RunnerKind) -> Runner:
        options = self._options
        if kind is RunnerKind.ASYNCIO:
            return AsyncioRunner(
                options.max_concurrency, self._clock, name=self._name, hooks=self._hooks
            )
        if kind is RunnerKind.PROCESS:
            assert options.processes is not None
            return ProcessRunner(options.processes, self._clock, name=self._name, hooks=self._hooks)
        return ThreadRunner(
            options.max_concurrency, self._clock, name=self._name, hooks=self._hooks
        )

    def _runner_kind_for(self, handler: Callable[..., object]) -> RunnerKind:
        """The runner ``handler`` needs, or a ConfigurationError if ``Options.runner`` says
        otherwise."""
        is_async = _is_async(handler)
        kind = self._options.runner
        if kind is None:
            return RunnerKind.ASYNCIO if is_async else RunnerKind.THREADS
        if is_async and kind is not RunnerKind.ASYNCIO:
            raise ConfigurationError(
                f"{handler!r} is an async def handler but Options.runner={kind.value!r}: "
                "async handlers run on the asyncio runner (leave Options.runner unset, or set "
                "runner='asyncio'), or make the handler a plain function"
            )
        if not is_async and kind is RunnerKind.ASYNCIO:
            raise ConfigurationError(
                f"Options.runner='asyncio' runs async def handlers, and {handler!r} is a plain "
                "function: on the event loop it would block every other call. Make it "
                "async def, or use runner='threads' (or 'process' for CPU-bound work)"
            )
        if kind is RunnerKind.PROCESS:
            pickled_handler(handler)
        return kind

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

    def poll(self, handler: F) -> F:
        """Register ``handler`` and start processing in the background; returns ``handler``.

        Use as a decorator. The handler receives a :class:`PollContext`; returning normally marks
        its records done, raising retries them (``Retry(delay=...)`` picks the delay). An
        ``async def`` handler runs on the asyncio runner (see :class:`RunnerKind`).
        """
        if not callable(handler):
            raise ConfigurationError(f"poll() needs a callable handler, got {handler!r}")
        if self._handler is not None:
            raise ConfigurationError(
                f"a handler is already registered ({self._handler!r}); one ParallelConsumer "
                "runs one handler"
            )
        if not self._subscribed:
            raise ConfigurationError("call subscribe() before registering a handler with poll()")
        if self.lifecycle is not Lifecycle.NEW:
            raise ConfigurationError(f"cannot register a handler when {self.lifecycle.name}")
        kind = self._runner_kind_for(handler)
        runner = None
        if kind is not (self._options.runner or RunnerKind.THREADS):
            runner = self._make_runner(kind)  # an async def handler picked the asyncio runner
        self._controller.start(handler, runner=runner)
        self._handler = handler
        self._poller.start()
        return handler

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

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop processing, commit what finished, close the Kafka client; re-raise a failure.

        ``drain=True`` first runs every buffered record (and retries); ``drain=False`` only lets
        in-flight calls finish. ``timeout`` (default ``Options.shutdown_timeout``, 30 s) bounds
        that wait; records not finished by then are left uncommitted and are processed again by
        the partition's next owner. The final commit and closing the client take up to ~10 s more.
        """
        if timeout is None:
            timeout = self._options.shutdown_timeout
        if self.lifecycle is Lifecycle.NEW:
            self._poller.close_unstarted()
            self._controller.lifecycle = Lifecycle.CLOSED
            self._controller.stopped.set_result(None)
            return
        if self.lifecycle is not Lifecycle.CLOSED:
            self._controller.request("close", drain=drain, timeout=timeout)
        grace = timeout + FINAL_COMMIT_TIMEOUT + STOP_TIMEOUT + 5.0
        if not self.wait(grace):
            raise TimeoutError(f"ParallelConsumer did not close within {grace:.0f}s")

    def __enter__(self) -> ParallelConsumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(drain=exc_type is None)

    def __repr__(self) -> str:
        return (
            f"<ParallelConsumer {self._name} {self.lifecycle.name} "
            f"{self._options.ordering.name} max_concurrency={self._options.max_concurrency}>"
        )
