"""Dispatch of short and long calls: key order holds, every worker is used, and a hung call
holds only its own record (the reason adaptive chunked dispatch is off for now)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from parallel_consumer import Options, PollContext, ProcessingOrder
from parallel_consumer.work.sizing import ADAPTIVE_DISPATCH


def produce_keyed(cluster, n: int, keys: int, partitions: int = 4) -> None:
    cluster.create_topic("t", partitions)
    for i in range(n):
        cluster.produce("t", b"%d" % i, key=b"k%d" % (i % keys), partition=i % partitions)


def test_short_calls_keep_key_order(harness, cluster, wait_until):
    # Given many records of many keys and a handler far shorter than a thread hop
    produce_keyed(cluster, 20_000, keys=500)
    lock = threading.Lock()
    seen: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    active: dict[tuple[int, bytes], int] = defaultdict(int)
    overlaps = []

    def handle(ctx: PollContext) -> None:
        lane = (ctx.partition, ctx.key)
        with lock:
            active[lane] += 1
            if active[lane] > 1:
                overlaps.append(lane)
            seen[lane].append(ctx.offset)
            active[lane] -= 1

    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=8))
    pc.poll(handle)

    def all_seen() -> bool:
        with lock:
            return sum(len(v) for v in seen.values()) >= 20_000

    wait_until(all_seen, timeout=60)

    # Then each key ran one at a time in offset order, each record once
    assert not overlaps
    for offsets in seen.values():
        assert offsets == sorted(offsets)
    assert sum(len(v) for v in seen.values()) == 20_000
    if not ADAPTIVE_DISPATCH:
        assert pc.statistics().chunk_size == 1


def test_a_hung_call_holds_only_its_own_record(harness, cluster, wait_until):
    # Given short calls, except four records whose handler never returns (until released)
    produce_keyed(cluster, 4_000, keys=4_000, partitions=2)
    hung = {(0, 3), (0, 17), (1, 42), (1, 500)}
    release = threading.Event()
    done = [0]
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        if (ctx.partition, ctx.offset) in hung:
            release.wait(60)
            return
        with lock:
            done[0] += 1

    pc = harness.make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=8))
    pc.poll(handle)
    try:
        # Then every other record is processed while the four calls hang
        wait_until(lambda: done[0] == 4_000 - len(hung), timeout=60)
    finally:
        release.set()


def test_long_calls_go_one_by_one_so_every_worker_is_used(harness, cluster, wait_until):
    # Given calls that take 20 ms (far longer than a thread hop) on 8 workers
    produce_keyed(cluster, 64, keys=64)
    lock = threading.Lock()
    running = [0]
    most = [0]
    done = [0]

    def handle(ctx: PollContext) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
            done[0] += 1

    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=8))
    pc.poll(handle)
    wait_until(lambda: done[0] >= 64, timeout=30)

    # Then calls ran 8 at a time, one call per hand-over
    assert most[0] == 8
    assert pc.statistics().chunk_size == 1
