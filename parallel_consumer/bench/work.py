"""The per-record work of a row, as the Python contestants run it."""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Awaitable, Callable

from parallel_consumer.bench.model import Row, Work

__all__ = ["async_work", "loop_factory", "sync_work"]


def _burn(rounds: int) -> int:
    x = 0
    for _ in range(rounds):
        for i in range(200):
            x += i * i
    return x


@functools.cache
def rounds_per_ms() -> int:
    """How many rounds of ``_burn`` take 1 ms on one core here, calibrated once per process
    from the fastest of a few tries (a busy machine only ever makes a try slower)."""
    rounds = 1
    while True:
        started = time.perf_counter()
        _burn(rounds)
        if time.perf_counter() - started > 0.005:
            break
        rounds *= 2
    best = min(_timed(rounds) for _ in range(5))
    return max(1, round(rounds / (best * 1000)))


def _timed(rounds: int) -> float:
    started = time.perf_counter()
    _burn(rounds)
    return time.perf_counter() - started


def cpu_rounds(ms: float) -> int:
    """The fixed work of a ``cpu`` row's record: ``ms`` of arithmetic on one idle core."""
    return max(1, round(rounds_per_ms() * ms))


def burn(rounds: int) -> None:
    """Pure-Python arithmetic (not "until ms passed"): it holds the GIL like a real CPU-bound
    model, so threads contend for it and processes do not."""
    _burn(rounds)


def sync_work(work: Work) -> Callable[[], None]:
    """A function doing ``work`` once (called per handler call)."""
    if work.kind == "noop":
        return lambda: None
    if work.kind == "sleep_random":
        top = int(work.ms) + 1

        def sleep_random() -> None:
            time.sleep(random.randrange(top) / 1000)

        return sleep_random
    if work.kind in ("sleep", "async_sleep"):
        seconds = work.ms / 1000
        return lambda: time.sleep(seconds)
    if work.kind == "cpu":
        rounds = cpu_rounds(work.ms)
        return lambda: burn(rounds)
    raise ValueError(f"unknown work {work.kind!r}")


def async_work(work: Work) -> Callable[[], Awaitable[None]]:
    """A coroutine function doing ``work`` once; sleeps use ``asyncio.sleep``."""
    if work.kind == "cpu":
        raise ValueError("cpu work has no async form")
    if work.kind == "sleep_random":
        top = int(work.ms) + 1

        async def sleep_random() -> None:
            await asyncio.sleep(random.randrange(top) / 1000)

        return sleep_random
    seconds = 0.0 if work.kind == "noop" else work.ms / 1000

    async def sleep() -> None:
        await asyncio.sleep(seconds)

    return sleep


def loop_factory(row: Row) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop factory an async row names (``runner={"loop_factory": "uvloop"}``), or
    None for asyncio's own."""
    name = row.runner.get("loop_factory")
    if name is None:
        return None
    if name != "uvloop":
        raise ValueError(f"row {row.name}: unknown loop_factory {name!r} (known: uvloop)")
    import uvloop

    return uvloop.new_event_loop
