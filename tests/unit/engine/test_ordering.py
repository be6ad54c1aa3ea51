"""Given records with keys, when processed concurrently, then each ordering mode's promise holds."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict

import pytest

from parallel_consumer import Options, PollContext, ProcessingOrder


def produce_keyed(cluster, n: int, keys: int, partitions: int = 3) -> None:
    cluster.create_topic("t", partitions)
    for i in range(n):
        key = b"k%d" % (i % keys)
        cluster.produce("t", b"%d" % i, key=key, partition=i % partitions)


class Recorder:
    """Records each call and the concurrency per lane, from the worker threads."""

    def __init__(self, lane) -> None:
        self.lock = threading.Lock()
        self.lane = lane
        self.active: dict[object, int] = defaultdict(int)
        self.max_active_per_lane = 0
        self.max_active = 0
        self.total_active = 0
        self.order: dict[object, list[int]] = defaultdict(list)
        self.count = 0

    def __call__(self, ctx: PollContext) -> None:
        lanes = [self.lane(r) for r in ctx.records]
        with self.lock:
            for lane, r in zip(lanes, ctx.records, strict=True):
                self.active[lane] += 1
                self.max_active_per_lane = max(self.max_active_per_lane, self.active[lane])
                self.order[lane].append(r.offset)
            self.total_active += 1
            self.max_active = max(self.max_active, self.total_active)
        time.sleep(random.random() / 2000)
        with self.lock:
            for lane in lanes:
                self.active[lane] -= 1
            self.total_active -= 1
            self.count += len(lanes)


@pytest.mark.parametrize(("batch_size", "keys", "partitions"), [(1, 20, 3), (4, 20, 3), (1, 3, 1)])
def test_key_order_one_in_flight_per_key_in_offset_order(
    harness, cluster, wait_until, batch_size, keys, partitions
):
    # Given 2,000 records over a few partitions and keys
    produce_keyed(cluster, 2000, keys=keys, partitions=partitions)
    recorder = Recorder(lambda r: (r.partition, r.key))
    pc = harness.make(Options(ordering="key", max_concurrency=8, batch_size=batch_size))
    # When processed with 8 workers
    pc.poll(recorder)
    wait_until(lambda: recorder.count == 2000, what="all records")
    # Then no key ever had two records in flight, and each key saw its offsets in order
    assert recorder.max_active_per_lane == 1
    for offsets in recorder.order.values():
        assert offsets == sorted(offsets)
    # And work did run concurrently across keys
    assert recorder.max_active > 1


def test_partition_order_one_in_flight_per_partition(harness, cluster, wait_until):
    produce_keyed(cluster, 600, keys=50)
    recorder = Recorder(lambda r: r.partition)
    pc = harness.make(Options(ordering=ProcessingOrder.PARTITION, max_concurrency=8))
    pc.poll(recorder)
    wait_until(lambda: recorder.count == 600)
    assert recorder.max_active_per_lane == 1
    assert recorder.max_active <= 3
    for offsets in recorder.order.values():
        assert offsets == sorted(offsets)


def test_unordered_runs_one_key_concurrently(harness, cluster, wait_until):
    # Given a single key: KEY order would run it one at a time
    produce_keyed(cluster, 400, keys=1, partitions=1)
    recorder = Recorder(lambda r: r.key)
    pc = harness.make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=8))
    pc.poll(recorder)
    wait_until(lambda: recorder.count == 400)
    assert recorder.max_active_per_lane > 1


def test_null_keys_of_one_partition_share_one_lane(harness, cluster, wait_until):
    cluster.create_topic("t", 2)
    for i in range(200):
        cluster.produce("t", b"%d" % i, key=None, partition=i % 2)
    recorder = Recorder(lambda r: (r.partition, r.key))
    pc = harness.make(Options(ordering="key", max_concurrency=8))
    pc.poll(recorder)
    wait_until(lambda: recorder.count == 200)
    assert recorder.max_active_per_lane == 1
    assert set(recorder.order) == {(0, None), (1, None)}


def test_batches_hold_up_to_batch_size_records(harness, cluster, wait_until):
    produce_keyed(cluster, 300, keys=300, partitions=1)
    sizes: list[int] = []
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        with lock:
            sizes.append(len(ctx))
        if len(ctx) > 1:
            with pytest.raises(ValueError, match="holds"):
                _ = ctx.record

    pc = harness.make(Options(ordering="unordered", max_concurrency=2, batch_size=10))
    pc.poll(handle)
    wait_until(lambda: sum(sizes) == 300)
    assert max(sizes) == 10
    assert all(1 <= s <= 10 for s in sizes)


@pytest.mark.parametrize("ordering", ["key", "partition"])
def test_a_lane_never_runs_beside_a_stale_call_of_its_own_after_a_reassignment(
    harness, cluster, wait_until, ordering
):
    # Given two records of one key, the first call of offset 0 slow
    cluster.create_topic("t", 1)
    cluster.produce("t", b"a0", key=b"A", partition=0)
    cluster.produce("t", b"a1", key=b"A", partition=0)
    gate = threading.Event()
    lock = threading.Lock()
    running = [0]
    most = [0]
    ends: list[int] = []

    def handle(ctx: PollContext) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            first = ctx.offset == 0 and not ends and running[0] == 1
        if first:
            gate.wait(10)
        with lock:
            running[0] -= 1
            ends.append(ctx.offset)

    pc = harness.make(Options(ordering=ordering, max_concurrency=4))
    pc.poll(handle)
    wait_until(lambda: running[0] == 1)
    # When the partition is revoked and assigned back to this member while the call runs
    consumer = harness.consumers[0]
    consumer.rebalance(revoke=[("t", 0)])
    consumer.rebalance(assign=[("t", 0)])
    wait_until(lambda: [p.epoch for p in pc.statistics().partitions] == [2])
    gate.set()
    wait_until(lambda: ends.count(0) == 2 and 1 in ends)
    pc.close()
    # Then the lane never had two calls at once, and the new call of 0 ran after the stale one
    assert most[0] == 1
    assert ends[0] == 0


def test_null_keys_in_key_order_are_said_to_share_one_lane_once_per_partition(
    harness, cluster, wait_until, caplog
):
    # Given null-keyed records on two partitions, with calls long enough for lanes (no runs)
    cluster.create_topic("t", 2)
    for i in range(20):
        cluster.produce("t", b"%d" % i, key=None, partition=i % 2)
    done: list[int] = []

    def handle(ctx: PollContext) -> None:
        time.sleep(0.002)
        done.append(ctx.offset)

    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        pc = harness.make(Options(ordering="key", max_concurrency=8))
        pc.poll(handle)
        wait_until(lambda: len(done) == 20)
        pc.close()
    # Then one WARNING per partition says why they ran one at a time
    said = [r.getMessage() for r in caplog.records if "null key share one lane" in r.getMessage()]
    assert sorted(said) == [
        "t[0]: " + said[0].split(": ", 1)[1],
        "t[1]: " + said[0].split(": ", 1)[1],
    ]
