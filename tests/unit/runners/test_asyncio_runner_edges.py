"""The asyncio runner at the edges of a call's life: tasks that start eagerly or under a task
factory, cancels before a task's first step, handlers raising GeneratorExit, hooks that raise,
and calls still running when the loop ends. Each was a lost or a wrong report once."""

from __future__ import annotations

import asyncio
import collections.abc
import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aio_doubles import context, on_loop, settled, start

from parallel_consumer.context import PollContext
from parallel_consumer.hooks import NoHooks
from parallel_consumer.runners import AsyncioRunner, CallCancelled


@pytest.fixture
def runners() -> Iterator[list[AsyncioRunner]]:
    made: list[AsyncioRunner] = []
    yield made
    for runner in made:
        runner.stop(0.0)


def eager_loop() -> asyncio.AbstractEventLoop:
    """A loop whose tasks take their first step inside create_task: Python 3.12's
    eager_task_factory, or on 3.11 a task that does what its ``eager_start=True`` does."""
    loop = asyncio.new_event_loop()
    factory = getattr(asyncio, "eager_task_factory", None)
    if factory is not None:
        loop.set_task_factory(factory)
    else:
        loop.set_task_factory(lambda loop, coro, **kw: _EagerTask(coro, loop=loop))
    return loop


class _EagerTask(asyncio.tasks._PyTask):  # type: ignore[name-defined,misc]
    def __init__(self, coro: Any, *, loop: asyncio.AbstractEventLoop) -> None:
        handles: list[asyncio.Handle] = []
        call_soon = loop.call_soon

        def capture(callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
            handle = call_soon(callback, *args, context=context)
            handles.append(handle)
            return handle

        loop.call_soon = capture  # type: ignore[method-assign]
        try:
            super().__init__(coro, loop=loop)
        finally:
            del loop.call_soon
        handles[0].cancel()  # the first step, scheduled: taken now instead
        self._Task__step()


def test_calls_that_end_in_their_first_step_of_an_eager_task_are_reported(runners):
    # Given tasks that start eagerly and handlers that never suspend
    async def handle(ctx: PollContext) -> int:
        return ctx.offset

    results = start(runners, handle, capacity=2, loop_factory=eager_loop)
    runner = runners[-1]
    # When more calls than the capacity come
    for i in range(1, 6):
        runner.submit(i, context(i))
    # Then each is reported with its value (none is lost, and no slot leaks)
    assert {b: e.value for b, e in results.take(5, 3).items()} == {i: i for i in range(1, 6)}


class _Wrapped(collections.abc.Coroutine):  # type: ignore[type-arg]
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def send(self, value: Any) -> Any:
        return self._inner.send(value)

    def throw(self, *args: Any) -> Any:
        return self._inner.throw(*args)

    def close(self) -> None:
        self._inner.close()

    def __await__(self) -> Any:
        return self._inner.__await__()


def wrapping_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    loop.set_task_factory(lambda loop, coro, **kw: asyncio.Task(_Wrapped(coro), loop=loop, **kw))
    return loop


@pytest.mark.parametrize("factory", [None, wrapping_loop], ids=["plain", "wrapping-task-factory"])
def test_a_cancel_before_the_first_step_reports_the_latest_reason_once(runners, factory):
    # Given a loop blocked by call 1, and call 2 submitted behind it
    blocked = threading.Event()
    unblock = threading.Event()
    ran = []

    async def handle(ctx: PollContext) -> None:
        ran.append(ctx.offset)
        if ctx.offset == 1:
            blocked.set()
            # blocks the loop until the test has queued what follows behind it (a fixed
            # 0.3 s was not always enough for the test thread on a loaded machine)
            unblock.wait(10)
        await asyncio.sleep(10)

    results = start(runners, handle, capacity=5, loop_factory=factory)
    runner = runners[-1]
    runner.submit(1, context(1))
    assert blocked.wait(5)
    runner.submit(2, context(2))
    # When call 2 is cancelled twice after its task was made and before its first step, and the
    # running call 1 is cancelled twice too
    on_loop(runner, runner._cancel_task, 2, TimeoutError("first"))
    on_loop(runner, runner._cancel_task, 2, TimeoutError("second"))
    runner.cancel(1, TimeoutError("first"))
    runner.cancel(1, TimeoutError("second"))
    unblock.set()
    # Then each reports once, with the latest reason, and call 2 never ran
    done = results.take(2)
    assert str(done[1].errors[0]) == "second"
    assert str(done[2].errors[0]) == "second"
    assert settled(runner)
    assert results.empty()
    assert ran == [1]


def test_generator_exit_from_a_handler_is_its_failure_and_asyncio_logs_nothing(runners):
    async def handle(ctx: PollContext) -> None:
        raise GeneratorExit

    results = start(runners, handle)
    runner = runners[-1]
    errors: list[str] = []
    assert runner._loop is not None
    on_loop(runner, runner._loop.set_exception_handler, lambda loop, c: errors.append(c["message"]))
    runner.submit(1, context(1))
    assert isinstance(results.take(1)[1].errors[0], GeneratorExit)
    collected = threading.Event()
    on_loop(runner, lambda: (gc.collect(), collected.set()))
    assert collected.wait(2)
    assert settled(runner)
    assert errors == []


def test_a_hook_that_raises_when_a_call_starts_loses_no_report_of_calls_that_ended(runners):
    # (ParallelConsumer guards its hooks; a runner used alone may get hooks that raise)
    class Raising(NoHooks):
        def on_call_start(self, batch: int, context: PollContext) -> None:
            if batch == 3:
                raise RuntimeError("hook")

    async def handle(ctx: PollContext) -> None:
        await asyncio.sleep(0)

    results = start(runners, handle, capacity=1, hooks=Raising())
    runner = runners[-1]
    for i in (1, 2, 3):
        runner.submit(i, context(i))
    assert set(results.take(2, 2)) == {1, 2}


def test_a_call_that_ignores_its_cancellation_past_the_grace_is_reported_when_the_loop_ends(
    runners, monkeypatch
):
    from parallel_consumer.runners import asyncio_loop

    monkeypatch.setattr(asyncio_loop, "CANCEL_GRACE", 0.2)
    entered = threading.Event()

    async def handle(ctx: PollContext) -> None:
        entered.set()
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue  # ignores every cancellation

    results = start(runners, handle)
    runner = runners[-1]
    runner.submit(1, context(1))
    assert entered.wait(5)
    assert runner.stop(0.1) is False
    assert isinstance(results.take(1)[1].errors[0], CallCancelled)
