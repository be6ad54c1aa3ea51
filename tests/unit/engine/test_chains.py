"""Chains: a lane's next records run on the worker of the record before them, for calls of
about a millisecond (docs/performance.md#chains). The engine on the in-memory cluster with the
real thread runner."""

from __future__ import annotations

import threading
import time

import pytest
from lane_log import Log, produce

from parallel_consumer import Options, PollContext, ProcessingOrder


def test_calls_of_a_millisecond_run_in_chains_and_keep_key_order_through_failures(
    harness, cluster, wait_until
):
    # Given 1,500 records of 12 keys, calls of 1 ms, and a tenth of first attempts failing
    produce(cluster, 1_500, keys=12)
    log = Log()

    def handle(ctx: PollContext) -> None:
        lane = (ctx.partition, ctx.key)
        log.enter(lane, ctx.offset)
        time.sleep(0.001)
        failed = ctx.attempts == 0 and ctx.offset % 10 == 3
        log.leave(lane, ctx.offset, not failed)
        if failed:
            raise RuntimeError("transient")

    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=4, retry_delay=0))
    pc.poll(handle)
    wait_until(lambda: log.count() >= 1_500, timeout=60)
    stats = pc.statistics()
    pc.close()
    # Then records ran in chains, every record succeeded once, in offset order per key, never
    # two of one key at once, and the failed ones ran twice
    assert stats.chains > 0
    assert not log.overlaps
    for lane, offsets in log.succeeded.items():
        assert offsets == sorted(offsets), lane
    assert sum(len(v) for v in log.succeeded.values()) == 1_500
    assert {c for (_, o), c in log.calls.items() if o % 10 == 3} == {2}
    assert {c for (_, o), c in log.calls.items() if o % 10 != 3} == {1}
    assert stats.records_succeeded == 1_500


def test_a_hung_call_in_a_chain_holds_only_its_key(harness, cluster, wait_until):
    # Given one partition, 4 keys, calls of 1 ms, and one call that hangs after chains began
    produce(cluster, 800, keys=4, partitions=1)
    log = Log()
    release = threading.Event()
    hung = 401
    hung_key = b"k%d" % (hung % 4)

    def handle(ctx: PollContext) -> None:
        lane = ctx.key
        log.enter(lane, ctx.offset)
        if ctx.offset == hung:
            release.wait(60)
        else:
            time.sleep(0.001)
        log.leave(lane, ctx.offset, True)

    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=4))
    pc.poll(handle)
    try:
        # Then the other keys finish while it hangs, and its own key stops before it
        wait_until(lambda: log.count() >= 600 + hung // 4, timeout=60)
        time.sleep(0.05)
        with log.lock:
            assert all(o < hung for o in log.succeeded[hung_key])
            others = sum(len(v) for k, v in log.succeeded.items() if k != hung_key)
        assert others == 600
    finally:
        release.set()
    wait_until(lambda: log.count() >= 800, timeout=30)
    assert pc.statistics().chains > 0
    pc.close()
    assert not log.overlaps
    for lane, offsets in log.succeeded.items():
        assert offsets == sorted(offsets), lane


def test_chains_are_not_used_with_poll_and_produce_or_unordered(harness, cluster, wait_until):
    produce(cluster, 300, keys=3, partitions=1)

    def handle(ctx: PollContext) -> None:
        time.sleep(0.001)

    pc = harness.make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=4))
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded >= 300, timeout=30)
    assert pc.statistics().chains == 0
    pc.close()


def test_a_chained_call_is_timed_from_the_end_of_the_call_before_it():
    """Metrics (slow_after, processing time) and on_work_done time a call, not its wait behind
    the calls before it in its chain: a fast record after a slow one is not slow."""
    from confluent_kafka import Message
    from doubles import ChainTaker, Durations, stepped_controller

    from parallel_consumer._events import RecordsPolled, WorkDoneMany
    from parallel_consumer.testing.clock import FakeClock

    runner = ChainTaker()
    clock = FakeClock()
    hooks = Durations()
    options = Options(ordering=ProcessingOrder.PARTITION, commit_interval=1000)
    controller = stepped_controller(clock, hooks, options=options, runner=runner)
    controller.dispatch.observe_service(0.002)  # calls of 2 ms: chains
    tp = ("t", 0)
    messages = [Message(topic="t", partition=0, offset=o, key=b"k") for o in range(3)]
    controller.post(RecordsPolled({tp: (1, messages)}))
    controller.run_once(block=False)
    [chain] = runner.chains
    ids = [batch for batch, _ in chain]
    start = clock.monotonic()
    # The first call takes 5 s, the next two 1 ms each; the first two are reported early
    controller.post(
        WorkDoneMany(
            [
                (ids[0], (None,), None, start + 5.0, False),
                (ids[1], (None,), None, start + 5.001, False),
            ],
            0.002,
        )
    )
    controller.run_once(block=False)
    controller.post(WorkDoneMany([(ids[2], (None,), None, start + 5.002, False)], 0.002))
    controller.run_once(block=False)
    assert hooks.seen[ids[0]] == pytest.approx(5.0)
    assert hooks.seen[ids[1]] == pytest.approx(0.001)
    assert hooks.seen[ids[2]] == pytest.approx(0.001)


def test_no_call_of_a_revoked_partitions_chain_starts_after_the_revoke(
    harness, cluster, wait_until
):
    """A revoke takes back what chains of the partition have not started (the next owner
    starts from the revoke's commit: a chained call started after it would run beside the
    next owner's) and commits what they finished (found by a break test: 3-11 calls started
    after the revoke, and the final commit lagged the finished records by a chain)."""
    from parallel_consumer import NoHooks

    produce(cluster, 300, keys=1, partitions=1)
    revoked = threading.Event()
    after: list[int] = []
    calls: list[int] = []

    class Revokes(NoHooks):
        def on_rebalance(self, kind, partitions):
            if kind == "revoked":
                revoked.set()

    def handle(ctx: PollContext) -> None:
        if revoked.is_set():
            after.append(ctx.offset)
        calls.append(ctx.offset)
        time.sleep(0.001)

    pc = harness.make(
        Options(ordering=ProcessingOrder.PARTITION, max_concurrency=4, commit_interval=1000),
        hooks=Revokes(),
    )
    pc.poll(handle)
    wait_until(lambda: len(calls) >= 45, timeout=30)
    harness.consumers[0].rebalance(revoke=[("t", 0)])
    assert revoked.wait(10)
    in_progress = len(calls)
    wait_until(lambda: cluster.committed("g", "t", 0) is not None, timeout=10)
    # Then at most the call in progress at the revoke ran on, nothing started after it, and
    # the final commit covers what had finished (all but the call in progress)
    time.sleep(0.05)  # (a chained call that wrongly starts would start within 2 ms)
    assert len(after) <= 1, after
    committed, _ = cluster.committed("g", "t", 0)
    assert committed >= in_progress - 1
    assert pc.statistics().chains > 0
    pc.close()


def test_chains_stay_off_when_the_buffer_is_too_small_for_them(harness, cluster, wait_until):
    """A chain's records hold credit until it reports: with max_buffered_records at its
    smallest, chains out together would hold the whole buffer and the poller could not fetch
    (a break test measured half the throughput). Chains need room for two records per slot."""
    produce(cluster, 600, keys=3, partitions=3)
    done: list[int] = []

    def handle(ctx: PollContext) -> None:
        time.sleep(0.001)
        done.append(ctx.offset)

    small = Options(ordering=ProcessingOrder.PARTITION, max_concurrency=4, max_buffered_records=8)
    pc = harness.make(small)
    pc.poll(handle)
    wait_until(lambda: len(done) >= 600, timeout=30)
    assert pc.statistics().chains == 0
    pc.close()
