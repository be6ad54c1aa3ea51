"""The asyncio runner on the caller's loop (``loop=``): calls run as tasks of the application's
loop, cross to it and back in batches, and stopping never blocks on that loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from aio_doubles import context
from collect import Results

from parallel_consumer._clock import SystemClock
from parallel_consumer.errors import ConfigurationError
from parallel_consumer.runners import AsyncioRunner, CallCancelled


class CountingLoop(asyncio.SelectorEventLoop):
    """A loop that counts the callbacks other threads hand it."""

    def __init__(self) -> None:
        super().__init__()
        self.threadsafe_calls = 0

    def call_soon_threadsafe(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(*args, **kwargs)


async def _until(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def _run(main) -> None:  # type: ignore[no-untyped-def]
    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        runner.run(main())


def test_calls_run_on_the_callers_loop_and_cross_in_batches():
    # Given a runner on the application's loop, and 2,000 calls submitted from another thread
    # in bursts of 500, as the controller's dispatch passes do
    total = 2000
    loops: set[int] = set()

    async def handle(ctx) -> int:  # type: ignore[no-untyped-def]
        loops.add(id(asyncio.get_running_loop()))
        await asyncio.sleep(0.01)
        return ctx.offset

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, CountingLoop)
        results = Results()
        runner = AsyncioRunner(total, SystemClock(), name="t", loop=loop)
        runner.start(handle, results)

        def controller() -> None:
            for first in range(0, total, 500):
                runner.submit_many((i, context(i)) for i in range(first, first + 500))

        thread = threading.Thread(target=controller)
        thread.start()
        await asyncio.to_thread(thread.join)
        # When they all end
        done = await asyncio.to_thread(results.take, total)
        # Then every call ran on the application's loop with its value
        assert loops == {id(loop)}
        assert {b: e.value for b, e in done.items()} == {i: i for i in range(total)}
        # And records went over in a few hops (one per burst at most), results in few reports
        assert loop.threadsafe_calls <= 4 + 2  # (+ asyncio.to_thread's own two hand-backs)
        assert results.events < total / 20
        runner.stop(0.0)
        await runner.ended()

    _run(main)


def test_stop_returns_at_once_while_the_loop_is_busy_and_ended_cancels_what_runs():
    # Given calls that never end on the application's loop
    finally_ran: list[int] = []

    async def handle(ctx) -> None:  # type: ignore[no-untyped-def]
        try:
            await asyncio.Event().wait()
        finally:
            finally_ran.append(ctx.offset)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        results = Results()
        runner = AsyncioRunner(10, SystemClock(), name="t", loop=loop)
        runner.start(handle, results)
        runner.submit_many((i, context(i)) for i in range(3))
        await _until(lambda: len(runner._running) == 3)
        # When another thread stops it while this loop is blocked (it cannot answer)
        returned = threading.Event()
        stopper = threading.Thread(target=lambda: (runner.stop(0.0), returned.set()))
        stopper.start()
        # Then stop() returned without the loop's help
        assert returned.wait(5.0)
        stopper.join()
        # And once awaited, every call was cancelled, ran its finally and reported CallCancelled
        await runner.ended()
        done = await asyncio.to_thread(results.take, 3)
        assert sorted(finally_ran) == [0, 1, 2]
        assert all(isinstance(e.errors[0], CallCancelled) for e in done.values())

    _run(main)


def test_stop_lets_running_calls_finish_within_its_timeout():
    # Given a call that takes 50 ms
    async def handle(ctx) -> str:  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.05)
        return "finished"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        results = Results()
        runner = AsyncioRunner(10, SystemClock(), name="t", loop=loop)
        runner.start(handle, results)
        runner.submit(7, context(7))
        await _until(lambda: runner._running)
        # When stopped with a timeout of 5 s
        await asyncio.to_thread(runner.stop, 5.0)
        await runner.ended()
        # Then the call finished and reported its value; a later submit never starts
        runner.submit(8, context(8))
        assert (await asyncio.to_thread(results.take, 1))[7].value == "finished"
        await asyncio.sleep(0.05)
        assert results.empty()

    _run(main)


def test_a_failing_call_fails_alone_and_the_loop_goes_on():
    # Given handlers of which one raises and one raises SystemExit
    async def handle(ctx):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        if ctx.offset == 1:
            raise ValueError("boom")
        if ctx.offset == 2:
            raise SystemExit(3)
        return ctx.offset

    async def main() -> None:
        loop = asyncio.get_running_loop()
        results = Results()
        runner = AsyncioRunner(10, SystemClock(), name="t", loop=loop)
        runner.start(handle, results)
        runner.submit_many((i, context(i)) for i in range(4))
        done = await asyncio.to_thread(results.take, 4)
        # Then those two calls fail with their exceptions, the others succeed
        assert isinstance(done[1].errors[0], ValueError)
        assert isinstance(done[2].errors[0], SystemExit)
        assert (done[0].value, done[3].value) == (0, 3)
        # And the application's loop still runs
        await asyncio.sleep(0)
        runner.stop(0.0)
        await runner.ended()

    _run(main)


def test_a_caller_loop_and_a_loop_factory_are_refused_together():
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ConfigurationError, match="loop_factory"):
            AsyncioRunner(1, SystemClock(), loop=loop, loop_factory=asyncio.new_event_loop)
    finally:
        loop.close()
