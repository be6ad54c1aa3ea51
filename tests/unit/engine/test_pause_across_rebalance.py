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

RECORDS = 2000


@pytest.mark.parametrize("how", ["revoked", "lost"])
def test_a_partition_paused_when_revoked_runs_again_once_handed_back(
    harness, cluster, wait_until, how
):
    # Given records on two partitions in PARTITION order (one call per partition at a time)
    # and a buffer small enough that the engine pauses a partition whose backlog is over its
    # share
    cluster.create_topic("t", 2)
    with cluster._cond:
        for i in range(RECORDS):
            cluster.produce("t", b"%d" % i, key=b"k%d" % (i % 50), partition=i % 2)
    seen: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        time.sleep(0.0005)
        with lock:
            seen.add((ctx.partition, ctx.offset))

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
    paused = sorted(consumer.paused())
    if how == "revoked":
        consumer.rebalance(revoke=paused, assign=paused)
    else:
        consumer.lose(paused)
        consumer.rebalance(assign=paused)

    # Then every record still runs (watched through the handler, not statistics())
    def all_seen() -> bool:
        with lock:
            return len(seen) == RECORDS

    wait_until(all_seen, timeout=60, what="every record handled")


@pytest.mark.parametrize("how", ["revoked", "lost"])
def test_partitions_paused_by_a_stall_run_again_once_handed_back(harness, cluster, wait_until, how):
    # Given an engine full of records behind handlers that block: after a while the poller
    # pauses every partition so that the client can still serve the group
    cluster.create_topic("t", 2)
    with cluster._cond:
        for i in range(400):
            cluster.produce("t", b"%d" % i, key=b"k%d" % (i % 10), partition=i % 2)
    gate = threading.Event()
    seen: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        gate.wait()
        with lock:
            seen.add((ctx.partition, ctx.offset))

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
    if how == "revoked":
        consumer.rebalance(revoke=both, assign=both)
    else:
        consumer.lose(both)
        consumer.rebalance(assign=both)
    gate.set()

    # Then every record runs
    def all_seen() -> bool:
        with lock:
            return len(seen) == 400

    wait_until(all_seen, timeout=60, what="every record handled")
