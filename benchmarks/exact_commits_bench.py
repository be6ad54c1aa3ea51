"""What an exact commit costs: ``python benchmarks/exact_commits_bench.py [--rounds N]``.

Starts a LocalKafka, joins a group with one member holding 8 partitions, and times, alternately
on that member, synchronous commits of 8 offset maps through confluent-kafka's ``commit()`` and
through ``ExactCommits`` (``kafka/exact_commits.py``), and the checks ``ready()`` runs before each
exact commit. Prints the medians of 50 commits per round, and the first ``ready()`` (library
loaded and probed, handle checked).

A script, not a test: on a shared machine the figures depend on the moment; compare the two
paths within one round.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid

from confluent_kafka import Consumer

from parallel_consumer.kafka.client_offsets import kafka_offset
from parallel_consumer.kafka.exact_commits import ExactCommits
from parallel_consumer.offsets import encode_offset_map
from parallel_consumer.testing import LocalKafka, create_topic
from parallel_consumer.work.commit_tracker import OffsetCommit

PARTITIONS = 8
COMMITS = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with LocalKafka() as kafka:
        topic = create_topic(
            kafka.bootstrap_servers, f"bench-{uuid.uuid4().hex[:8]}", partitions=PARTITIONS
        )
        consumer = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap_servers,
                "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "on_commit": lambda error, partitions: None,
            }
        )
        try:
            consumer.subscribe([topic])
            while len(consumer.assignment()) < PARTITIONS:
                consumer.consume(timeout=0.1)
            rng = random.Random(1)
            commits = []
            for partition in range(PARTITIONS):
                encoded = encode_offset_map(100, 3000, [100, *rng.sample(range(101, 3000), 40)])
                assert encoded is not None
                commits.append(OffsetCommit((topic, partition), 0, 100, encoded.metadata))
            exact = ExactCommits(consumer)
            started = time.perf_counter()
            assert exact.ready(), exact.unavailable
            print(f"first ready(): {1000 * (time.perf_counter() - started):.2f} ms")
            for round_ in range(args.rounds):
                through_confluent, through_exact, checks = [], [], []
                for _ in range(COMMITS):
                    started = time.perf_counter()
                    consumer.commit(offsets=[kafka_offset(c) for c in commits], asynchronous=False)
                    through_confluent.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    exact.ready()
                    checks.append(time.perf_counter() - started)
                    exact.commit(commits, asynchronous=False)
                    through_exact.append(time.perf_counter() - started)
                print(
                    f"round {round_}: sync commit of {PARTITIONS} maps, median of {COMMITS}: "
                    f"confluent-kafka {1000 * statistics.median(through_confluent):.2f} ms, "
                    f"exact {1000 * statistics.median(through_exact):.2f} ms "
                    f"(of which ready() {1e6 * statistics.median(checks):.0f} us)"
                )
        finally:
            consumer.close()


if __name__ == "__main__":
    main()
