"""The engine's cost per record without a broker: W2's shape on the in-memory fake cluster.

Runs a no-op handler over N records (8 partitions, 10,000 keys, like W2) through a real
ParallelConsumer whose Kafka client is the fake one, and reports the wall time and the CPU time
of each engine thread (read from /proc, per thread), in microseconds per record. The fake
client costs differ from librdkafka's, so the poller's share is not the real one; the
controller's and the workers' are. For before/after comparisons of the hot path (issue #15):
figures to quote come from pc-bench on the real broker.

    .venv/bin/python benchmarks/hotpath.py --ordering KEY --records 200000 --repeat 3
    .venv/bin/python benchmarks/hotpath.py --profile controller   # cProfile of one thread
    # W1b's shape: 10,000 records of 10,000 keys on 1 partition, 2.5 ms calls on 100 threads
    .venv/bin/python benchmarks/hotpath.py --records 10000 --partitions 1 --concurrency 100 \
        --sleep-ms 2.5 --repeat 3
    # W6's shape, its handlers on the caller's loop (async with): the main thread is the loop
    .venv/bin/python benchmarks/hotpath.py --records 20000 --concurrency 5000 --sleep-ms 50 \
        --ordering UNORDERED --callers-loop --repeat 3
    # ... the same calls on a bare loop (a task per call), and either with the collector off
    .venv/bin/python benchmarks/hotpath.py --records 20000 --concurrency 5000 --sleep-ms 50 \
        --bare-loop --repeat 3 [--no-gc]
    # ... and with an async def handler, 1,000 at once (W1b's async rows)
    .venv/bin/python benchmarks/hotpath.py --records 10000 --partitions 1 --concurrency 1000 \
        --sleep-ms 2.5 --repeat 3 --async
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import statistics
import sys
import threading
import time
from collections import defaultdict
from typing import Any

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder
from parallel_consumer.testing.fakes import FakeCluster

TOPIC = "w2"


def _fill(records: int, partitions: int, keys: int) -> FakeCluster:
    cluster = FakeCluster()
    cluster.create_topic(TOPIC, partitions)
    value = b"x" * 100
    for i in range(records):
        cluster.produce(TOPIC, value, str(i % keys).encode(), partition=i % partitions)
    return cluster


def _thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of every thread of this process, by native thread id."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _role(name: str) -> str:
    for role in ("controller", "poller", "worker", "producer", "aio-loop"):
        if role in name:
            return role
    return "other"


def _telemetry() -> tuple[Any, Any]:
    """Metrics as pc-bench's ``pc-otel`` runs them: the SDK, a periodic reader every 1 s."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    from parallel_consumer.telemetry import Telemetry

    sink = open(os.devnull, "w")  # noqa: SIM115 - closed by shutdown below
    reader = PeriodicExportingMetricReader(
        ConsoleMetricExporter(out=sink), export_interval_millis=1000
    )
    provider = MeterProvider(metric_readers=[reader])

    def shutdown() -> None:
        provider.shutdown()
        sink.close()

    return Telemetry(meter_provider=provider), shutdown


async def _on_callers_loop(
    pc: ParallelConsumer, handle: Any, done: threading.Event, args: argparse.Namespace
) -> tuple[float, dict[int, float], dict[int | None, str], Any]:
    """The run with the handler on this (the main) thread's loop: ``async with``."""
    started = time.perf_counter()
    async with pc as consumer:
        consumer.subscribe([TOPIC])
        consumer.poll(handle)
        deadline = time.monotonic() + args.timeout
        while not done.is_set():
            if time.monotonic() > deadline:
                raise SystemExit(f"not every record in {args.timeout} s")
            await asyncio.sleep(0.001)
        wall = time.perf_counter() - started
        after = _thread_cpu()
        names = {t.native_id: t.name for t in threading.enumerate()}
        names[threading.main_thread().native_id] = "main aio-loop"
        return wall, after, names, consumer.statistics()


def bare_loop_once(args: argparse.Namespace) -> dict[str, Any]:
    """The same calls on a bare event loop, a task per call, at most ``--concurrency`` at once:
    no consumer, no records (the loop's own cost per call, for beside ``--callers-loop``)."""
    pause = args.sleep_ms / 1000

    async def main() -> float:
        loop = asyncio.get_running_loop()
        left = args.records
        running = 0
        done = asyncio.Event()

        async def call() -> None:
            if pause:
                await asyncio.sleep(pause)

        def ended(_: asyncio.Task[None]) -> None:
            nonlocal running
            running -= 1
            if left:
                start()
            elif not running:
                done.set()

        def start() -> None:
            nonlocal left, running
            left -= 1
            running += 1
            loop.create_task(call()).add_done_callback(ended)

        started = time.thread_time()
        for _ in range(min(args.concurrency, left)):
            start()
        await done.wait()
        return time.thread_time() - started

    wall = time.perf_counter()
    cpu = asyncio.run(main())
    wall = time.perf_counter() - wall
    return {
        "wall": wall,
        "records_per_s": args.records / wall,
        "us_per_record": {"bare loop": cpu / args.records * 1e6},
        "runs": 0,
        "bundles": 0,
        "chains": 0,
        "runs_detached": 0,
        "partition_pauses": 0,
    }


def run_once(args: argparse.Namespace, profile: str | None) -> dict[str, Any]:
    cluster = _fill(args.records, args.partitions, args.keys)
    done = threading.Event()
    count = [0]
    lock = threading.Lock()
    target = args.records

    pause = args.sleep_ms / 1000

    def handle(ctx: PollContext) -> None:
        if pause:
            time.sleep(pause)
        with lock:
            count[0] += len(ctx)
            if count[0] >= target:
                done.set()

    async def handle_async(ctx: PollContext) -> None:
        # (one event loop thread: no lock needed around the count)
        if pause:
            await asyncio.sleep(pause)
        count[0] += len(ctx)
        if count[0] >= target:
            done.set()

    options = Options(
        ordering=ProcessingOrder[args.ordering],
        max_concurrency=args.concurrency,
        batch_size=args.batch_size,
        max_buffered_records=max(10_000, 4 * args.concurrency * args.batch_size),
    )
    telemetry, shutdown = _telemetry() if args.otel else (None, None)
    pc = ParallelConsumer(
        {"bootstrap.servers": "fake:9092", "group.id": "hotpath"},
        options,
        consumer_factory=cluster.consumer,
        telemetry=telemetry,
    )
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        # Profile one engine thread: install the profiler from inside it on its first call.
        original = threading.Thread.run

        def run(self: threading.Thread) -> None:
            if profile in self.name:
                profiler.enable()
            try:
                original(self)
            finally:
                if profile in self.name:
                    profiler.disable()

        threading.Thread.run = run  # type: ignore[method-assign]
    before = _thread_cpu()
    started = time.perf_counter()
    if args.callers_loop:
        wall, after, names, engine = asyncio.run(_on_callers_loop(pc, handle_async, done, args))
    else:
        pc.subscribe([TOPIC])
        pc.poll(handle_async if args.use_async else handle)  # type: ignore[arg-type]
        if not done.wait(args.timeout):
            pc.close()
            raise SystemExit(f"only {count[0]}/{target} records in {args.timeout} s")
        wall = time.perf_counter() - started
        after = _thread_cpu()
        names = {t.native_id: t.name for t in threading.enumerate()}
        engine = pc.statistics()
        pc.close()
    if shutdown is not None:
        shutdown()
    if profiler is not None:
        threading.Thread.run = original  # type: ignore[method-assign]
    cpu: dict[str, float] = defaultdict(float)
    for tid, seconds in after.items():
        cpu[_role(names.get(tid, ""))] += seconds - before.get(tid, 0.0)
    result = {
        "wall": wall,
        "records_per_s": args.records / wall,
        "us_per_record": {k: v / args.records * 1e6 for k, v in sorted(cpu.items())},
        "runs": engine.runs,
        "bundles": engine.bundles,
        "chains": engine.chains,
        "runs_detached": engine.runs_detached,
        "partition_pauses": engine.partition_pauses,
    }
    if profiler is not None:
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(25)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ordering", default="KEY", choices=[o.name for o in ProcessingOrder])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument(
        "--sleep-ms", type=float, default=0.0, help="the handler sleeps this long (W1b: 2.5)"
    )
    parser.add_argument(
        "--async", dest="use_async", action="store_true", help="an async def handler"
    )
    parser.add_argument(
        "--callers-loop",
        action="store_true",
        help="async def handler on the main thread's loop (async with ParallelConsumer)",
    )
    parser.add_argument(
        "--bare-loop", action="store_true", help="the same calls on a bare loop, no consumer"
    )
    parser.add_argument("--no-gc", action="store_true", help="the garbage collector off")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--otel", action="store_true", help="metrics on (SDK, 1 s reader)")
    parser.add_argument("--profile", default=None, help="cProfile the thread whose name has this")
    args = parser.parse_args()
    if args.no_gc:
        gc.disable()
    if args.bare_loop:
        runs = [bare_loop_once(args) for _ in range(args.repeat)]
    else:
        runs = [run_once(args, args.profile if i == 0 else None) for i in range(args.repeat)]
    for r in runs:
        parts = "  ".join(f"{k} {v:.1f}" for k, v in r["us_per_record"].items())
        print(
            f"{r['records_per_s']:>9,.0f} rec/s  wall {r['wall']:.2f} s  µs/record: {parts}  "
            f"runs {r['runs']} (detached {r['runs_detached']}), pauses {r['partition_pauses']}, "
            f"chains {r['chains']}, bundles {r['bundles']}"
        )
    median = statistics.median(r["records_per_s"] for r in runs)
    print(f"median {median:,.0f} records/s ({args.ordering}, batch_size={args.batch_size})")


if __name__ == "__main__":
    main()
