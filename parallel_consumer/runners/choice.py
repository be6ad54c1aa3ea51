"""Which runner a handler needs, and making it: the one place that maps a handler and
``Options.runner`` to a runner."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from parallel_consumer._clock import Clock
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.hooks import Hooks
from parallel_consumer.options import Options, RunnerKind
from parallel_consumer.runners.asyncio_loop import AsyncioRunner
from parallel_consumer.runners.base import Runner, handler_kind
from parallel_consumer.runners.processes import ProcessRunner, pickled_handler
from parallel_consumer.runners.threads import ThreadRunner

__all__ = ["make_runner", "runner_kind_for"]


def make_runner(
    kind: RunnerKind,
    options: Options,
    clock: Clock,
    *,
    name: str,
    hooks: Hooks,
    loop: asyncio.AbstractEventLoop | None = None,
) -> Runner:
    """The runner of ``kind``; an asyncio runner runs on ``loop`` (the caller's, bound by
    ``async with``) if given, else on a private loop in its own thread."""
    if kind is RunnerKind.ASYNCIO:
        return AsyncioRunner(
            options.max_concurrency,
            clock,
            name=name,
            hooks=hooks,
            loop_factory=options.loop_factory,
            loop=loop,
        )
    if kind is RunnerKind.PROCESS:
        assert options.processes is not None
        return ProcessRunner(
            options.processes,
            clock,
            name=name,
            hooks=hooks,
            call_timeout=options.processing_timeout,
        )
    return ThreadRunner(options.max_concurrency, clock, name=name, hooks=hooks)


def runner_kind_for(handler: Callable[..., object], options: Options) -> RunnerKind:
    """The runner ``handler`` needs, or a ConfigurationError if ``Options.runner`` says
    otherwise."""
    found = handler_kind(handler)
    if found == "async-generator":
        raise ConfigurationError(
            f"{handler!r} is an async generator function (an async def containing "
            "'yield'): calling it runs nothing until it is iterated, so its records would "
            "never be processed. A handler returns (or, async def, awaits and returns) "
            "its result: remove the yield"
        )
    is_async = found == "async"
    kind = options.runner
    if not is_async and options.loop_factory is not None:
        raise ConfigurationError(
            f"Options.loop_factory is set, but {handler!r} is a plain function: it runs on "
            "worker threads, not on an event loop. Make the handler async def, or remove "
            "loop_factory"
        )
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
