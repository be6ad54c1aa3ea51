"""What the asyncio runner's tests share: a record's context, the ``done`` callback that
collects results (``Results``, from ``collect``), and starting a runner (stopped by each
module's ``runners`` fixture)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from collect import Results
from confluent_kafka import Message

from parallel_consumer._clock import SystemClock
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.hooks import NoHooks
from parallel_consumer.runners import AsyncioRunner

__all__ = ["Results", "context", "start"]


def context(offset: int) -> PollContext:
    message = Message(topic="t", partition=0, offset=offset, key=b"k", value=b"v")
    return PollContext([RecordContext(message)])


def start(
    runners: list[AsyncioRunner],
    handler: object,
    capacity: int = 100,
    *,
    hooks: NoHooks | None = None,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> Results:
    """Start a runner of ``handler`` (it joins ``runners``, the last one) and collect its
    results."""
    results = Results()
    runner = AsyncioRunner(
        capacity, SystemClock(), name="test", hooks=hooks, loop_factory=loop_factory
    )
    runner.start(handler, results)  # type: ignore[arg-type]
    runners.append(runner)
    return results


def on_loop(runner: AsyncioRunner, fn: Callable[..., object], *args: object) -> None:
    """Run ``fn(*args)`` on the runner's loop thread, after what is already scheduled there."""
    assert runner._loop is not None
    runner._loop.call_soon_threadsafe(fn, *args)


def settled(runner: AsyncioRunner, passes: int = 3, timeout: float = 5.0) -> bool:
    """Wait until the runner's loop has run ``passes`` more passes: whatever the calls that
    ended before had scheduled (done callbacks, reports) has run by then. For checks that
    something did *not* happen, instead of sleeping for a while."""
    done = threading.Event()
    assert runner._loop is not None
    loop = runner._loop

    def step(left: int) -> None:
        if left:
            loop.call_soon(step, left - 1)
        else:
            done.set()

    loop.call_soon_threadsafe(step, passes)
    return done.wait(timeout)
