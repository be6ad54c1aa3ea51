"""The per-record work of a row, as the Python contestants run it."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from parallel_consumer.bench.model import Work

__all__ = ["async_work", "sync_work"]


def _spin(ms: float) -> None:
    # Pure-Python arithmetic for ~ms milliseconds: holds the GIL like a real CPU-bound model.
    deadline = time.perf_counter() + ms / 1000
    x = 0
    while time.perf_counter() < deadline:
        for i in range(200):
            x += i * i


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
        return lambda: _spin(work.ms)
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
