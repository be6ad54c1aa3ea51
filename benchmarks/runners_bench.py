"""Runner benchmark: workloads W1b (async, C=1000), W5 (CPU-bound: threads vs processes) and W6
(async I/O fan-out, C=5000) of docs/benchmarks.md on a real broker.

Run: ``python benchmarks/runners_bench.py [--workload W1b|W5|W6|all] [--repeat 3] [--quick]``.
It starts an embedded LocalKafka (or uses ``--bootstrap``), prints a line per row and writes a
JSON file per invocation to ``benchmarks/results/``. ``--quick`` runs each row once on a few
hundred records: a smoke test that the code runs, not a measurement.

What is recorded, for every runner alike: the engine's hooks (on the controller thread) see each
call dispatched and each call's outcome, so the records a handler finished are known even when it
ran in another process. Clock (docs/benchmarks.md): from the first dispatch to the moment the broker
acknowledged the end offset of every partition; start-up is reported separately. Each run checks
itself: every record finished, duplicates counted, per-key order verified (KEY runs at most one
record per key at a time, so the order of successes per key is the processing order).

Ideals use the service time ``t`` measured from the primitive actually used (``asyncio.sleep``
rounds up to whole milliseconds; the CPU work is timed in this process before the runs):
UNORDERED ``ceil(N/C)·t``; KEY ``max(n_max·t, ceil(N/min(C, k))·t)``; for W5 also
``N·cpu/cores``, the best any runner can do on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka

from parallel_consumer import NoHooks, Options, ParallelConsumer, PollContext, ProcessingOrder
from parallel_consumer.testing import LocalKafka, create_topic, produce_records

RESULTS = Path(__file__).parent / "results"


# -- handlers (module level: the process runner imports them by name) --------------------------


def burn(iterations: int) -> int:
    """Pure-Python CPU work: ``iterations`` rounds of integer arithmetic (holds the GIL)."""
    acc = 0
    for i in range(iterations):
        acc = (acc * 31 + i) % 1_000_003
    return acc


def cpu_handler(ctx: PollContext) -> None:
    """W5: the record's value is how many rounds of :func:`burn` to do (about 1 ms)."""
    burn(int(ctx.value))  # type: ignore[arg-type]


def sleeper(seconds: float) -> Callable[[PollContext], Any]:
    async def handle(ctx: PollContext) -> None:
        await asyncio.sleep(seconds)

    return handle


# -- measuring ------------------------------------------------------------------------------------


def measured_async_sleep(seconds: float, samples: int = 100) -> float:
    """Mean real duration of ``asyncio.sleep(seconds)`` on this machine."""

    async def run() -> float:
        started = time.perf_counter()
        for _ in range(samples):
            await asyncio.sleep(seconds)
        return (time.perf_counter() - started) / samples

    return asyncio.run(run())


def calibrate_burn(target: float) -> tuple[int, float]:
    """Rounds of :func:`burn` that take about ``target`` seconds, and their measured time."""
    rounds = 1000
    while True:
        started = time.perf_counter()
        burn(rounds)
        took = time.perf_counter() - started
        if took > 0.02:
            break
        rounds *= 2
    rounds = max(1, int(rounds * target / took))
    started = time.perf_counter()
    for _ in range(200):
        burn(rounds)
    return rounds, (time.perf_counter() - started) / 200


class Observer(NoHooks):
    """Engine hooks that record every dispatch and every finished record (controller thread)."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.first_dispatch: float | None = None
        self._batches: dict[int, list[tuple[int, bytes | None, int]]] = {}
        self.finished: list[tuple[int, bytes | None, int]] = []
        self.failures = 0

    def on_dispatch(self, batch: int, context: PollContext) -> None:
        if self.first_dispatch is None:
            self.first_dispatch = time.perf_counter()
        self._batches[batch] = [(r.partition, r.key, r.offset) for r in context.records]

    def on_work_done(
        self, batch: int, errors: Sequence[BaseException | None], duration: float
    ) -> None:
        records = self._batches.pop(batch, [])
        for record, error in zip(records, errors, strict=False):
            if error is None:
                self.finished.append(record)
            else:
                self.failures += 1

    def seen(self) -> Counter[tuple[int, int]]:
        return Counter((p, o) for p, _, o in self.finished)

    def ordered(self) -> bool:
        lanes: dict[tuple[int, bytes | None], list[int]] = defaultdict(list)
        for partition, key, offset in self.finished:
            lanes[(partition, key)].append(offset)
        return all(o == sorted(o) for o in lanes.values())


@dataclass
class RunResult:
    row: str
    records: int
    wall: float
    startup: float
    ideal: float
    duplicates: int
    order_ok: bool
    extra: dict[str, Any] = field(default_factory=dict)


def ideal_time(
    ordering: ProcessingOrder, keys: Sequence[bytes], concurrency: int, service: float
) -> float:
    n = len(keys)
    if ordering is ProcessingOrder.UNORDERED:
        return math.ceil(n / concurrency) * service
    counts = Counter(keys)
    return max(
        max(counts.values()) * service,
        math.ceil(n / min(concurrency, len(counts))) * service,
    )


def run_pc(
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    options: Options,
    handler: Callable[[PollContext], Any],
    row: str,
    ideal: float,
) -> RunResult:
    n = sum(ends.values())
    observer = Observer(n)
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 10000,
        "fetch.wait.max.ms": 50,
    }
    pc = ParallelConsumer(config, options, hooks=observer)
    pc.subscribe([topic])
    registered = time.perf_counter()
    pc.poll(handler)
    try:
        deadline = time.perf_counter() + 900
        while True:
            stats = pc.statistics()
            committed = {s.partition: s.committed_offset for s in stats.partitions}
            if all(committed.get(p) == end for p, end in ends.items() if end > 0):
                break
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{row}: commits did not reach {ends}: {committed}")
            time.sleep(0.002)
        finished = time.perf_counter()
    finally:
        pc.close()
    assert observer.first_dispatch is not None
    seen = observer.seen()
    if len(seen) != n:
        raise RuntimeError(f"{row}: {n - len(seen)} records never finished")
    return RunResult(
        row=row,
        records=n,
        wall=finished - observer.first_dispatch,
        startup=observer.first_dispatch - registered,
        ideal=ideal,
        duplicates=sum(seen.values()) - n,
        order_ok=options.ordering is ProcessingOrder.UNORDERED or observer.ordered(),
        extra={"failures": observer.failures, "commits": stats.commits_acknowledged},
    )


def summarise(runs: list[RunResult], **extra: Any) -> dict[str, Any]:
    wall = statistics.median(r.wall for r in runs)
    ideal = runs[0].ideal
    summary = {
        "row": runs[0].row,
        "records": runs[0].records,
        "wall_median": wall,
        "ideal": ideal,
        "ratio": wall / ideal if ideal else None,
        "startup_median": statistics.median(r.startup for r in runs),
        "c_us": max(0.0, (wall - ideal) / runs[0].records * 1e6),
        "duplicates": sum(r.duplicates for r in runs),
        "order_ok": all(r.order_ok for r in runs),
        "runs": [asdict(r) for r in runs],
        **extra,
    }
    print(
        f"{summary['row']:<28} wall {wall:7.3f}s  ideal {ideal:7.3f}s  "
        f"ratio {summary['ratio']:.2f}  start {summary['startup_median']:.2f}s  "
        f"c {summary['c_us']:6.1f}µs  dup {summary['duplicates']}  order_ok {summary['order_ok']}"
    )
    return summary


def new_topic(
    bootstrap: str, prefix: str, keys: list[bytes], partitions: int, values: Any
) -> tuple[str, dict[int, int]]:
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions=partitions)
    produced = produce_records(
        bootstrap,
        topic,
        len(keys),
        keys=keys,
        values=values,
        partitions=[i % partitions for i in range(len(keys))],
        producer_config={"linger.ms": 20, "enable.idempotence": False},
        timeout=120,
    )
    ends: dict[int, int] = dict.fromkeys(range(partitions), 0)
    for record in produced:
        ends[record.partition] = max(ends[record.partition], record.offset + 1)
    return topic, ends


# -- workloads ------------------------------------------------------------------------------------


def w1b_async(bootstrap: str, repeat: int, quick: bool) -> list[dict[str, Any]]:
    """W1b at C=1000 with an async handler: N=10,000, 1 partition, t = 2.5 ms."""
    n = 300 if quick else 10_000
    concurrency = 1000
    t = measured_async_sleep(0.0025)
    rng = random.Random(7)
    out = []
    for row, ordering, k in (
        ("W1b async UNORDERED C=1000", ProcessingOrder.UNORDERED, 20),
        ("W1b async KEY-10000 C=1000", ProcessingOrder.KEY, 10_000),
    ):
        keys = [b"key-%d" % rng.randrange(k) for _ in range(n)]
        topic, ends = new_topic(bootstrap, "w1b", keys, 1, [b"x" * 10])
        options = Options(ordering=ordering, max_concurrency=concurrency, commit_interval=0.1)
        ideal = ideal_time(ordering, keys, concurrency, t)
        runs = [
            run_pc(bootstrap, topic, ends, options, sleeper(0.0025), row, ideal)
            for _ in range(repeat)
        ]
        out.append(summarise(runs, service_time=t, concurrency=concurrency))
    return out


def w5(bootstrap: str, repeat: int, quick: bool) -> list[dict[str, Any]]:
    """CPU-bound: N=20,000, ~1 ms pure-Python CPU per record, KEY with 1,000 keys, 4 partitions;
    the thread runner against the process runner."""
    n = 200 if quick else 20_000
    partitions = 4
    cores = os.cpu_count() or 1
    rounds, cpu = calibrate_burn(0.001)
    rng = random.Random(5)
    keys = [b"key-%d" % rng.randrange(1000) for _ in range(n)]
    topic, ends = new_topic(bootstrap, "w5", keys, partitions, [str(rounds).encode()])
    best = n * cpu / cores
    out = []
    rows = (
        ("W5 threads C=16", Options(ordering="key", max_concurrency=16, commit_interval=0.1)),
        (
            f"W5 process P={cores}",
            Options(ordering="key", runner="process", processes=cores, commit_interval=0.1),
        ),
    )
    for row, options in rows:
        runs = [
            run_pc(bootstrap, topic, ends, options, cpu_handler, row, best) for _ in range(repeat)
        ]
        out.append(summarise(runs, cpu_per_record=cpu, cores=cores, ideal_is="N*cpu/cores"))
    threads, processes = out[0]["wall_median"], out[1]["wall_median"]
    print(f"W5 speed-up of the process runner over threads: {threads / processes:.2f}x")
    out.append({"row": "speed-up", "processes_over_threads": threads / processes})
    return out


def w6(bootstrap: str, repeat: int, quick: bool) -> list[dict[str, Any]]:
    """Async fan-out: N=20,000, a handler awaiting 50 ms, C=5,000; UNORDERED and KEY-10,000."""
    n = 1000 if quick else 20_000
    concurrency = 5000
    t = measured_async_sleep(0.05, samples=20)
    rng = random.Random(3)
    out = []
    for row, ordering, k in (
        ("W6 async UNORDERED C=5000", ProcessingOrder.UNORDERED, 10_000),
        ("W6 async KEY-10000 C=5000", ProcessingOrder.KEY, 10_000),
    ):
        keys = [b"key-%d" % rng.randrange(k) for _ in range(n)]
        topic, ends = new_topic(bootstrap, "w6", keys, 4, [b"x" * 10])
        options = Options(ordering=ordering, max_concurrency=concurrency, commit_interval=0.1)
        ideal = ideal_time(ordering, keys, concurrency, t)
        runs = [
            run_pc(bootstrap, topic, ends, options, sleeper(0.05), row, ideal)
            for _ in range(repeat)
        ]
        out.append(
            summarise(runs, service_time=t, concurrency=concurrency, n_t_over_c=n * t / concurrency)
        )
    return out


WORKLOADS = {"W1b": w1b_async, "W5": w5, "W6": w6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run on a few records")
    parser.add_argument("--bootstrap", help="use this broker instead of an embedded LocalKafka")
    args = parser.parse_args(argv)
    repeat = 1 if args.quick else args.repeat
    broker = None
    if args.bootstrap:
        bootstrap = args.bootstrap
    else:
        broker = LocalKafka().start()
        bootstrap = broker.bootstrap_servers
    results: dict[str, Any] = {
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "confluent_kafka": confluent_kafka.__version__,
            "librdkafka": confluent_kafka.libversion()[0],
            "broker": "embedded LocalKafka" if broker else bootstrap,
            "note": "broker JVM shares the machine's cores with the benchmark",
        },
        "repeat": repeat,
        "quick": args.quick,
    }
    try:
        for name, workload in WORKLOADS.items():
            if args.workload in (name, "all"):
                results[name] = workload(bootstrap, repeat, args.quick)
    finally:
        if broker is not None:
            broker.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    kind = "quick" if args.quick else "runners"
    path = RESULTS / f"{kind}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    if args.quick:
        print("quick run: a smoke test, not a measurement (results not saved)")
        return 0
    path.write_text(json.dumps(results, indent=2, default=str))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
