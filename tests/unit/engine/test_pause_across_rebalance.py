"""A partition paused for back-pressure when it is revoked, and handed back to the same consumer.

librdkafka keeps a partition's pause across a revoke (the fake client does too): without a
resume as it leaves, a partition handed back came back paused while the engine took it for a
new, unpaused one, and it was never fetched again. Found by the chaos test with chains (a member
stopped handling two of its partitions for good after a rebalance).
"""

from __future__ import annotations

import threading
import time

import pytest

from parallel_consumer import Options, PollContext, ProcessingOrder


def produce(cluster, records: int, keys: int) -> None:
    cluster.create_topic("t", 2)
    with cluster._cond:
        for i in range(records):
            cluster.produce("t", b"%d" % i, key=b"k%d" % (i % keys), partition=i % 2)


class Seen:
    """The records handlers finished, as a user watches progress (not statistics())."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[tuple[int, int]] = set()

    def add(self, ctx: PollContext) -> None:
        with self._lock:
            self._seen.add((ctx.partition, ctx.offset))

    def count(self) -> int:
        with self._lock:
            return len(self._seen)


def hand_back(consumer, tps: list[tuple[str, int]], how: str) -> None:
    """Revoke (or lose) ``tps`` and assign them straight back to the same consumer."""
    if how == "revoked":
        consumer.rebalance(revoke=tps, assign=tps)
    else:
        consumer.lose(tps)
        consumer.rebalance(assign=tps)


@pytest.mark.parametrize("how", ["revoked", "lost"])
def test_a_partition_paused_when_revoked_runs_again_once_handed_back(
    harness, cluster, wait_until, how
):
    # Given records on two partitions in PARTITION order (one call per partition at a time)
    # and a buffer small enough that the engine pauses a partition whose backlog is over its
    # share
    produce(cluster, 2000, keys=50)
    seen = Seen()

    def handle(ctx: PollContext) -> None:
        time.sleep(0.0005)
        seen.add(ctx)

    pc = harness.make(
        Options(
            ordering=ProcessingOrder.PARTITION,
            max_concurrency=2,
            max_buffered_records=40,
            commit_interval=0.1,
        )
    )
    pc.poll(handle)
    consumer = harness.consumers[0]
    wait_until(lambda: consumer.paused(), timeout=30, what="a partition paused")

    # When a paused partition is revoked (or lost) and handed back to the same consumer
    hand_back(consumer, sorted(consumer.paused()), how)

    # Then every record still runs
    wait_until(lambda: seen.count() == 2000, timeout=60, what="every record handled")


@pytest.mark.parametrize("how", ["revoked", "lost"])
def test_partitions_paused_by_a_stall_run_again_once_handed_back(harness, cluster, wait_until, how):
    # Given an engine full of records behind handlers that block: after a while the poller
    # pauses every partition so that the client can still serve the group
    produce(cluster, 400, keys=10)
    gate = threading.Event()
    seen = Seen()

    def handle(ctx: PollContext) -> None:
        gate.wait()
        seen.add(ctx)

    pc = harness.make(
        Options(
            ordering=ProcessingOrder.KEY,
            max_concurrency=2,
            max_buffered_records=20,
            commit_interval=0.1,
        )
    )
    pc.poll(handle)
    consumer = harness.consumers[0]
    both = [("t", 0), ("t", 1)]
    wait_until(lambda: consumer.paused() == set(both), timeout=30, what="the stall pause")

    # When both are revoked (or lost) and handed straight back, and the handlers go on
    hand_back(consumer, both, how)
    gate.set()

    # Then every record runs
    wait_until(lambda: seen.count() == 400, timeout=60, what="every record handled")
