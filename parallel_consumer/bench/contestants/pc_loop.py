"""``pc-loop``: this library with its ``async def`` handlers on the application's event loop
(``async with ParallelConsumer(...)``, docs/async-handlers.md), as an asyncio service runs it.

The same consumer, options and handler as ``pc``; the difference is where the calls run: on the
loop the contestant itself runs (the row's: asyncio's, or uvloop's), not on a private loop in a
thread of the consumer's. The clock is ``pc``'s: from subscribe to the broker's acknowledgement
of every partition's end offset.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from parallel_consumer import Options, ParallelConsumer
from parallel_consumer.bench.contestants.base import LogRecorder, RunEnv
from parallel_consumer.bench.contestants.pc import (
    ParallelConsumerContestant,
    committed_to_the_end,
)
from parallel_consumer.bench.kafka_io import base_consumer_config, new_group
from parallel_consumer.bench.model import Observation, Row
from parallel_consumer.bench.work import loop_factory

__all__ = ["ParallelConsumerOnCallersLoopContestant"]


class ParallelConsumerOnCallersLoopContestant(ParallelConsumerContestant):
    name = "pc-loop"
    description = "parallel_consumer, async handlers on the caller's event loop (async with)"

    def unsupported(self, row: Row) -> str | None:
        if not row.async_handler:
            return "pc-loop runs async rows only (pc runs the others)"
        return super().unsupported(row)

    def options(self, row: Row) -> Options:
        # The row's loop is the contestant's own (below), not one the consumer makes.
        return dataclasses.replace(super().options(row), loop_factory=None)

    def run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        loop = (loop_factory(row) or asyncio.new_event_loop)()
        try:
            return loop.run_until_complete(self._run(env, row, topic, ends))
        finally:
            loop.close()

    async def _run(self, env: RunEnv, row: Row, topic: str, ends: dict[int, int]) -> Observation:
        recorder = LogRecorder(sum(ends.values()))
        consumer = ParallelConsumer(
            base_consumer_config(env.bootstrap, new_group("pc-loop")), self.options(row)
        )
        started = time.time()
        deadline = time.monotonic() + env.timeout
        async with consumer as pc:
            pc.subscribe([topic])
            pc.poll(self._handler(row, recorder))
            while not recorder.done.is_set():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pc-loop {row.name}: only {recorder.count} records")
                await asyncio.sleep(0.005)
            deadline = time.monotonic() + 60
            while not committed_to_the_end(pc.statistics(), ends, deadline, f"pc-loop {row.name}"):
                await asyncio.sleep(0.002)
            finished = time.time()
            stats = pc.statistics()
        assert recorder.first_call is not None
        return Observation(
            started=started,
            first_call=recorder.first_call,
            finished=finished,
            log=recorder.log,
            extra={"commits_acknowledged": stats.commits_acknowledged},
        )
