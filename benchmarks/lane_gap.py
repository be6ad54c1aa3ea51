"""The cost of one lane's hand-overs: a 2 ms handler on a single key (one record at a time), and
the gap between one call's end and the next call's start (result to the controller, next record
to a worker). Run: ``python benchmarks/lane_gap.py [--records 3000]`` (embedded broker)."""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

from confluent_kafka import Producer

from parallel_consumer import Options, ParallelConsumer, PollContext
from parallel_consumer.testing import LocalKafka, create_topic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=3000)
    n = parser.parse_args().records
    with LocalKafka() as kafka:
        bootstrap = kafka.bootstrap_servers
        create_topic(bootstrap, "lane", partitions=1)
        producer = Producer({"bootstrap.servers": bootstrap})
        for _ in range(n):
            producer.produce("lane", b"x", b"one-key")
        producer.flush(30)
        starts: list[float] = []
        ends: list[float] = []
        done = threading.Event()

        def handle(ctx: PollContext) -> None:
            starts.append(time.perf_counter())
            time.sleep(0.002)
            ends.append(time.perf_counter())
            if len(ends) >= n:
                done.set()

        pc = ParallelConsumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": uuid.uuid4().hex,
                "auto.offset.reset": "earliest",
            },
            Options(ordering="key", max_concurrency=16, commit_interval=0.1),
        )
        pc.subscribe(["lane"])
        pc.poll(handle)
        done.wait(300)
        pc.close()
    gaps = sorted(starts[i + 1] - ends[i] for i in range(len(ends) - 1))
    print(
        f"{n} records on one key: gap between a call's end and the next call's start: "
        f"median {statistics.median(gaps) * 1e6:.0f} µs, mean {statistics.mean(gaps) * 1e6:.0f} "
        f"µs, p90 {gaps[int(len(gaps) * 0.9)] * 1e6:.0f} µs"
    )


if __name__ == "__main__":
    main()
