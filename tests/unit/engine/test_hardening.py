"""Regression tests for the guarantees a review broke (issue: core hardening), on the fakes.

Each test fails on the engine as it was before the fix. Progress is watched the way a user
would see it (handler calls), not by polling ``statistics()``, which wakes the controller and
can hide a stall.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message
from doubles import stepped_controller

from parallel_consumer import InternalError, NoHooks, Options, PollContext, Retry
from parallel_consumer._events import (
    Commit,
    PartitionsRevoked,
    RecordsPolled,
    RecordUnreadable,
    StopPoller,
)
from parallel_consumer.kafka import poller as poller_module
from parallel_consumer.kafka.poller import Poller
from parallel_consumer.testing.clock import FakeClock
from parallel_consumer.testing.fakes import FakeCluster
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit


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


def test_close_without_drain_starts_no_handler_call_after_it_returned(harness, cluster):
    # Given more batches than workers, every worker blocked in its call
    cluster.create_topic("t", 1)
    for i in range(50):
        cluster.produce("t", b"%d" % i, key=b"%d" % i, partition=0)
    release = threading.Event()
    started: list[float] = []
    running = threading.Semaphore(0)

    def handle(ctx: PollContext) -> None:
        started.append(time.monotonic())
        running.release()
        release.wait(10)

    pc = harness.make(Options(ordering="unordered", max_concurrency=4))
    pc.poll(handle)
    for _ in range(4):
        assert running.acquire(timeout=10)
    # When close(drain=False) gives up on the running calls
    pc.close(drain=False, timeout=0.1)
    closed_at = time.monotonic()
    # And the blocked calls then return, freeing every worker
    release.set()
    deadline = time.monotonic() + 10
    while (
        any(
            t.name.endswith(tuple(f"-worker-{i}" for i in range(4))) and t.is_alive()
            for t in threading.enumerate()
        )
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    # Then no call started after close() returned (the queued batches were taken back)
    assert [t for t in started if t > closed_at] == []
    assert len(started) == 4


def test_a_permanent_commit_error_stops_the_consumer_with_a_clear_error(harness, cluster):
    # Given a broker that rejects the offset map as too large
    cluster.create_topic("t", 1)
    for i in range(5):
        cluster.produce("t", b"%d" % i, partition=0)
    pc = harness.make(Options(commit_interval=0.05))
    pc.poll(lambda ctx: None)
    harness.consumers[0].fail_next_commits(100, code=KafkaError.OFFSET_METADATA_TOO_LARGE)
    # When the engine commits, Then it stops (rather than retrying forever) and says what to do
    with pytest.raises(InternalError, match="max_metadata_bytes"):
        pc.wait(timeout=20)
    assert isinstance(pc.failure, InternalError)


# -- the poller, driven by hand on the test thread ------------------------------------------------


class _Controller:
    """Plays the controller's part for a poller: answers a revoke with a final commit."""

    def __init__(self) -> None:
        self.poller: Poller | None = None
        self.events: list[Any] = []
        self.final_offset = 0

    def post(self, event: Any) -> None:
        self.events.append(event)
        if isinstance(event, PartitionsRevoked):
            assert self.poller is not None
            (tp,) = event.tps
            self.poller.send(_commit(tp, 1, self.final_offset, sync=True))
            event.reply.set_result(None)


def _commit(tp: tuple[str, int], epoch: int, offset: int, *, sync: bool = False) -> Commit:
    return Commit((OffsetCommit(tp, epoch, offset, ""),), sync=sync, reply=Future())


def _poller(cluster: FakeCluster, controller: _Controller) -> tuple[Poller, Any]:
    consumers = []

    def factory(config: dict[str, Any]) -> Any:
        consumers.append(cluster.consumer(config))
        return consumers[0]

    poller = Poller(
        factory,
        {"group.id": "g", "bootstrap.servers": "fake"},
        post=controller.post,
        limit=100,
        fetch_batch=10,
    )
    controller.poller = poller
    return poller, consumers[0]


def test_a_commit_queued_before_a_revoke_never_lands_after_the_revoke_commit():
    # Given partition t[0] assigned (epoch 1), with a periodic commit of 15 queued
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    controller = _Controller()
    controller.final_offset = 20
    poller, consumer = _poller(cluster, controller)
    tp = ("t", 0)
    poller._on_assign(consumer, [_kafka_tp(tp)])
    queued = _commit(tp, 1, 15)
    poller.send(queued)
    # When the partition is revoked before the poller ran its commands
    poller._on_revoke(consumer, [_kafka_tp(tp)])
    # And a commit planned before the revoke arrives after it
    late = _commit(tp, 1, 17)
    poller.send(late)
    poller._run_commands()
    # Then the queued commit ran before the final one, and the late one never reached the client
    assert [offset for _, offset, _ in consumer.commit_log] == [15, 20]
    assert cluster.committed("g", "t", 0) == (20, None)
    assert late.reply.result(0) == (
        CommitAnswer(late.offsets[0], "the partition is no longer assigned"),
    )


def test_a_record_the_client_cannot_read_stops_the_engine_instead_of_being_skipped():
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    controller = _Controller()
    poller, consumer = _poller(cluster, controller)
    poller._on_assign(consumer, [_kafka_tp(("t", 0))])
    corrupt = Message(topic="t", partition=0, offset=7, error=KafkaError(KafkaError._BAD_MSG))
    poller._hand_over([corrupt])
    assert [e for e in controller.events if isinstance(e, RecordUnreadable)] == [
        RecordUnreadable(("t", 0), 7, str(KafkaError(KafkaError._BAD_MSG)))
    ]


def test_a_consumed_batch_is_delivered_grouped_by_partition_in_offset_order():
    # Given a consume() result that interleaves two partitions, with a record of a partition
    # revoked meanwhile and an error in between
    cluster = FakeCluster()
    cluster.create_topic("t", 3)
    controller = _Controller()
    poller, consumer = _poller(cluster, controller)
    poller._on_assign(consumer, [_kafka_tp(("t", 0)), _kafka_tp(("t", 1))])
    messages = [
        Message(topic="t", partition=0, offset=5),
        Message(topic="t", partition=0, offset=6),
        Message(topic="t", partition=2, offset=0),  # not (or no longer) assigned
        Message(topic="t", partition=1, offset=9),
        Message(topic="t", partition=1, offset=-1, error=KafkaError(KafkaError._PARTITION_EOF)),
        Message(topic="t", partition=0, offset=7),
        Message(topic="t", partition=2, offset=1),
        Message(topic="t", partition=1, offset=10),
    ]
    poller._hand_over(messages)
    # Then one event carries each assigned partition's records, in order, and nothing else
    (polled,) = [e for e in controller.events if isinstance(e, RecordsPolled)]
    assert {tp: [m.offset() for m in batch] for tp, (_, batch) in polled.batches.items()} == {
        ("t", 0): [5, 6, 7],
        ("t", 1): [9, 10],
    }
    assert poller._assigned.delivered_to == {("t", 0): 8, ("t", 1): 11}
    assert poller._assigned.first_seen == {("t", 0): 5, ("t", 1): 9}


def _kafka_tp(tp: tuple[str, int]) -> Any:
    from confluent_kafka import TopicPartition

    return TopicPartition(*tp)


# -- the controller, stepped by hand --------------------------------------------------------------


def test_close_keeps_answering_a_revoke_while_it_waits_for_the_poller():
    # Given a controller that has committed and is waiting for the poller to stop
    controller = stepped_controller(FakeClock())
    controller.request("close", drain=False, timeout=0)
    started = time.monotonic()
    for _ in range(5):
        assert not controller.run_once(block=False)
    # When the poller, inside a revoke callback, asks for the final commit
    reply: Future[None] = Future()
    controller.post(PartitionsRevoked((("t", 0),), reply))
    controller.run_once(block=False)
    # Then it is answered at once, not after the controller gave up waiting for the poller
    assert reply.done()
    assert time.monotonic() - started < 1


def test_a_revoke_during_close_still_runs_its_final_commit_after_a_stop_request():
    # Given a poller inside a revoke callback, with a StopPoller queued before the controller's
    # final commit for the revoked partition (close and rebalance at the same time)
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    controller = _Controller()
    controller.final_offset = 9
    poller, consumer = _poller(cluster, controller)
    tp = ("t", 0)
    poller._on_assign(consumer, [_kafka_tp(tp)])
    poller.send(StopPoller())
    # When the partition is revoked
    poller._on_revoke(consumer, [_kafka_tp(tp)])
    # Then the final commit still reached the client
    assert cluster.committed("g", "t", 0) == (9, None)


def test_the_poller_refuses_commands_from_another_thread(harness, cluster, wait_until):
    cluster.create_topic("t", 1)
    pc = harness.make(Options())
    pc.poll(lambda ctx: None)
    wait_until(lambda: pc.statistics().poller.assigned_partitions == 1)
    with pytest.raises(RuntimeError, match="must send it commands instead"):
        pc._poller._run_command(StopPoller())


# -- found by the adversarial review of the reshaped core ------------------------------------------


@pytest.mark.parametrize("ordering", ["unordered", "key"])
def test_a_blocked_partition_runs_holes_that_appear_above_its_first_limit(
    harness, cluster, wait_until, ordering
):
    # Given a tiny metadata limit, holes below the coming limit, and records in flight when the
    # partition gets blocked, some of which then fail (holes above the limit it was blocked at)
    cluster.create_topic("t", 1)
    for i in range(200):
        cluster.produce("t", b"%d" % i, key=b"%d" % i, partition=0)
    attempts: dict[int, int] = {}
    done: set[int] = set()
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        offset = ctx.offset
        with lock:
            attempts[offset] = attempts.get(offset, 0) + 1
            first = attempts[offset] == 1
        if offset in (3, 20, 40, 60) and first:
            raise Retry(delay=2.0)
        if offset >= 80:
            time.sleep(0.5)  # the work: in flight when the partition is blocked
            if offset in (85, 100, 120, 140) and first:
                raise Retry(delay=0.01)
        with lock:
            done.add(offset)

    pc = harness.make(
        Options(ordering=ordering, max_concurrency=64, max_metadata_bytes=16, commit_interval=0.05)
    )
    pc.poll(handle)
    # Then every record is handled (it used to stop at 156, the holes above 79 parked forever)
    wait_until(lambda: len(done) == 200, timeout=30, what="every record handled")
    pc.close()


def test_a_final_commit_that_fails_is_sent_again_before_close_returns(harness, cluster, wait_until):
    cluster.create_topic("t", 1)
    for i in range(100):
        cluster.produce("t", b"%d" % i, partition=0)
    done: list[int] = []
    pc = harness.make(Options(commit_interval=60))
    pc.poll(lambda ctx: done.append(ctx.offset))
    wait_until(lambda: len(done) == 100)
    # Given the broker fails the next commit with a retriable error
    harness.consumers[0].fail_next_commits(1)
    # When the consumer closes
    pc.close()
    # Then the final commit was retried and landed
    assert cluster.committed("g", "t", 0) == (100, None)


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


def test_a_slow_call_start_hook_cannot_start_a_call_after_close_returned(harness, cluster):
    class SlowStart(NoHooks):
        def on_call_start(self, batch: int, context: PollContext) -> None:
            time.sleep(0.3)  # the hook's work, between the runner's gate and the call

    cluster.create_topic("t", 1)
    for i in range(200):
        cluster.produce("t", b"%d" % i, partition=0)
    started: list[float] = []
    pc = harness.make(Options(ordering="unordered", max_concurrency=4), hooks=SlowStart())
    pc.poll(lambda ctx: started.append(time.monotonic()))
    deadline = time.monotonic() + 10
    while len(started) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    pc.close(drain=False, timeout=0.1)
    closed_at = time.monotonic()
    deadline = time.monotonic() + 5
    while any("-worker-" in t.name and t.is_alive() for t in threading.enumerate()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert [t for t in started if t > closed_at] == []


def test_a_stricter_second_close_takes_effect(harness, cluster):
    # Given a draining close waiting on a blocked handler (30 s default timeout)
    cluster.create_topic("t", 1)
    for i in range(20):
        cluster.produce("t", b"%d" % i, partition=0)
    gate = threading.Event()
    pc = harness.make(Options(ordering="partition"))
    pc.poll(lambda ctx: gate.wait(20))
    first = threading.Thread(target=pc.close, kwargs={"drain": True})
    first.start()
    try:
        # When a second close asks for no drain and 0.5 s
        started = time.monotonic()
        pc.close(drain=False, timeout=0.5)
        # Then it returns within its own bound, and so does the first
        assert time.monotonic() - started < 12
        first.join(5)
        assert not first.is_alive()
    finally:
        gate.set()
        first.join(10)


def test_a_hook_raising_system_exit_does_not_strand_records(harness, cluster, wait_until):
    class Exits(NoHooks):
        def on_call_end(self, batch: int, context: PollContext, error: object) -> None:
            raise SystemExit(1)

    cluster.create_topic("t", 1)
    for i in range(20):
        cluster.produce("t", b"%d" % i, partition=0)
    done: list[int] = []
    pc = harness.make(Options(ordering="partition"), hooks=Exits())
    pc.poll(lambda ctx: done.append(ctx.offset))
    wait_until(lambda: len(done) == 20)
    pc.close()
    assert cluster.committed("g", "t", 0) == (20, None)


def test_a_lost_commit_answer_does_not_hold_up_close(harness, cluster, wait_until, monkeypatch):
    # (commits wait behind an unanswered one until the poller gives up on its answer)
    monkeypatch.setattr(poller_module, "COMMIT_ANSWER_TIMEOUT", 0.5)
    # Given periodic commits whose answers the client never delivers: one at 5 while record 5
    # runs, then one at 10
    cluster.create_topic("t", 1)
    for i in range(10):
        cluster.produce("t", b"%d" % i, partition=0)
    release = threading.Event()
    done: list[int] = []

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 5:
            release.wait(10)
        done.append(ctx.offset)

    pc = harness.make(Options(ordering="partition", commit_interval=0.05))
    harness.consumers[0].lose_next_commit_answers(1000)
    pc.poll(handle)
    wait_until(lambda: pc.statistics().commits_sent >= 1)
    release.set()
    wait_until(lambda: len(done) == 10)
    wait_until(lambda: pc.statistics().commits_sent >= 2)
    # When it closes (the final commit is synchronous, so its answer comes)
    started = time.monotonic()
    pc.close()
    # Then close does not wait for the lost answers (it took the whole 10 s final-commit budget)
    assert time.monotonic() - started < 5
    assert cluster.committed("g", "t", 0) == (10, None)
