"""A broker restart in the middle of a run: nothing is lost and commits reach the end.

Uses a broker of its own (the session broker is shared by every test), stopped at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from engine_support import (
    Engines,
    Recorder,
    committed,
    committed_in_engine,
    end_offsets,
    wait_until,
)

from parallel_consumer import Options, PollContext, ProcessingOrder
from parallel_consumer.testing import LocalKafka, create_topic, produce_records
from parallel_consumer.testing.local_kafka import choose_backend
from parallel_consumer.testing.pytest_plugin import KafkaBroker

pytestmark = pytest.mark.kafka

PER_PARTITION = 1000
HELD_FROM = 500  # records at or above this offset wait until the broker was restarted


@pytest.fixture
def engines() -> Iterator[Engines]:
    started = Engines()
    yield started
    started.close_all()


@pytest.fixture
def own_broker(kafka: KafkaBroker) -> Iterator[LocalKafka]:
    broker = LocalKafka(backend=choose_backend(kafka.backend)).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.mark.kafka_requires("restart", "persistence_across_restart")
def test_broker_restart_mid_run_loses_nothing_and_commits_the_end(
    own_broker: LocalKafka, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given 1,000 records in each of 2 partitions of a broker of our own, and a consumer that has
    # finished and committed the first half of each, while the rest waits behind a handler call
    # that is held (PARTITION order: one record per partition at a time)
    bootstrap = own_broker.bootstrap_servers
    name = create_topic(bootstrap, "pc-engine-broker-restart", partitions=2)
    produce_records(bootstrap, name, 2 * PER_PARTITION, partitions=[0, 1])
    config = {**consumer_config, "bootstrap.servers": bootstrap}
    after_restart = engines.gate()
    recorder = Recorder()

    def handle(ctx: PollContext) -> None:
        with recorder.call(ctx):
            if ctx.offset >= HELD_FROM:
                after_restart.wait()

    pc = engines.start(
        config, Options(ordering=ProcessingOrder.PARTITION, commit_interval=0.2), name, handle
    )

    wait_until(
        lambda: committed_in_engine(pc.statistics(), {0: HELD_FROM, 1: HELD_FROM}),
        timeout=30,
        what="offset 500 committed in both partitions",
        show=pc.statistics,
    )

    # When the broker restarts, and then the held records are let through
    own_broker.restart()
    print(f"\nbroker restart took {own_broker.start_seconds:.2f} s")
    after_restart.set()
    started = time.monotonic()

    # Then every record is processed and the commits reach the end of both partitions
    wait_until(
        lambda: len(recorder.seen) == 2 * PER_PARTITION, timeout=60, what="all 2,000 records"
    )
    wait_until(
        lambda: committed_in_engine(pc.statistics(), {0: PER_PARTITION, 1: PER_PARTITION}),
        timeout=30,
        what="offset 1000 committed in both partitions",
    )
    print(f"finished {time.monotonic() - started:.2f} s after the restart")
    stats = pc.statistics()
    pc.close()
    print(
        f"duplicates {recorder.duplicates}, commit failures {stats.commit_failures}, "
        f"stale {stats.results_stale}"
    )
    assert pc.failure is None
    assert recorder.seen == {(p, o) for p in (0, 1) for o in range(PER_PARTITION)}
    ends = end_offsets(bootstrap, name, [0, 1])
    assert ends == {0: PER_PARTITION, 1: PER_PARTITION}
    stored = committed(config, name, [0, 1])
    # (the group's offset never moves back behind an acknowledged one: docs/commits.md)
    assert stored == {0: (PER_PARTITION, ""), 1: (PER_PARTITION, "")}
