"""Core-engine benchmark: workloads W1 and W2 of WORKLOADS.md on a real broker.

Run: ``python benchmarks/engine_bench.py [--workload W1|W2|all] [--repeat 3]``. It starts an
embedded LocalKafka (or uses ``--bootstrap``), prints a table per workload and writes a JSON file
per invocation to ``benchmarks/results/``.

Clock (WORKLOADS.md): from the first record handed to the handler to the moment the last offset
is committed and acknowledged by the broker; start-up (group join, first fetch) is reported
separately. Every run checks its own result: every record processed, duplicates counted, and
per-key (or per-partition) order verified.

The ideal of a row is computed from the service times the handler actually measured (so the
overshoot of ``time.sleep`` is part of the work, not of the overhead):
UNORDERED ``S/C``; KEY ``max(max_key S_key, S/min(C, k))``; PARTITION ``max(max_p S_p,
S/min(C, P))``, where ``S`` is the sum of service times and ``C`` the concurrency.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer, Producer

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder
from parallel_consumer.testing import LocalKafka, create_topic

RESULTS = Path(__file__).parent / "results"
EXTRA_CONFIG: dict[str, Any] = {}

#: The Java library's published W1 figures (README "Illustrative Performance Example"), seconds.
JAVA_W1 = {
    "PARTITION": 22.2,
    "KEY-1": 26.7,
    "KEY-2": 13.6,
    "KEY-5": 5.9,
    "KEY-10": 3.3,
    "KEY-20": 2.24,
    "KEY-50": 2.20,
    "KEY-100": 2.18,
    "KEY-1000": 2.06,
    "KEY-10000": 2.13,
    "UNORDERED": 2.83,
}


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

    @property
    def ratio(self) -> float:
        return self.wall / self.ideal if self.ideal else float("nan")


def produce(bootstrap: str, topic: str, keys: list[bytes], partitions: int, size: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000}
    )
    value = b"x" * size
    for i, key in enumerate(keys):
        while True:
            try:
                producer.produce(topic, value, key, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        return {
            p: consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=10)[
                1
            ]
            for p in range(partitions)
        }
    finally:
        consumer.close()


class Recorder:
    """Collects what the handler saw, from the worker threads, as cheaply as it can: one list
    append per record (atomic under the GIL, so no lock); the checks run after the run."""

    def __init__(self, work: Any, by_partition: bool, expected: int) -> None:
        self._work = work
        self._by_partition = by_partition
        self.expected = expected
        self.first_call: float | None = None
        self.log: list[tuple[int, bytes | None, int, float]] = []
        self.done = threading.Event()

    def __call__(self, ctx: PollContext) -> None:
        if self.first_call is None:
            self.first_call = time.perf_counter()
        started = time.perf_counter()
        self._work()
        share = (time.perf_counter() - started) / len(ctx)
        append = self.log.append
        for record in ctx.records:
            append((record.partition, record.key, record.offset, share))
        if len(self.log) >= self.expected:
            self.done.set()

    @property
    def count(self) -> int:
        return len(self.log)

    def seen(self) -> dict[tuple[int, int], int]:
        seen: dict[tuple[int, int], int] = defaultdict(int)
        for partition, _, offset, _ in self.log:
            seen[(partition, offset)] += 1
        return seen

    def service(self) -> dict[tuple[int, bytes | None], float]:
        """Measured handler time per (partition, key) lane."""
        lanes: dict[tuple[int, bytes | None], float] = defaultdict(float)
        for partition, key, _, took in self.log:
            lanes[(partition, key)] += took
        return lanes

    def ordered(self) -> bool:
        """Each lane (key, or partition) saw its offsets in increasing order. A lane runs one
        record at a time, so the order of appends is the order of processing."""
        order: dict[object, list[int]] = defaultdict(list)
        for partition, key, offset, _ in self.log:
            order[partition if self._by_partition else (partition, key)].append(offset)
        return all(o == sorted(o) for o in order.values())


def run_pc(
    bootstrap: str,
    topic: str,
    partitions: int,
    n: int,
    options: Options,
    work: Any,
    row: str,
) -> RunResult:
    ends = end_offsets(bootstrap, topic, partitions)
    recorder = Recorder(work, options.ordering is ProcessingOrder.PARTITION, n)
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 10000,
        "fetch.wait.max.ms": 50,
        **EXTRA_CONFIG,
    }
    pc = ParallelConsumer(config, options)
    pc.subscribe([topic])
    registered = time.perf_counter()
    pc.poll(recorder)
    try:
        if not recorder.done.wait(600):
            raise RuntimeError(f"{row}: only {recorder.count}/{n} records in 600 s")
        # Wait for the broker to acknowledge the end offsets of every partition.
        deadline = time.perf_counter() + 60
        while True:
            committed = {s.partition: s.committed_offset for s in pc.statistics().partitions}
            if all(committed.get(p) == end for p, end in ends.items() if end > 0):
                break
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{row}: commits did not reach {ends}: {committed}")
            time.sleep(0.002)
        finished = time.perf_counter()
        stats = pc.statistics()
    finally:
        pc.close()
    assert recorder.first_call is not None
    seen = recorder.seen()
    missing = n - len(seen)
    if missing:
        raise RuntimeError(f"{row}: {missing} records never processed")
    duplicates = sum(count - 1 for count in seen.values())
    order_ok = options.ordering is ProcessingOrder.UNORDERED or recorder.ordered()
    ideal = ideal_time(recorder, options)
    return RunResult(
        row=row,
        records=n,
        wall=finished - recorder.first_call,
        startup=recorder.first_call - registered,
        ideal=ideal,
        duplicates=duplicates,
        order_ok=order_ok,
        extra={
            "service_total": sum(recorder.service().values()),
            "commits_acknowledged": stats.commits_acknowledged,
            "partition_pauses": stats.partition_pauses,
        },
    )


def ideal_time(recorder: Recorder, options: Options) -> float:
    c = options.max_concurrency
    lanes = recorder.service()
    total = sum(lanes.values())
    if options.ordering is ProcessingOrder.UNORDERED:
        return total / c
    if options.ordering is ProcessingOrder.PARTITION:
        per_partition: dict[int, float] = defaultdict(float)
        for (partition, _), s in lanes.items():
            per_partition[partition] += s
        return max(max(per_partition.values()), total / min(c, len(per_partition)))
    return max(max(lanes.values()), total / min(c, len(lanes)))


# -- workloads ------------------------------------------------------------------------------------


def w1(bootstrap: str, repeat: int) -> list[dict[str, Any]]:
    n = 10_000
    rows: list[tuple[str, ProcessingOrder, int]] = [("PARTITION", ProcessingOrder.PARTITION, 20)]
    rows += [(f"KEY-{k}", ProcessingOrder.KEY, k) for k in (1, 2, 5, 10, 20, 50, 100, 1000, 10000)]
    rows += [("UNORDERED", ProcessingOrder.UNORDERED, 20)]
    rng = random.Random(7)

    def work() -> None:
        time.sleep(random.randrange(5) / 1000)

    out = []
    for row, ordering, k in rows:
        topic = f"w1-{row.lower()}-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, partitions=1)
        produce(bootstrap, topic, [b"key-%d" % rng.randrange(k) for _ in range(n)], 1, 10)
        runs = [
            run_pc(
                bootstrap,
                topic,
                1,
                n,
                Options(ordering=ordering, max_concurrency=16, commit_interval=0.1),
                work,
                row,
            )
            for _ in range(repeat)
        ]
        out.append(summarise(runs, java=JAVA_W1[row]))
        print_row(out[-1])
    return out


def raw_rate(bootstrap: str, topic: str, n: int) -> float:
    """confluent-kafka consume(num_messages=500) with no work: the client's ceiling."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got = 0
    first = None
    try:
        while got < n:
            batch = consumer.consume(num_messages=500, timeout=1.0)
            if batch and first is None:
                first = time.perf_counter()
            got += len(batch)
        assert first is not None
        return n / (time.perf_counter() - first)
    finally:
        consumer.close()


def w2(bootstrap: str, repeat: int) -> list[dict[str, Any]]:
    n, partitions = 200_000, 8
    rng = random.Random(11)
    topic = f"w2-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions=partitions)
    produce(
        bootstrap, topic, [b"key-%d" % rng.randrange(10_000) for _ in range(n)], partitions, 100
    )
    raw = [raw_rate(bootstrap, topic, n) for _ in range(repeat)]
    raw_median = statistics.median(raw)
    print(f"W2 raw client: {raw_median:,.0f} records/s (runs {[round(r) for r in raw]})")
    out = [{"row": "raw", "records_per_s": raw_median, "runs": raw}]
    configs = [
        ("KEY", ProcessingOrder.KEY, 1),
        ("UNORDERED", ProcessingOrder.UNORDERED, 1),
        ("KEY batch=100", ProcessingOrder.KEY, 100),
        ("UNORDERED batch=100", ProcessingOrder.UNORDERED, 100),
    ]
    for row, ordering, batch in configs:
        options = Options(
            ordering=ordering,
            max_concurrency=16,
            batch_size=batch,
            commit_interval=0.5,
            max_buffered_records=max(10_000, 4 * 16 * batch),
        )
        runs = [
            run_pc(bootstrap, topic, partitions, n, options, lambda: None, row)
            for _ in range(repeat)
        ]
        summary = summarise(runs)
        rate = n / summary["wall_median"]
        summary["records_per_s"] = rate
        summary["ratio_to_raw"] = rate / raw_median
        summary["c_us"] = summary["wall_median"] / n * 1e6
        out.append(summary)
        print(
            f"W2 {row:<20} {rate:>9,.0f} records/s  ({rate / raw_median:.2f} of raw)  "
            f"c={summary['c_us']:.1f} µs/record  dup={summary['duplicates']} "
            f"order_ok={summary['order_ok']}"
        )
    return out


def summarise(runs: list[RunResult], java: float | None = None) -> dict[str, Any]:
    walls = [r.wall for r in runs]
    ideals = [r.ideal for r in runs]
    wall = statistics.median(walls)
    ideal = statistics.median(ideals)
    return {
        "row": runs[0].row,
        "wall_median": wall,
        "ideal_median": ideal,
        "ratio": wall / ideal if ideal else None,
        "startup_median": statistics.median(r.startup for r in runs),
        "c_us": max(0.0, (wall - ideal) / runs[0].records * 1e6),
        "java_published": java,
        "duplicates": sum(r.duplicates for r in runs),
        "order_ok": all(r.order_ok for r in runs),
        "runs": [asdict(r) | {"ratio": r.ratio} for r in runs],
    }


def print_row(s: dict[str, Any]) -> None:
    java = s["java_published"]
    java_text = f"java {java:6.2f}s ({java / s['ideal_median']:.2f}x)" if java else ""
    print(
        f"W1 {s['row']:<10} wall {s['wall_median']:7.3f}s  ideal {s['ideal_median']:7.3f}s  "
        f"ratio {s['ratio']:.3f}  start {s['startup_median']:.2f}s  "
        f"c {s['c_us']:6.1f}µs  dup {s['duplicates']}  order_ok {s['order_ok']}  {java_text}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["W1", "W2", "all"], default="all")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bootstrap", help="use this broker instead of an embedded LocalKafka")
    args = parser.parse_args(argv)
    broker = None
    if args.bootstrap:
        bootstrap = args.bootstrap
    else:
        broker = LocalKafka().start()
        bootstrap = broker.bootstrap_servers
    try:
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
            "repeat": args.repeat,
        }
        if args.workload in ("W1", "all"):
            results["W1"] = w1(bootstrap, args.repeat)
        if args.workload in ("W2", "all"):
            results["W2"] = w2(bootstrap, args.repeat)
    finally:
        if broker is not None:
            broker.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"engine-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2, default=str))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
