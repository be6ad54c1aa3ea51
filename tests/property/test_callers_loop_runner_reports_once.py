"""The asyncio runner on the caller's loop keeps the runner contract under any interleaving of
submissions, cancellations, take-backs and a stop from another thread: every call that started
reports exactly once; a call taken back (``cancel_queued``) or still queued at the stop never
reports; no task of the runner outlives ``ended()``."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter

from confluent_kafka import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parallel_consumer._clock import SystemClock
from parallel_consumer._events import WorkDone, WorkDoneMany
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.runners import AsyncioRunner

# What a call does: return at once, await a little, raise, or wait until cancelled.
BEHAVIOURS = ("return", "sleep", "raise", "endless")


def _context(offset: int) -> PollContext:
    return PollContext([RecordContext(Message(topic="t", partition=0, offset=offset))])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=False,
)
@given(
    seed=st.integers(0, 2**32 - 1),
    capacity=st.integers(1, 8),
    calls=st.integers(1, 60),
    stop_timeout=st.sampled_from([0.0, 0.01, 0.2]),
)
def test_every_started_call_reports_once_whatever_the_interleaving(
    seed: int, capacity: int, calls: int, stop_timeout: float
) -> None:
    rng = random.Random(seed)
    behaviour = {i: rng.choice(BEHAVIOURS) for i in range(calls)}
    started: set[int] = set()
    reports: Counter[int] = Counter()
    taken_back: set[int] = set()

    def done(event: WorkDone | WorkDoneMany) -> None:
        for call in event.calls if isinstance(event, WorkDoneMany) else [event]:
            reports[call[0] if isinstance(call, tuple) else call.batch] += 1

    async def handle(ctx: PollContext) -> int:
        started.add(ctx.offset)
        what = behaviour[ctx.offset]
        if what == "sleep":
            await asyncio.sleep(rng.random() * 0.005)
        elif what == "raise":
            raise ValueError(ctx.offset)
        elif what == "endless":
            await asyncio.Event().wait()
        return ctx.offset

    async def main() -> None:
        loop = asyncio.get_running_loop()
        runner = AsyncioRunner(capacity, SystemClock(), name="prop", loop=loop)
        runner.start(handle, done)
        steps = random.Random(seed + 1)  # (the controller thread's own)

        def controller() -> None:
            # Bursts of submissions, with cancellations and take-backs between them
            sent = 0
            while sent < calls:
                burst = steps.randint(1, 10)
                runner.submit_many((i, _context(i)) for i in range(sent, min(calls, sent + burst)))
                sent += burst
                if steps.random() < 0.3:
                    runner.cancel(steps.randrange(calls))
                if steps.random() < 0.2:
                    taken_back.update(runner.cancel_queued())
            runner.stop(stop_timeout)

        thread = threading.Thread(target=controller)
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.001)
        thread.join()
        await runner.ended()
        # Then no task of the runner is left on the loop
        assert asyncio.all_tasks() == {asyncio.current_task()}
        await asyncio.sleep(0)  # (reports scheduled by the last ends)

    asyncio.run(main())
    # Every call that started reported exactly once; a call taken back never reported
    assert all(count == 1 for count in reports.values()), reports
    assert started <= set(reports)
    assert not (taken_back & started)
    assert not (taken_back & set(reports))
