"""Two ParallelConsumers of one group, the second joining mid-run: nothing lost, few duplicates.

A record is processed twice only if it was inside a handler when its partition was revoked: its
result is then dropped as stale (``results_stale``) and the next owner runs it again. Records
that finished before the revoke are in the commit the revoke makes, so they never run again.
Duplicate counts are printed (run with ``-s``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from engine_support import Engines, Recorder, committed, end_offsets, wait_until

from parallel_consumer import Options, PollContext, ProcessingOrder
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka

PARTITIONS = (0, 1, 2, 3)
RECORDS = 4000


@pytest.fixture
def engines() -> Iterator[Engines]:
    started = Engines()
    yield started
    started.close_all()


@pytest.mark.kafka_requires("commit_metadata")  # the duplicate bound needs the offset map
@pytest.mark.parametrize("assignor", ["default", "cooperative-sticky"])
def test_second_instance_joining_mid_run_loses_nothing(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    assignor: str,
) -> None:
    # Given 4,000 records (100 keys) over 4 partitions, and instance A processing them with a
    # slowish handler (10 ms, 8 at a time: about 5 s of work)
    name = topic(len(PARTITIONS))
    produced = produce_records(
        kafka.bootstrap_servers,
        name,
        RECORDS,
        keys=[f"k{i}" for i in range(100)],
        partitions=list(PARTITIONS),
    )
    config = dict(consumer_config)
    if assignor != "default":
        config["partition.assignment.strategy"] = assignor
    options = Options(ordering=ProcessingOrder.KEY, max_concurrency=8, commit_interval=0.5)
    everything = Recorder(ProcessingOrder.KEY)  # both instances, in call order
    revokes: dict[str, list[list[int]]] = {"A": [], "B": []}
    lock = threading.Lock()

    def instance(label: str) -> tuple[Recorder, Any, Any]:
        mine = Recorder(ProcessingOrder.KEY)

        def handle(ctx: PollContext) -> None:
            with everything.call(ctx), mine.call(ctx):
                time.sleep(0.01)  # simulated work

        def on_revoke(_consumer: Any, partitions: list[Any]) -> None:
            if partitions:
                with lock:
                    revokes[label].append(sorted(p.partition for p in partitions))

        return mine, handle, on_revoke

    seen_a, handle_a, revoke_a = instance("A")
    seen_b, handle_b, revoke_b = instance("B")
    started = time.monotonic()
    a = engines.start(config, options, name, handle_a, on_revoke=revoke_a)
    wait_until(lambda: len(seen_a.seen) >= 200, timeout=30, what="A to process 200 records")

    # When instance B joins the group while A is mid-run
    b = engines.start(config, options, name, handle_b, on_revoke=revoke_b)
    wait_until(lambda: len(everything.seen) >= RECORDS, timeout=60, what=f"all {RECORDS} records")
    elapsed = time.monotonic() - started
    revoked_mid_run = len(revokes["A"])
    a.close()
    b.close()
    stats_a, stats_b = a.statistics(), b.statistics()

    # Then no record was lost, and B took over part of the work
    assert everything.seen == {(r.partition, r.offset) for r in produced}
    assert revoked_mid_run >= 1
    assert len(seen_b.seen) > 0
    # And each instance kept KEY order (one record per key at a time, in offset order)
    assert seen_a.overlaps == []
    assert seen_b.overlaps == []
    assert everything.out_of_order() == []
    # And the only duplicates are records whose results were dropped as stale at a revoke
    stale = stats_a.results_stale + stats_b.results_stale
    print(
        f"\n{assignor}: {RECORDS} records in {elapsed:.2f} s; A ran {len(seen_a.calls)}, "
        f"B ran {len(seen_b.calls)}; duplicates {everything.duplicates}, stale results {stale} "
        f"(A {stats_a.results_stale}, B {stats_b.results_stale}); revokes {revokes}"
    )
    assert everything.duplicates <= stale
    assert stale <= options.max_concurrency * (len(revokes["A"]) + len(revokes["B"]))
    # And the group's committed offsets are the ends of the partitions
    ends = end_offsets(kafka.bootstrap_servers, name, PARTITIONS)
    assert committed(config, name, PARTITIONS) == {p: (ends[p], "") for p in PARTITIONS}
