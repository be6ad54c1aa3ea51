"""``async def`` handlers in the Spark runner's core: the lanes of one call as tasks on one
event loop (a fresh one per call, from ``Options.loop_factory``), at most
``Options.max_concurrency`` handler calls at once; a retry delay is an ``asyncio.sleep`` of its
lane. See :mod:`parallel_consumer.spark._core`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.errors import DeadLetter, Skip
from parallel_consumer.options import Options
from parallel_consumer.produce import outputs_of
from parallel_consumer.spark._core import InputRecord, Lane, LaneKey, Message

__all__ = ["run_lanes"]


async def _run_lane(
    lane: Lane,
    records: Sequence[InputRecord],
    handler: Callable[[PollContext], Any],
    slots: asyncio.Semaphore,
) -> Lane:
    for record in records:
        tally = lane.started(record)
        attempts, first, last = 0, None, None
        error: BaseException | None = None
        produced = 0
        while True:
            context = RecordContext(Message(record), attempts, error, last)
            poll = PollContext.of_one(context)
            async with slots:
                try:
                    outputs = outputs_of(await handler(poll))
                except Exception as exc:
                    outputs, error = [], exc
                else:
                    error = poll.outcomes(None)[0]
            produced = lane.emit(record, outputs, produced, tally)
            if error is None:
                break
            if not isinstance(error, Skip | DeadLetter):  # (decisions, not failed attempts)
                attempts += 1
                last = lane.now()
                first = first or last
            delay = lane.settle(record, error, attempts, first, last)
            if delay is None:
                break
            await asyncio.sleep(delay)
        tally.inputs += 1
    return lane


async def run_lanes(
    lanes: dict[LaneKey, list[InputRecord]],
    handler: Callable[[PollContext], Any],
    options: Options,
    group: str,
    wall: Callable[[], float],
) -> list[Lane]:
    slots = asyncio.Semaphore(options.max_concurrency)
    tasks = [
        asyncio.create_task(_run_lane(Lane(options, group, wall), lane, handler, slots))
        for lane in lanes.values()
    ]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
