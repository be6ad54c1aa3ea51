"""Back-pressure on the fakes: the engine and the poller never hold more records than
``max_buffered_records``, also when a partition is assigned while no credit is left, and a
partition paused for back-pressure resumes as soon as there is room, not at the next commit.
Progress is watched the way a user would see it (handler calls), not by polling
``statistics()``, which wakes the controller and can hide a stall."""

from __future__ import annotations

import itertools
import threading
import time

from parallel_consumer import Options


def test_held_records_stay_within_the_bound_while_records_flow(harness, cluster, wait_until):
    # Given 5,000 records, a bound of 100 and a handler that finishes every record
    cluster.create_topic("t", 4)
    for i in range(5000):
        cluster.produce("t", b"%d" % i, key=b"%d" % (i % 50), partition=i % 4)
    done = []
    pc = harness.make(
        Options(ordering="key", max_concurrency=4, max_buffered_records=100, fetch_batch_size=50)
    )
    pc.poll(lambda ctx: done.append(ctx.offset))
    # When they flow through, sampled all along (with credit being returned and re-taken)
    most_held, least_poller_held = 0, 0
    deadline = time.monotonic() + 60
    while len(done) < 5000 and time.monotonic() < deadline:
        stats = pc.statistics()
        assert stats.poller is not None
        most_held = max(most_held, stats.held, stats.poller.held)
        least_poller_held = min(least_poller_held, stats.poller.held)
    # Then neither the engine nor the poller ever held more than 100, nor a negative count
    assert len(done) == 5000
    assert most_held <= 100, most_held
    assert least_poller_held >= 0
    pc.close()


def test_a_partition_paused_for_back_pressure_resumes_without_waiting_for_a_commit(
    harness, cluster, wait_until
):
    # Given PARTITION order, data in one of two partitions, a small buffer and a commit interval
    # far longer than the test (each stall would last until the next commit: 60 s)
    cluster.create_topic("t", 2)
    for i in range(1500):
        cluster.produce("t", b"%d" % i, partition=0)
    calls = []
    pc = harness.make(
        Options(
            ordering="partition",
            max_buffered_records=100,
            fetch_batch_size=50,
            commit_interval=60,
        )
    )
    pc.poll(lambda ctx: calls.append(time.monotonic()))
    # When it runs, watched only through the handler's calls
    wait_until(lambda: len(calls) == 1500, timeout=30, what="every record handled")
    # Then no gap between two calls came near a commit interval
    longest_gap = max(b - a for a, b in itertools.pairwise(calls))
    print(f"longest gap between handler calls: {longest_gap:.3f}s")
    assert longest_gap < 5
    pc.close()


def test_a_partition_assigned_while_no_credit_is_left_keeps_the_bound(harness, cluster, wait_until):
    # Given a full engine (8 of 8 held), every partition paused by the poller
    cluster.create_topic("t", 2)
    for i in range(100):
        cluster.produce("t", b"%d" % i, partition=0)
    gate = threading.Event()
    pc = harness.make(
        Options(ordering="unordered", max_concurrency=2, max_buffered_records=8, fetch_batch_size=4)
    )
    pc.poll(lambda ctx: gate.wait(30))
    wait_until(lambda: pc.statistics().poller.held == 8)
    wait_until(lambda: (pc.statistics().poller.waiting_for_credit or 0) > 1.2)
    consumer = harness.consumers[0]
    # When a partition with data is assigned inside a consume() (it is not paused yet)
    consumer.rebalance(revoke=[("t", 1)])
    wait_until(lambda: pc.statistics().poller.assigned_partitions == 1)
    cluster.produce("t", b"x", partition=1)
    consumer.rebalance(assign=[("t", 1)])
    wait_until(lambda: pc.statistics().poller.assigned_partitions == 2)
    # Then the engine keeps running within its bound, and the record runs once there is room
    assert pc.failure is None
    assert pc.statistics().held <= 8
    gate.set()
    wait_until(lambda: pc.statistics().records_succeeded == 101, timeout=30)
    pc.close()
