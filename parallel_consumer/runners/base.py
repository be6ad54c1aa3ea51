"""The one interface between the controller and whatever runs user code.

A runner receives batches (a batch id plus the PollContext built for its records) and reports
each finished call as a :class:`~parallel_consumer._events.WorkDone` through the ``done``
callback it was started with: one outcome per record, and the handler's return value (for an
``async def`` handler, the awaited value). It owns nothing but the user call: no work state, no
Kafka client, no WorkItem. The thread, asyncio and process runners (and later Spark) plug in
here without the controller knowing which it drives.

The contract every runner keeps:

- every call that *started* reports exactly one ``WorkDone``, whatever happens to it (it
  returned, raised, was cancelled, or its worker process died: then it reports a failure, so
  the controller retries the records and none is lost);
- a call taken back by :meth:`Runner.cancel_queued` or dropped by :meth:`Runner.stop` before it
  started never starts and never reports.

Optional capabilities are declared once, as a frozen :class:`RunnerFeatures` value (the
``features`` property): each names the runner itself as a typed sub-protocol, or None. The
controller reads it once at start; it never probes a runner for methods. The thread runner has
them all (see docs/performance.md): :class:`ChunkRunner` (adaptive dispatch: ``submit_chunk``,
``release_stuck`` and ``take_finished``, the finished calls of a chunk reported early for a
revoke's final commit), :class:`RunRunner` (runs of very short calls), :class:`ChainRunner`
(a lane's next records on the worker of the record before them, whose calls not started come
back in ``WorkDoneMany.unstarted``), :class:`ManyRunner` (single calls of one dispatch pass
handed over at once, in order; the asyncio runner has it) and ``running`` (whether a call has
started).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

from parallel_consumer._events import CallResult, RunnerReport, WorkDoneMany
from parallel_consumer.context import PollContext
from parallel_consumer.errors import ParallelConsumerError
from parallel_consumer.work.runs import Run

__all__ = [
    "NO_FEATURES",
    "CallCancelled",
    "ChainRunner",
    "ChunkRunner",
    "Handler",
    "HandlerKind",
    "ManyRunner",
    "RunRunner",
    "Runner",
    "RunnerFeatures",
    "check_signature",
    "handler_kind",
    "not_a_result",
]

#: A plain function for the thread and process runners; an ``async def`` function (returning an
#: awaitable) for the asyncio runner.
Handler = Callable[[PollContext], object]

#: What calling a handler gives: a result ("plain"), a coroutine to await ("async"), or an
#: async generator ("async-generator"), which is no valid handler.
HandlerKind = Literal["plain", "async", "async-generator"]

#: How far :func:`handler_kind` follows wrappers (a guard against objects that answer any
#: attribute, such as mocks, whose ``__wrapped__`` chain never ends).
_MAX_UNWRAP = 100


class CallCancelled(ParallelConsumerError):
    """A handler call was cancelled before it could finish (``Runner.cancel``, or a close that
    ran out of time); its records count as failed and are retried."""


class Runner(Protocol):
    #: How many handler calls may run at once.
    capacity: int
    #: How many more calls may wait inside the runner for a free worker. A small backlog lets a
    #: worker that finishes start its next call at once instead of waiting for the controller's
    #: answer to its result (a thread round trip per call); it does not raise ``capacity``.
    backlog: int

    def start(self, handler: Handler, done: Callable[[RunnerReport], None]) -> None:
        """Start workers that call ``handler`` and report through ``done``. Raises
        :class:`~parallel_consumer.errors.ConfigurationError` when the runner cannot run
        ``handler`` (nothing is left running then)."""
        ...

    def submit(self, batch: int, context: PollContext) -> None:
        """Run one handler call. Never blocks; the controller respects ``capacity + backlog``."""
        ...

    def cancel_queued(self) -> list[int]:
        """Take back every submitted call that has not started; returns their batch ids.
        They are never started and never reported."""
        ...

    def cancel(self, batch: int, error: BaseException | None = None) -> None:
        """Ask for call ``batch`` to end early. If the runner can interrupt it (the asyncio
        runner cancels its task; the process runner terminates and replaces the worker process
        running it; a call not started yet is dropped), the call reports ``error`` (default
        :class:`CallCancelled`; a terminated worker's calls report ``WorkerCrashed``) as the
        failure of each of its records. A no-op where the runner cannot interrupt a running
        call (a thread) and for a call that has already ended. Thread-safe; never blocks."""
        ...

    def stop(self, timeout: float) -> bool:
        """From now on no call starts (queued ones never will and are not reported); wait up to
        ``timeout`` for running calls, then stop (a runner that can, cancels what is still
        running; such calls report :class:`CallCancelled`). False if some did not end in
        time."""
        ...

    @property
    def features(self) -> RunnerFeatures:
        """What the runner can do beyond single calls (decided once, read once at start)."""
        ...


#: A handler call: its batch id and the context of its records.
Call = tuple[int, PollContext]


class ChunkRunner(Protocol):
    """Runs chunks: calls one after another on one worker, reported together."""

    def submit_chunk(self, calls: list[Call]) -> None: ...

    def release_stuck(self, older_than: float, report: Callable[[WorkDoneMany], None]) -> int:
        """Hand the calls not started of chunks running for longer than ``older_than`` to
        other workers; report their finished calls through ``report``. How many moved."""
        ...

    def take_finished(self, first: int) -> list[CallResult]:
        """The finished, unreported calls of chunk ``first`` (the id of its first call)."""
        ...


class RunRunner(Protocol):
    """Runs runs (work/runs.py): a partition's records in offset order on one worker."""

    def submit_run(self, run: Run) -> None: ...


class ChainRunner(Protocol):
    """Runs chains: a lane's records one after another, each once the one before succeeded."""

    def submit_chain(self, calls: list[Call]) -> None: ...

    def take_back_chain(self, chain: int) -> tuple[list[CallResult], list[int]]: ...


class ManyRunner(Protocol):
    """Takes the single calls of one dispatch pass at once, in order."""

    def submit_many(self, calls: Iterable[Call]) -> None: ...


@dataclass(frozen=True, slots=True)
class RunnerFeatures:
    """A runner's capabilities beyond :class:`Runner`, each the runner as a typed view (or
    None): decided once by the runner, read once by the controller at start."""

    chunks: ChunkRunner | None = None
    runs: RunRunner | None = None
    chains: ChainRunner | None = None
    many: ManyRunner | None = None
    #: Whether call ``batch`` has started (on_stall=DEAD_LETTER leaves alone a call that waits
    #: for a worker); None: the runner cannot tell.
    running: Callable[[int], bool] | None = None


#: A runner with no capability beyond single calls.
NO_FEATURES = RunnerFeatures()


def handler_kind(handler: Callable[..., object]) -> HandlerKind:
    """Whether ``handler`` is an ``async def`` function, found through what usually hides one:
    a ``functools.partial``, a bound method, an object whose ``__call__`` is ``async def``, and a
    synchronous decorator that kept ``__wrapped__`` (``functools.wraps``), as logging, metrics
    and tracing decorators do. Such a wrapper returns the coroutine of the function it wraps, so
    the handler must be awaited: run as a plain function, its body would never run while its
    records commit."""
    for candidate in _unwrapped(handler):
        if inspect.isasyncgenfunction(candidate):
            return "async-generator"
        if inspect.iscoroutinefunction(candidate):
            return "async"
    return "plain"


def check_signature(handler: Callable[..., object], via: str) -> None:
    """Raise :class:`TypeError` unless ``handler`` can be called with one positional argument,
    the context, and nothing else required: a wrong handler fails every record, so it is
    refused when it is registered. Callables whose signature Python cannot read pass."""
    try:
        signature = inspect.signature(handler, follow_wrapped=False)  # (what really runs)
    except (TypeError, ValueError):  # some builtins and C callables have none to read
        return
    try:
        signature.bind(None)
    except TypeError as exc:
        raise TypeError(
            f"{via}() needs a handler that takes one argument, the context "
            f"(def handle(ctx: PollContext) -> ...); {handler!r} has the signature "
            f"{signature} ({exc})"
        ) from None


def _unwrapped(handler: object) -> Iterator[object]:
    """``handler``, then each callable it wraps, outermost first."""
    current: object = handler
    for _ in range(_MAX_UNWRAP):
        yield current
        if isinstance(current, functools.partial):
            current = current.func
        elif isinstance(current, types.MethodType):
            current = current.__func__
        elif (wrapped := getattr(current, "__wrapped__", None)) is not None:
            current = wrapped
        elif not inspect.isroutine(current) and not isinstance(current, type):
            # A callable object: what runs is its __call__ (looked up on the type, like a call).
            call = getattr(type(current), "__call__", None)  # noqa: B004 - the method itself
            if call is None:
                return
            current = call
        else:
            return


def not_a_result(value: object) -> TypeError | None:
    """The error for a call that returned a coroutine or an async generator, which no runner
    can take as its result: an async handler :func:`handler_kind` could not see (a lambda or a
    wrapper without ``__wrapped__`` around an ``async def``) on the thread runner, or an async
    generator. Its body never ran, so the call must fail rather than commit its records. A
    coroutine is closed here, so it does not warn that it was never awaited."""
    if inspect.iscoroutine(value):
        value.close()
        what = "a coroutine: it is async and must run on the asyncio runner"
    elif inspect.isasyncgen(value):
        what = "an async generator (an async def containing 'yield'): remove the yield"
    else:
        return None
    return TypeError(
        f"the handler returned {what}; its body never ran. Register the async def function "
        "itself (or keep functools.wraps on a decorator around it), so the asyncio runner "
        "awaits it"
    )
