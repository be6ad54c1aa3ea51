"""Bundles on the in-memory cluster with the real ThreadRunner, combined with the other
features: the stall policy, poll_and_produce in KEY order, close, batches, transactions with a
rebalance, dead letters and retries."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from lane_log import produce

from parallel_consumer import Options, PollContext, ProcessingOrder, ProducerRecord


def settled(pc) -> bool:
    c = pc._controller
    return not c._bundles and c._bundles.extra == 0 and not c._bundles.by_tp


def test_stall_dead_letter_of_a_hung_bundled_call(harness, cluster, clock, wait_until):
    produce(cluster, 1_500, keys=1_500, partitions=1)
    cluster.create_topic("dlq")
    done: set[int] = set()
    release = threading.Event()
    hung = 700

    def handle(ctx: PollContext) -> None:
        if ctx.offset == hung and ctx.attempts == 0:
            release.wait(30)
            return
        time.sleep(0.003)
        done.add(ctx.offset)

    pc = harness.make(
        Options(
            ordering=ProcessingOrder.UNORDERED,
            max_concurrency=4,
            stall_threshold=30,
            on_stall="dead_letter",
            dead_letter_topic="dlq",
            commit_interval=1000,
        ),
        clock=clock,
    )
    pc.poll(handle)
    try:
        wait_until(lambda: len(done) >= 1_499, timeout=60)
        assert pc.statistics().bundles > 0
        clock.advance(31)
        wait_until(lambda: pc.statistics().records_dead_lettered == 1, timeout=10)
    finally:
        release.set()
    wait_until(lambda: pc.statistics().in_flight == 0 and settled(pc), timeout=10)
    assert hung not in done
    assert len(cluster.records("dlq")) == 1


def test_poll_and_produce_in_key_order_with_bundles(harness, cluster, wait_until):
    produce(cluster, 2_000, keys=400, partitions=2)
    cluster.create_topic("out")
    active: dict[bytes, int] = defaultdict(int)
    overlaps: list[bytes] = []
    lock = threading.Lock()

    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=8))

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord:
        with lock:
            active[ctx.key] += 1
            if active[ctx.key] > 1:
                overlaps.append(ctx.key)
        time.sleep(0.003)
        with lock:
            active[ctx.key] -= 1
        return ProducerRecord("out", ctx.value, key=ctx.key)

    wait_until(lambda: pc.statistics().records_succeeded >= 2_000, timeout=60)
    stats = pc.statistics()
    assert stats.bundles > 0
    assert not overlaps
    out = cluster.records("out")
    assert len(out) == 2_000
    by_key: dict[bytes, list[int]] = defaultdict(list)
    for m in out:
        by_key[m.key()].append(int(m.value()))
    for key, values in by_key.items():
        assert values == sorted(values), key
    wait_until(lambda: settled(pc), timeout=5)


@pytest.mark.parametrize("drain", [True, False])
def test_close_with_bundles_out_leaves_nothing_counted(harness, cluster, wait_until, drain):
    produce(cluster, 3_000, keys=3_000, partitions=1)
    seen: list[int] = []

    def handle(ctx: PollContext) -> None:
        time.sleep(0.003)
        seen.append(ctx.offset)

    pc = harness.make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=8))
    pc.poll(handle)
    wait_until(lambda: len(seen) >= 400, timeout=60)
    assert pc.statistics().bundles > 0
    pc.close(drain=drain, timeout=30)
    assert settled(pc)
    assert len(seen) == len(set(seen))
    if drain:
        assert len(seen) == 3_000


def test_batch_size_two_with_bundles(harness, cluster, wait_until):
    produce(cluster, 2_000, keys=2_000, partitions=2)
    seen: list[int] = []
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        time.sleep(0.003)
        with lock:
            seen.extend((r.partition, r.offset) for r in ctx.records)

    pc = harness.make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=4, batch_size=2))
    pc.poll(handle)
    wait_until(lambda: len(seen) >= 2_000, timeout=60)
    assert pc.statistics().bundles > 0
    assert len(set(seen)) == len(seen) == 2_000
    wait_until(lambda: settled(pc), timeout=5)


def test_transactional_produce_with_bundles_and_a_rebalance(harness, cluster, wait_until):
    from parallel_consumer import CommitMode

    produce(cluster, 3_000, keys=3_000, partitions=4)
    cluster.create_topic("out")
    calls: dict[tuple[int, int], int] = defaultdict(int)
    lock = threading.Lock()

    def make():
        pc = harness.make(
            Options(
                commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
                ordering=ProcessingOrder.UNORDERED,
                max_concurrency=8,
                commit_interval=0.05,
            ),
            producer_config={"transactional.id": f"tx{len(harness.instances)}"},
        )

        @pc.poll_and_produce
        def handle(ctx: PollContext) -> ProducerRecord:
            with lock:
                calls[(ctx.partition, ctx.offset)] += 1
            time.sleep(0.003)
            return ProducerRecord("out", b"%d:%d" % (ctx.partition, ctx.offset))

        return pc

    first = make()
    wait_until(lambda: len(calls) >= 300, timeout=60)
    assert first.statistics().bundles > 0
    second = make()
    wait_until(lambda: len(calls) >= 3_000, timeout=60)
    for pc in (first, second):
        pc.close(timeout=30)
        assert settled(pc)


def test_dead_letters_and_retries_of_bundled_calls(harness, cluster, wait_until):
    produce(cluster, 2_000, keys=500, partitions=2)
    cluster.create_topic("dlq")
    attempts: dict[tuple[int, int], int] = defaultdict(int)
    ok: dict[bytes, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        with lock:
            attempts[(ctx.partition, ctx.offset)] += 1
        time.sleep(0.003)
        if ctx.offset % 7 == 0:
            raise KeyError("poison")  # non-retryable: dead-lettered at once
        if ctx.offset % 5 == 0 and ctx.attempts < 2:
            raise RuntimeError("again")  # max_retries=1: a second failure dead-letters it
        with lock:
            ok[(ctx.partition, ctx.key)].append(ctx.offset)

    pc = harness.make(
        Options(
            ordering=ProcessingOrder.KEY,
            max_concurrency=8,
            retry_delay=0,
            max_retries=1,
            non_retryable=(KeyError,),
            dead_letter_topic="dlq",
        )
    )
    pc.poll(handle)
    expected_dead = sum(1 for i in range(2_000) if (i // 2) % 7 == 0 or (i // 2) % 5 == 0)
    wait_until(lambda: pc.statistics().records_dead_lettered >= expected_dead, timeout=60)
    wait_until(
        lambda: pc.statistics().records_succeeded + pc.statistics().records_dead_lettered >= 2_000,
        timeout=60,
    )
    stats = pc.statistics()
    assert stats.bundles > 0
    assert stats.records_dead_lettered == expected_dead
    assert len(cluster.records("dlq")) == expected_dead
    for lane, offsets in ok.items():
        assert offsets == sorted(offsets), lane
    wait_until(lambda: settled(pc), timeout=5)
