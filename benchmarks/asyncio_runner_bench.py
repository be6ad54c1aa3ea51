"""The asyncio runner alone: CPU per call of ``asyncio.sleep`` handlers, no broker, no engine.

A stand-in for the controller (one thread) keeps ``capacity + backlog`` calls submitted and
counts the reports, as the engine does; the figure is the process CPU time per call, which
under the GIL is what bounds W1b's async rows (``wall`` ≈ ``cpu`` once the loop is saturated).
Use it for a before/after of a change to ``parallel_consumer/runners/asyncio_loop.py``: run it
against two checkouts (``PYTHONPATH=<checkout>``), alternating, on a quiet machine.

    .venv/bin/python benchmarks/asyncio_runner_bench.py --calls 50000 --repeat 5
    .venv/bin/python benchmarks/asyncio_runner_bench.py --loop uvloop
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import statistics
import time
from collections.abc import Callable

from confluent_kafka import Message

from parallel_consumer._clock import SystemClock
from parallel_consumer._events import WorkDone, WorkDoneMany
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.runners import AsyncioRunner


def one_run(calls: int, concurrency: int, sleep: float, loop: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) for ``calls`` calls."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    runner = AsyncioRunner(concurrency, SystemClock(), name="bench", loop_factory=factory)
    reports: queue.SimpleQueue[WorkDone | WorkDoneMany] = queue.SimpleQueue()

    async def handle(ctx: PollContext) -> None:
        await asyncio.sleep(sleep)

    runner.start(handle, reports.put)  # type: ignore[arg-type]
    contexts = [
        PollContext.of_one(RecordContext(Message(topic="t", partition=0, offset=i, key=b"k")))
        for i in range(calls)
    ]
    limit = concurrency + runner.backlog
    submit_many = getattr(runner, "submit_many", None)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    submitted = finished = 0
    try:
        while finished < calls:
            room = min(calls - submitted, limit - (submitted - finished))
            if room > 0:
                batch = [(i, contexts[i]) for i in range(submitted, submitted + room)]
                if submit_many is not None:
                    submit_many(batch)
                else:  # (a checkout from before submit_many, for a before/after)
                    for call in batch:
                        runner.submit(*call)
                submitted += room
            event = reports.get(timeout=30)
            while True:
                finished += len(event.calls) if isinstance(event, WorkDoneMany) else 1
                try:
                    event = reports.get_nowait()
                except queue.Empty:
                    break
        return time.perf_counter() - wall0, time.process_time() - cpu0
    finally:
        runner.stop(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--sleep-ms", type=float, default=2.5)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = [
        one_run(args.calls, args.concurrency, args.sleep_ms / 1000, args.loop)
        for _ in range(args.repeat)
    ]
    per_call = [cpu / args.calls * 1e6 for _, cpu in runs]
    print(
        f"{args.calls:,} calls, C={args.concurrency}, sleep {args.sleep_ms} ms, {args.loop}: "
        f"CPU per call median {statistics.median(per_call):.1f} us "
        f"(runs {' '.join(f'{c:.1f}' for c in per_call)}); "
        f"wall median {statistics.median(w for w, _ in runs):.3f} s"
    )


if __name__ == "__main__":
    main()
