"""``async def`` handlers in the Spark runner: the lanes of one call as tasks on one event loop
(a fresh one per call, from ``Options.loop_factory``), at most ``Options.max_concurrency``
handler calls at once; a retry delay is an ``asyncio.sleep`` of its lane. The retry loop is
:class:`~parallel_consumer.spark._lane.Attempts`, as for plain handlers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from parallel_consumer.context import PollContext
from parallel_consumer.options import Options
from parallel_consumer.spark._lane import Attempts, Lane
from parallel_consumer.spark._records import InputRecord

__all__ = ["run_lanes"]


async def _run_lane(
    lane: Lane,
    records: Sequence[InputRecord],
    handler: Callable[[PollContext], Any],
    slots: asyncio.Semaphore,
) -> Lane:
    for record in records:
        attempts = Attempts(lane, record)
        while True:
            poll = attempts.poll()
            async with slots:
                try:
                    value, error = await handler(poll), None
                except Exception as exc:  # the record's failure
                    value, error = None, exc
            delay = attempts.ended(poll, value, error)
            if delay is None:
                break
            await asyncio.sleep(delay)
    return lane


async def run_lanes(
    lanes: Sequence[Sequence[InputRecord]],
    handler: Callable[[PollContext], Any],
    options: Options,
    group: str,
    wall: Callable[[], float],
) -> list[Lane]:
    """Run ``lanes`` (each a lane's records, in order) to their end; their rows and tallies."""
    slots = asyncio.Semaphore(options.max_concurrency)
    tasks = [
        asyncio.create_task(_run_lane(Lane(options, group, wall), lane, handler, slots))
        for lane in lanes
    ]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
