"""W4 (docs/benchmarks.md): poll_and_produce over 1,000,000 records (the Java library's large-volume
test): 1 partition, unique keys, KEY order, one output per input, no sleep.

Run: ``python benchmarks/produce_bench.py [--records 1000000] [--repeat 3] [--bootstrap ...]``.
For each commit mode (asynchronous consumer commits, transactional producer) it reports the
wall time on the docs/benchmarks.md clock (first record handed to the handler -> the input's last
offset committed and acknowledged), records/s and start-up; beside them, in the same run, the
rate of a plain confluent-kafka producer loop writing the same records (the ceiling: no
consuming, no engine). Every run checks its output: a ``read_committed`` reader must find each
input's output, and duplicates are counted (0 expected). One JSON file per invocation goes to
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer, Producer, TopicPartition

from parallel_consumer import (
    CommitMode,
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    ProducerRecord,
)
from parallel_consumer.hooks import NoHooks
from parallel_consumer.testing import LocalKafka, create_topic

RESULTS = Path(__file__).parent / "results"
MODES = (CommitMode.PERIODIC_CONSUMER_ASYNC, CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER)
VALUE = b"x" * 100


def produce_inputs(bootstrap: str, topic: str, n: int) -> float:
    """Write ``n`` records with unique keys; returns the time it took."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000}
    )
    started = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, VALUE, b"key-%d" % i, partition=0)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    return time.perf_counter() - started


def plain_producer_rate(bootstrap: str, topic: str, n: int) -> float:
    """The ceiling: a plain idempotent producer loop writing the same records, records/s from
    the first produce() to the last acknowledgement."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    started = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, VALUE, b"key-%d" % i)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120):
        raise RuntimeError("the plain producer did not deliver everything")
    return n / (time.perf_counter() - started)


class LastCommit(NoHooks):
    """Notes when the broker acknowledged a commit of ``end`` (no statistics() polling, which
    would wake the controller)."""

    def __init__(self, end: int) -> None:
        self.end = end
        self.at: float | None = None
        self.done = threading.Event()

    def on_commit(self, answers: Any) -> None:
        for answer in answers:
            if answer.error is None and answer.commit.offset >= self.end:
                self.at = time.perf_counter()
                self.done.set()


def check_outputs(bootstrap: str, topic: str, n: int) -> int:
    """Duplicates in the output as a read_committed reader sees it (every input must have an
    output). Keys are unique, so per-key order holds trivially and is not checked."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-w4-reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    seen: set[int] = set()
    duplicates = 0
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        while True:
            batch = consumer.consume(10_000, timeout=2.0)
            if not batch:
                raise RuntimeError(f"reading the output stopped at {len(seen)} of {n}")
            eof = False
            for message in batch:
                if message.error() is not None:
                    eof = True
                    continue
                index = int(message.key()[4:])
                if index in seen:
                    duplicates += 1
                    continue
                seen.add(index)
            if eof and len(seen) >= n:
                break
            if eof and len(seen) < n:
                raise RuntimeError(f"the output holds {len(seen)} of {n} inputs")
    finally:
        consumer.close()
    return duplicates


def run_pc(bootstrap: str, source: str, n: int, mode: CommitMode) -> dict[str, Any]:
    sink = f"w4-out-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, sink, partitions=1)
    group = f"bench-w4-{uuid.uuid4().hex[:8]}"
    last_commit = LastCommit(n)
    first_call: list[float] = []
    transactional = mode is CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER

    def handle(ctx: PollContext) -> ProducerRecord:
        if not first_call:
            first_call.append(time.perf_counter())
        return ProducerRecord(sink, ctx.value, key=ctx.key)

    pc = ParallelConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50,
        },
        Options(
            ordering=ProcessingOrder.KEY,
            max_concurrency=16,
            commit_mode=mode,
            # The asynchronous mode's default is 5 s; the clock stops at the last commit.
            commit_interval=None if transactional else 0.5,
        ),
        producer_config={"transactional.id": group} if transactional else None,
        hooks=last_commit,
    )
    pc.subscribe([source])
    registered = time.perf_counter()
    pc.poll_and_produce(handle)
    try:
        if not last_commit.done.wait(900):
            raise RuntimeError(f"{mode.name}: no commit of offset {n} in 900 s")
        stats = pc.statistics()
    finally:
        pc.close()
    assert last_commit.at is not None
    wall = last_commit.at - first_call[0]
    duplicates = check_outputs(bootstrap, sink, n)
    return {
        "mode": mode.name,
        "wall": wall,
        "records_per_s": n / wall,
        "startup": first_call[0] - registered,
        "duplicates": duplicates,
        "outputs_acknowledged": stats.outputs_acknowledged,
        "commits_acknowledged": stats.commits_acknowledged,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bootstrap", help="use this broker instead of an embedded LocalKafka")
    args = parser.parse_args(argv)
    kafka = None if args.bootstrap else LocalKafka().start()
    bootstrap = args.bootstrap or kafka.bootstrap_servers  # type: ignore[union-attr]
    try:
        n = args.records
        source = f"w4-in-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, source, partitions=1)
        took = produce_inputs(bootstrap, source, n)
        print(f"W4: {n:,} inputs written in {took:.1f} s")
        rows: dict[str, list[dict[str, Any]]] = {}
        ceiling: list[float] = []
        for run in range(args.repeat):
            for mode in (
                CommitMode.PERIODIC_CONSUMER_ASYNC,
                CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
            ):
                result = run_pc(bootstrap, source, n, mode)
                rows.setdefault(mode.name, []).append(result)
                print(
                    f"  run {run + 1} {mode.name:<32} {result['wall']:6.2f} s "
                    f"{result['records_per_s']:>9,.0f} rec/s  start-up {result['startup']:.2f} s  "
                    f"dup={result['duplicates']}"
                )
            plain = f"w4-plain-{uuid.uuid4().hex[:6]}"
            create_topic(bootstrap, plain, partitions=1)
            ceiling.append(plain_producer_rate(bootstrap, plain, n))
            print(f"  run {run + 1} plain producer loop              {ceiling[-1]:>9,.0f} rec/s")
        summary = {
            mode: {
                "wall_median": statistics.median(r["wall"] for r in results),
                "records_per_s_median": statistics.median(r["records_per_s"] for r in results),
                "startup_median": statistics.median(r["startup"] for r in results),
                "duplicates": sum(r["duplicates"] for r in results),
                "runs": results,
            }
            for mode, results in rows.items()
        }
        ceiling_median = statistics.median(ceiling)
        print(f"\nW4 medians of {args.repeat} ({n:,} records, 1 partition, unique keys, KEY):")
        for mode, s in summary.items():
            print(
                f"  {mode:<32} wall {s['wall_median']:6.2f} s  {s['records_per_s_median']:>9,.0f} "
                f"rec/s  ({s['records_per_s_median'] / ceiling_median:.2f} of the plain producer)"
            )
        print(
            f"  {'plain producer loop (ceiling)':<32}                {ceiling_median:>9,.0f} rec/s"
        )
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / f"produce-{time.strftime('%Y%m%dT%H%M%S')}.json"
        out.write_text(
            json.dumps(
                {
                    "workload": "W4",
                    "records": n,
                    "machine": {
                        "cores": os.cpu_count(),
                        "python": platform.python_version(),
                        "confluent_kafka": confluent_kafka.version()[0],
                        "librdkafka": confluent_kafka.libversion()[0],
                        "broker": "embedded LocalKafka" if kafka else args.bootstrap,
                    },
                    "plain_producer_records_per_s": ceiling,
                    "plain_producer_median": ceiling_median,
                    "modes": summary,
                },
                indent=2,
            )
        )
        print(f"wrote {out}")
    finally:
        if kafka is not None:
            kafka.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
