"""Bundles: while calls are too long for chunks and many more records are ready than the
workers can start, a worker gets a few calls of different lanes at once
(docs/performance.md#bundles). First the controller alone, stepped by hand; then the engine
on the in-memory cluster with the real thread runner."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest
from confluent_kafka import Message
from doubles import BundleTaker, Durations, stepped_controller
from lane_log import Log, produce

from parallel_consumer import Options, PollContext, ProcessingOrder
from parallel_consumer._events import Control, RecordsPolled, WorkDone, WorkDoneMany
from parallel_consumer.testing.clock import FakeClock

TP = ("t", 0)


def stepped(
    service: float,
    records: int,
    *,
    keys: int | None = None,
    hooks: object = None,
    **options: object,
) -> tuple[object, BundleTaker, FakeClock]:
    """A stepped controller whose calls take ``service`` seconds, ``records`` records of t[0]
    polled (key ``k<offset % keys>``, or one key each) and one dispatch pass done."""
    runner = BundleTaker()
    clock = FakeClock()
    controller = stepped_controller(
        clock,
        hooks,
        options=Options(commit_interval=1000, **options),  # type: ignore[arg-type]
        runner=runner,
    )
    controller.dispatch.observe_service(service)
    messages = [
        Message(topic="t", partition=0, offset=o, key=b"k%d" % (o % keys if keys else o))
        for o in range(records)
    ]
    controller.post(RecordsPolled({TP: (1, messages)}))
    controller.run_once(block=False)
    return controller, runner, clock


def test_many_ready_records_of_milliseconds_go_out_in_bundles_that_hold_one_worker_each():
    # Given calls of 3 ms (4 fit in the 15 ms a bundle may take) and 100 records ready for 5
    # workers and backlog slots
    controller, runner, _ = stepped(0.003, 100, ordering=ProcessingOrder.UNORDERED)
    # Then each slot got a bundle of 4, and the engine counts 5 workers held
    assert [len(chunk) for chunk in runner.chunks] == [4] * 5
    assert not runner.singles
    assert len(controller.ledger.in_flight) - controller.dispatch.bundles.extra == 5
    assert controller.statistics().bundles == 5
    # And in offset order, each offset once
    offsets = [ctx.offset for chunk in runner.chunks for _, ctx in chunk]
    assert offsets == list(range(20))


def test_a_bundle_that_reports_frees_its_worker_for_the_next_one():
    controller, runner, clock = stepped(0.003, 100, ordering=ProcessingOrder.UNORDERED)
    first = runner.chunks[0]
    now = clock.monotonic()
    results = [(batch, (None,), None, now, False) for batch, _ in first]
    controller.post(WorkDoneMany(results, 0.003))
    controller.run_once(block=False)
    # One bundle ended: one more went out; nothing of the first is counted any more
    assert len(runner.chunks) == 6
    assert len(controller.ledger.in_flight) - controller.dispatch.bundles.extra == 5
    assert not any(batch in controller.dispatch.bundles for batch, _ in first)


def test_a_bundle_call_reported_alone_leaves_its_bundle():
    """A worker that took over the rest of a stuck bundle reports each call alone (WorkDone):
    the bundle holds its worker until every one of its calls is over, not longer."""
    controller, runner, clock = stepped(0.003, 100, ordering=ProcessingOrder.UNORDERED)
    first = runner.chunks[0]
    for batch, _ in first[1:]:
        controller.post(WorkDone(batch, (None,), None, clock.monotonic(), took=0.003))
    controller.run_once(block=False)
    assert controller.dispatch.bundles.extra == 4 * 3  # the 4 other bundles' extra calls
    controller.post(WorkDone(first[0][0], (None,), None, clock.monotonic(), took=0.003))
    controller.run_once(block=False)
    assert len(controller.ledger.in_flight) - controller.dispatch.bundles.extra == 5


def test_records_for_fewer_than_two_full_bundles_per_worker_go_out_one_by_one():
    # Given 5 slots: bundles of 2 need 20 records ready (BUNDLE_READY x 2 x 5)
    _, runner, _ = stepped(0.003, 19, ordering=ProcessingOrder.UNORDERED)
    assert not runner.chunks
    assert len(runner.singles) == 5
    _, runner, _ = stepped(0.003, 20, ordering=ProcessingOrder.UNORDERED)
    assert [len(chunk) for chunk in runner.chunks] == [2] * 5


@pytest.mark.parametrize(
    ("service", "why"),
    [(0.008, "two calls take longer than a bundle may"), (1e-5, "short calls go in chunks")],
)
def test_no_bundles_for_calls_too_long_or_too_short(service, why):
    controller, _, _ = stepped(service, 200, ordering=ProcessingOrder.UNORDERED)
    assert controller.statistics().bundles == 0, why


def test_no_bundles_with_a_processing_timeout():
    """A deadline measures the call, not its wait behind other calls of a bundle."""
    controller, runner, _ = stepped(
        0.003, 200, ordering=ProcessingOrder.UNORDERED, processing_timeout=10.0
    )
    assert not runner.chunks
    assert controller.statistics().bundles == 0


def test_no_bundles_when_the_buffer_is_too_small_for_them():
    # 5 slots: bundles of 2 hold up to 10 calls, at most half the buffer
    controller, _, _ = stepped(
        0.003, 9, ordering=ProcessingOrder.UNORDERED, max_concurrency=4, max_buffered_records=9
    )
    assert not controller.dispatch.modes.bundles
    controller, _, _ = stepped(
        0.003, 9, ordering=ProcessingOrder.UNORDERED, max_concurrency=4, max_buffered_records=20
    )
    assert controller.dispatch.modes.bundles


def test_in_key_order_a_bundle_holds_at_most_one_record_of_a_lane():
    # Given 300 records of 60 keys (5 each), calls of 3 ms
    _, runner, _ = stepped(0.003, 300, keys=60, ordering=ProcessingOrder.KEY)
    # Then the 5 slots got bundles of heads of distinct lanes; no key is twice in flight
    assert runner.chunks
    keys = [ctx.key for chunk in runner.chunks for _, ctx in chunk]
    assert len(keys) == len(set(keys))
    assert [ctx.offset for _, ctx in runner.chunks[0]] == [0, 1, 2, 3]


def test_a_bundled_call_is_timed_from_the_end_of_the_call_before_it():
    hooks = Durations()
    controller, runner, clock = stepped(0.003, 100, hooks=hooks, ordering=ProcessingOrder.UNORDERED)
    ids = [batch for batch, _ in runner.chunks[0]]
    start = clock.monotonic()
    ends = [start + 0.5, start + 0.503, start + 0.506, start + 0.509]
    controller.post(
        WorkDoneMany(
            [(i, (None,), None, end, False) for i, end in zip(ids, ends, strict=False)], 0.003
        )
    )
    controller.run_once(block=False)
    assert hooks.seen[ids[0]] == pytest.approx(0.5)
    for i in ids[1:]:
        assert hooks.seen[i] == pytest.approx(0.003)


def test_calls_of_bundles_given_back_on_close_leave_no_worker_held():
    controller, _, _ = stepped(0.003, 100, ordering=ProcessingOrder.UNORDERED)
    assert controller.dispatch.bundles
    controller.post(Control("close", Future(), drain=False, timeout=1.0))
    for _ in range(5):
        controller.run_once(block=False)
    assert not controller.dispatch.bundles
    assert controller.dispatch.bundles.extra == 0
    assert not controller.dispatch.bundles.by_tp


# -- the engine on the in-memory cluster, with the real thread runner ----------------------------


def test_bundles_keep_the_call_limit_and_key_order_through_failures(harness, cluster, wait_until):
    # Given 3,000 records of 600 keys on 2 partitions, calls of 3 ms, 8 workers, and a tenth
    # of first attempts failing
    produce(cluster, 3_000, keys=600)
    log = Log()

    def handle(ctx: PollContext) -> None:
        lane = (ctx.partition, ctx.key)
        log.enter(lane, ctx.offset)
        time.sleep(0.003)
        failed = ctx.attempts == 0 and ctx.offset % 10 == 3
        log.leave(lane, ctx.offset, not failed)
        if failed:
            raise RuntimeError("transient")

    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=8, retry_delay=0))
    pc.poll(handle)
    wait_until(lambda: log.count() >= 3_000, timeout=60)
    stats = pc.statistics()
    pc.close()
    # Then bundles went out; never more than 8 calls at once, never two of one key; every
    # record succeeded once, in offset order per key; the failed ones ran twice
    assert stats.bundles > 0
    assert log.most <= 8
    assert not log.overlaps
    for lane, offsets in log.succeeded.items():
        assert offsets == sorted(offsets), lane
    assert log.count() == 3_000
    assert {c for (_, o), c in log.calls.items() if o % 10 == 3} == {2}
    assert {c for (_, o), c in log.calls.items() if o % 10 != 3} == {1}


def test_a_hung_call_in_a_bundle_holds_only_its_own_record(harness, cluster, wait_until):
    # Given 2,000 unordered records, calls of 3 ms, and one call that hangs once bundles
    # are out
    produce(cluster, 2_000, keys=2_000, partitions=1)
    log = Log()
    release = threading.Event()
    hung = 600

    def handle(ctx: PollContext) -> None:
        log.enter(ctx.key, ctx.offset)
        if ctx.offset == hung:
            release.wait(60)
        else:
            time.sleep(0.003)
        log.leave(ctx.key, ctx.offset, True)

    pc = harness.make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=8))
    pc.poll(handle)
    try:
        # Then every other record finishes while it hangs (the records bundled behind it
        # were handed to other workers)
        wait_until(lambda: log.count() >= 1_999, timeout=60)
        assert pc.statistics().bundles > 0
        with log.lock:
            assert (b"k%d" % hung, hung) in log.calls
            assert all(hung not in offsets for offsets in log.succeeded.values())
    finally:
        release.set()
    wait_until(lambda: log.count() >= 2_000, timeout=30)
    pc.close()
    assert set(log.calls.values()) == {1}


def test_no_handler_call_starts_after_close_while_bundles_are_out(harness, cluster, wait_until):
    produce(cluster, 3_000, keys=3_000, partitions=1)
    log = Log()
    closed = threading.Event()
    late: list[int] = []

    def handle(ctx: PollContext) -> None:
        if closed.is_set():
            late.append(ctx.offset)
        log.enter(ctx.key, ctx.offset)
        time.sleep(0.003)
        log.leave(ctx.key, ctx.offset, True)

    pc = harness.make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=8))
    pc.poll(handle)
    wait_until(lambda: log.count() >= 500, timeout=60)
    assert pc.statistics().bundles > 0
    pc.close(drain=False)
    closed.set()
    time.sleep(0.1)
    assert not late
    assert log.count() < 3_000
