"""``pc demo``: process keyed records on a local broker and show what the library guarantees.

It starts an embedded broker (or uses ``--bootstrap``), produces keyed records, processes them with
a handler that waits a few milliseconds (simulated I/O) and fails now and then, and then checks
the result: every record processed, per-key order kept, committed offsets at the end of the topic.

Retries are routine here: the progress line counts them. The library itself logs a record's
failed attempts at INFO and warns only from its third failed attempt on (a record that keeps
failing), so a few routine retries print nothing.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from parallel_consumer import Options, ParallelConsumer, PollContext, ProcessingOrder
from parallel_consumer._arguments import Parser, positive, seconds
from parallel_consumer.cli.brokers import DEFAULT_TIMEOUT, reach
from parallel_consumer.testing import LocalKafka, create_topic, produce_records

__all__ = ["add_parser", "run"]


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text}")
    return value


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    demo = commands.add_parser("demo", help="process keyed records on a local broker")
    demo.add_argument("--records", type=positive, default=5000, help="records to produce")
    demo.add_argument("--keys", type=positive, default=100, help="distinct keys")
    demo.add_argument("--partitions", type=positive, default=3, help="partitions of the demo topic")
    demo.add_argument("--concurrency", type=positive, default=64, help="Options.max_concurrency")
    demo.add_argument(
        "--ordering",
        choices=[o.name for o in ProcessingOrder],
        default=ProcessingOrder.KEY.name,
        help="Options.ordering",
    )
    demo.add_argument(
        "--failure-rate",
        type=_fraction,
        default=0.01,
        help="share of records whose first attempt fails (and is retried)",
    )
    demo.add_argument("--bootstrap", help="use this broker instead of starting a local one")
    demo.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait for the --bootstrap broker's first answer",
    )


class _Handler:
    """Sleeps 1-5 ms per record and fails some first attempts; records what it saw."""

    def __init__(self, failure_rate: float) -> None:
        self.failure_rate = failure_rate
        self.lock = threading.Lock()
        self.lanes: dict[tuple[int, bytes | None], list[int]] = defaultdict(list)
        self.done: set[tuple[int, int]] = set()
        self.attempts = 0
        self.slept = 0.0
        self.first_call: float | None = None
        self.last_done = 0.0

    def __call__(self, ctx: PollContext) -> None:
        if self.first_call is None:
            self.first_call = time.perf_counter()
        record = ctx.record
        pause = random.uniform(0.001, 0.005)
        time.sleep(pause)
        with self.lock:
            self.attempts += 1
            self.slept += pause
        if record.attempts == 0 and random.random() < self.failure_rate:
            raise ConnectionError("simulated downstream failure (retried)")
        with self.lock:
            self.lanes[(record.partition, record.key)].append(record.offset)
            self.done.add((record.partition, record.offset))
            self.last_done = time.perf_counter()


def run(args: argparse.Namespace) -> int:
    broker = None
    if args.bootstrap:
        bootstrap = args.bootstrap
        reach(bootstrap, args.timeout)
    else:
        print("starting a local Apache Kafka broker ...", flush=True)
        broker = LocalKafka().start()
        bootstrap = broker.bootstrap_servers
        print(f"broker ready at {bootstrap} in {broker.start_seconds:.1f} s", flush=True)
    try:
        return _demo(args, bootstrap)
    finally:
        if broker is not None:
            broker.stop()


def _demo(args: argparse.Namespace, bootstrap: str) -> int:
    topic = f"demo-orders-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions=args.partitions)
    keys = [b"customer-%d" % random.randrange(args.keys) for _ in range(args.records)]
    # A fresh broker answers the first idempotent producer with "coordinator load in progress",
    # which the client retries by itself; keep its warning off the demo's output.
    produce_records(bootstrap, topic, args.records, keys=keys, producer_config={"log_level": 3})
    print(f"produced {args.records} records with {args.keys} keys to {topic}", flush=True)

    handler = _Handler(args.failure_rate)
    options = Options(
        ordering=ProcessingOrder[args.ordering],
        max_concurrency=args.concurrency,
        commit_interval=1.0,
        retry_delay=0.2,
    )
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": f"demo-{uuid.uuid4().hex[:6]}",
        "auto.offset.reset": "earliest",
    }
    started = time.perf_counter()
    with ParallelConsumer(config, options) as pc:
        pc.subscribe([topic])
        pc.poll(handler)
        while len(handler.done) < args.records:
            time.sleep(0.5)
            stats = pc.statistics()
            print(
                f"  {len(handler.done):>7}/{args.records} done  in flight {stats.in_flight:>4}  "
                f"waiting {stats.waiting:>6}  retry queue {stats.retry_waiting:>3}  "
                f"retries {stats.records_failed:>4}  commits {stats.commits_acknowledged}",
                flush=True,
            )
    return _report(args, bootstrap, config["group.id"], topic, handler, started)


def _report(
    args: argparse.Namespace,
    bootstrap: str,
    group: str,
    topic: str,
    handler: _Handler,
    started: float,
) -> int:
    in_order = all(offsets == sorted(offsets) for offsets in handler.lanes.values())
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(topic, p) for p in range(args.partitions)]
        committed = {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=10)}
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(args.partitions)
        }
    finally:
        consumer.close()
    ok = len(handler.done) == args.records and committed == ends
    if ProcessingOrder[args.ordering] is ProcessingOrder.KEY:
        ok = ok and in_order
    first = handler.first_call or started
    wall = max(handler.last_done - first, 1e-9)
    print()
    print(f"joined the group and fetched the first records in {first - started:.2f} s")
    print(
        f"processed {len(handler.done)} records in {wall:.2f} s from the first record to the "
        f"last ({args.records / wall:,.0f}/s)"
    )
    print(
        f"handler time {handler.slept:.1f} s in {handler.attempts} calls: one at a time that "
        f"is {handler.slept:.1f} s; with {args.concurrency} at once "
        f"{handler.slept / args.concurrency:.2f} s"
    )
    print(
        f"retried after failures: {handler.attempts - args.records} (logged at INFO; the "
        "library warns about a record from its third failed attempt on)"
    )
    print(f"per-key order kept: {in_order}")
    print(f"committed offsets {committed} == topic end {ends}: {committed == ends}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="pc demo")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["demo", *(argv or [])])
    return run(args)
