"""async def handlers through the whole engine on the fakes: runner selection, concurrency,
order, failures and close."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import time
from collections import defaultdict

import pytest

from parallel_consumer import (
    ConfigurationError,
    Options,
    PollContext,
    RunnerKind,
)


def test_an_async_handler_runs_on_the_event_loop_thread(harness, cluster, wait_until):
    # Given records and an async def handler, with Options.runner left unset
    cluster.create_topic("t")
    for i in range(20):
        cluster.produce("t", b"%d" % i, key=b"%d" % (i % 3))
    threads: set[str] = set()
    seen: list[int] = []

    async def handle(ctx: PollContext) -> None:
        await asyncio.sleep(0)
        threads.add(threading.current_thread().name)
        seen.append(ctx.offset)

    pc = harness.make(Options(name="aio"))
    # When it is registered
    pc.poll(handle)
    # Then every record is processed on the consumer's loop thread
    wait_until(lambda: pc.statistics().records_succeeded == 20)
    assert sorted(seen) == list(range(20))
    assert len(threads) == 1
    assert threads.pop().endswith("-aio-loop")
    pc.close()
    assert cluster.committed("g", "t", 0) == (20, None)


def test_async_handlers_run_on_the_loop_that_loop_factory_makes(harness, cluster, wait_until):
    # Given a consumer whose loop_factory makes loops of a recognisable kind
    class Loop(asyncio.SelectorEventLoop):
        pass

    cluster.create_topic("t")
    for i in range(20):
        cluster.produce("t", b"%d" % i)
    loops: set[str] = set()

    async def handle(ctx: PollContext) -> None:
        await asyncio.sleep(0)
        loops.add(type(asyncio.get_running_loop()).__qualname__)

    pc = harness.make(Options(loop_factory=Loop))
    # When its async handler runs
    pc.poll(handle)
    # Then every call ran on that loop, and the records commit as usual
    wait_until(lambda: pc.statistics().records_succeeded == 20)
    assert loops == {Loop.__qualname__}
    pc.close()
    assert cluster.committed("g", "t", 0) == (20, None)


def test_five_thousand_calls_are_in_flight_at_once(harness, cluster, wait_until):
    # Given 5,000 records with distinct keys and max_concurrency=5000
    cluster.create_topic("t", 2)
    total = 5000
    for i in range(total):
        cluster.produce("t", b"v", key=b"k%d" % i, partition=i % 2)
    running = 0
    peak = 0
    everyone_in: asyncio.Event | None = None

    async def handle(ctx: PollContext) -> None:
        nonlocal running, peak, everyone_in
        if everyone_in is None:
            everyone_in = asyncio.Event()
        running += 1  # one loop thread: no lock needed
        peak = max(peak, running)
        if running == total:
            everyone_in.set()
        try:
            # Hold each call until all are in flight (a runner capping concurrency never gets
            # there, and the peak shows it), then sleep like an I/O call.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(everyone_in.wait(), 15)
            await asyncio.sleep(0.2)
        finally:
            running -= 1

    pc = harness.make(Options(ordering="key", max_concurrency=total))
    # When they run
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded == total, timeout=60)
    # Then all 5,000 were in flight at the same time
    assert peak == total
    pc.close()


def test_key_order_holds_with_async_handlers(harness, cluster, wait_until):
    # Given 3,000 records over 30 keys and an async handler that awaits a random while
    cluster.create_topic("t", 3)
    for i in range(3000):
        cluster.produce("t", b"%d" % i, key=b"k%d" % (i % 30), partition=i % 3)
    order: dict[tuple[int, bytes | None], list[int]] = defaultdict(list)
    active: dict[tuple[int, bytes | None], int] = defaultdict(int)
    overlaps = []

    async def handle(ctx: PollContext) -> None:
        lane = (ctx.partition, ctx.key)
        active[lane] += 1
        if active[lane] > 1:
            overlaps.append(lane)
        order[lane].append(ctx.offset)
        await asyncio.sleep((ctx.offset % 7) / 10_000)
        active[lane] -= 1

    pc = harness.make(Options(ordering="key", max_concurrency=500))
    # When they run
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded == 3000, timeout=30)
    pc.close()
    # Then each key saw its records one at a time, in offset order
    assert overlaps == []
    assert sum(len(o) for o in order.values()) == 3000
    assert all(offsets == sorted(offsets) for offsets in order.values())


def test_a_failing_async_call_is_retried_and_the_others_are_not_disturbed(
    harness, cluster, wait_until
):
    cluster.create_topic("t")
    for i in range(10):
        cluster.produce("t", b"%d" % i, key=b"%d" % i)
    calls: list[tuple[int, int]] = []

    async def handle(ctx: PollContext) -> str:
        calls.append((ctx.offset, ctx.attempts))
        await asyncio.sleep(0)
        if ctx.offset == 4 and ctx.attempts == 0:
            raise ValueError("first attempt fails")
        return "done"

    pc = harness.make(Options(ordering="unordered", retry_delay=0.01))
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded == 10)
    pc.close()
    assert sorted(calls) == sorted([(i, 0) for i in range(10)] + [(4, 1)])
    assert pc.statistics().records_failed == 1


def test_close_without_drain_cancels_calls_that_outlive_the_timeout(harness, cluster, wait_until):
    # Given 50 async calls that never end on their own
    cluster.create_topic("t")
    for i in range(50):
        cluster.produce("t", b"%d" % i, key=b"%d" % i)
    entered = []
    cancelled = []

    async def handle(ctx: PollContext) -> None:
        entered.append(ctx.offset)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(ctx.offset)
            raise

    pc = harness.make(Options(ordering="unordered", max_concurrency=100, commit_interval=3600))
    pc.poll(handle)
    wait_until(lambda: len(entered) == 50)
    # When the consumer closes without drain, giving them 0.2 s
    started = time.monotonic()
    pc.close(drain=False, timeout=0.2)
    # Then the close did not wait for them: they were cancelled, and nothing was committed
    assert time.monotonic() - started < 5.0
    assert sorted(cancelled) == list(range(50))
    assert cluster.committed("g", "t", 0) in (None, (0, None))


class _AsyncCallable:
    async def __call__(self, ctx: PollContext) -> None:
        await asyncio.sleep(0)


async def _takes_extra(ctx: PollContext, extra: int) -> None:
    await asyncio.sleep(0)


@pytest.mark.parametrize(
    "handler",
    [_AsyncCallable(), functools.partial(_takes_extra, extra=1)],
    ids=["callable-object", "partial"],
)
def test_async_callables_that_are_not_functions_pick_the_asyncio_runner(
    harness, cluster, wait_until, handler
):
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    pc = harness.make()
    pc.poll(handler)
    wait_until(lambda: pc.statistics().records_succeeded == 1)
    assert any(t.name.endswith("-aio-loop") for t in threading.enumerate())


async def _async_handler(ctx: PollContext) -> None:
    pass


def _sync_handler(ctx: PollContext) -> None:
    pass


@pytest.mark.parametrize("runner", ["threads", "process"])
def test_an_async_handler_with_another_runner_set_is_a_configuration_error(
    harness, cluster, runner
):
    cluster.create_topic("t")
    pc = harness.make(Options(runner=runner))
    with pytest.raises(ConfigurationError, match="async def handler"):
        pc.poll(_async_handler)


def test_a_plain_handler_with_the_asyncio_runner_is_a_configuration_error(harness, cluster):
    cluster.create_topic("t")
    pc = harness.make(Options(runner="asyncio"))
    with pytest.raises(ConfigurationError, match="would block"):
        pc.poll(_sync_handler)
    # And the consumer can still take a handler that fits
    pc.poll(_async_handler)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("thread", RunnerKind.THREADS),
        ("threads", RunnerKind.THREADS),
        ("async", RunnerKind.ASYNCIO),
        ("asyncio", RunnerKind.ASYNCIO),
        ("process", RunnerKind.PROCESS),
        ("PROCESSES", RunnerKind.PROCESS),
        (RunnerKind.ASYNCIO, RunnerKind.ASYNCIO),
        (None, None),
    ],
)
def test_runner_accepts_members_and_their_usual_names(given, expected):
    assert Options(runner=given).runner is expected


def test_an_unknown_runner_name_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match=r"Options\.runner must be one of"):
        Options(runner="greenlet")


def test_loop_factory_must_be_callable_and_only_goes_with_the_asyncio_runner():
    assert Options(loop_factory=asyncio.new_event_loop).loop_factory is asyncio.new_event_loop
    assert Options(runner="asyncio", loop_factory=asyncio.new_event_loop).loop_factory
    with pytest.raises(ConfigurationError, match="loop_factory must be a callable"):
        Options(loop_factory="uvloop")  # type: ignore[arg-type]
    for runner in ("threads", "process"):
        with pytest.raises(ConfigurationError, match="only applies to async def handlers"):
            Options(runner=runner, loop_factory=asyncio.new_event_loop)


def test_a_plain_handler_with_a_loop_factory_is_a_configuration_error(harness, cluster):
    cluster.create_topic("t")
    pc = harness.make(Options(loop_factory=asyncio.new_event_loop))
    with pytest.raises(ConfigurationError, match="loop_factory is set"):
        pc.poll(_sync_handler)
    pc.poll(_async_handler)


def test_a_loop_factory_that_fails_fails_poll_and_the_consumer_still_closes(harness, cluster):
    cluster.create_topic("t")

    def broken() -> asyncio.AbstractEventLoop:
        raise RuntimeError("no loop today")

    pc = harness.make(Options(loop_factory=broken))
    with pytest.raises(ConfigurationError, match="no loop today"):
        pc.poll(_async_handler)
    pc.close(timeout=5)
    assert not [t for t in threading.enumerate() if t.name.startswith(pc._name + "-")]


def test_processes_defaults_to_the_cpu_count_and_needs_the_process_runner():
    assert Options(runner="process").processes == (os.cpu_count() or 1)
    assert Options(runner="process", processes=3).processes == 3
    with pytest.raises(ConfigurationError, match="only applies to runner='process'"):
        Options(processes=2)
    with pytest.raises(ConfigurationError, match="processes must be an int"):
        Options(runner="process", processes=0)
