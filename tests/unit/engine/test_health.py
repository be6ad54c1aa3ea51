"""Given a record that holds its partition, then pc.health() reports the partition stalled
exactly at Options.stall_threshold, and Options.on_stall acts (WARN once per episode, STOP,
DEAD_LETTER). On the fakes with an injected clock; commits are kept out of the way
(commit_interval=1000), because a committed offset that moves restarts the stall clock."""

from __future__ import annotations

import logging
import threading

import pytest
from doubles import blocked_partition

from parallel_consumer import (
    Lifecycle,
    NoHooks,
    Options,
    PartitionStall,
    PartitionStalled,
    PollContext,
)
from parallel_consumer.dead_letter import Reason, read_dead_letter


class StallHooks(NoHooks):
    def __init__(self) -> None:
        self.stalls: list[PartitionStall] = []

    def on_partition_stall(self, stall: PartitionStall) -> None:
        self.stalls.append(stall)


def test_health_reports_a_blocked_partition_stalled_exactly_at_the_threshold(
    harness, cluster, clock, wait_until, caplog
):
    # Given t[0]'s first record blocks, everything else finishes, stall_threshold=60
    handle, release, calls = blocked_partition(cluster)
    hooks = StallHooks()
    pc = harness.make(Options(stall_threshold=60, commit_interval=1000), clock=clock, hooks=hooks)
    pc.poll(handle)
    wait_until(lambda: len(calls) == 3)
    # When 59.9 s pass, then the consumer is healthy, and t[0] shows its oldest unfinished
    # record and its age
    clock.advance(59.9)
    report = pc.health()
    assert report.healthy, report.reasons
    p0 = next(p for p in report.partitions if p.partition == 0)
    p1 = next(p for p in report.partitions if p.partition == 1)
    assert (p0.oldest_incomplete_offset, p0.in_flight, p0.stalled) == (0, 1, False)
    assert p0.oldest_incomplete_age == pytest.approx(59.9)
    assert (p1.oldest_incomplete_offset, p1.oldest_incomplete_age) == (None, None)
    # When the threshold is reached
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        clock.advance(0.1)
        wait_until(lambda: hooks.stalls, what="the stall report")
        # Then t[0] (only) is reported stalled, with the record holding it
        report = pc.health()
        assert not report.healthy
        assert report.stalled_partitions == (("t", 0),)
        assert "t[0] stalled: offset 0" in report.reasons[0]
        assert hooks.stalls[0].offset == 0
        assert hooks.stalls[0].action == "warn"
        assert pc.statistics().partition_stalls == 1
        # ... once per episode: more time passing reports nothing new
        clock.advance(600)
        pc.health()
        assert len(hooks.stalls) == 1
    warnings = [r for r in caplog.records if "stalled" in r.getMessage()]
    assert len(warnings) == 1
    assert "t[0] stalled: offset 0" in warnings[0].getMessage()
    # When the record finishes, then the episode is over and the consumer healthy again
    release.set()
    wait_until(lambda: pc.statistics().records_succeeded == 3)
    report = pc.health()
    assert report.healthy, report.reasons
    assert report.stalled_partitions == ()


def test_a_new_episode_is_reported_again(harness, cluster, clock, wait_until):
    # Given a record that fails for a long time (a retry delay above the threshold)
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"a")
    cluster.produce("t", b"y", key=b"a")
    attempts: list[tuple[bytes, int]] = []

    def handle(ctx: PollContext) -> None:
        attempts.append((ctx.value or b"", ctx.attempts))
        if ctx.attempts == 0:
            raise RuntimeError("down")

    hooks = StallHooks()
    pc = harness.make(
        Options(stall_threshold=10, retry_delay=15, commit_interval=1000),
        clock=clock,
        hooks=hooks,
    )
    pc.poll(handle)
    wait_until(lambda: attempts == [(b"x", 0)])
    # When it waits for its retry past the threshold, then t[0] is stalled on offset 0
    clock.advance(10)
    wait_until(lambda: len(hooks.stalls) == 1)
    assert hooks.stalls[0].offset == 0
    # When offset 0 finishes and offset 1 then holds the partition as long, then that is a
    # second episode
    clock.advance(5)
    wait_until(lambda: len(attempts) == 3)  # x retried, then y's first attempt failed
    clock.advance(10)
    wait_until(lambda: len(hooks.stalls) == 2)
    assert hooks.stalls[1].offset == 1


def test_on_stall_stop_stops_the_consumer_with_the_reason(harness, cluster, clock, wait_until):
    handle, release, calls = blocked_partition(cluster)
    pc = harness.make(
        Options(stall_threshold=30, on_stall="stop", commit_interval=1000), clock=clock
    )
    pc.poll(handle)
    wait_until(lambda: len(calls) == 3)
    # When the threshold passes
    clock.advance(30)
    wait_until(lambda: pc.failure is not None)
    release.set()  # let the hung call end so the workers stop
    # Then the consumer stopped with PartitionStalled naming the partition and the record
    with pytest.raises(PartitionStalled) as raised:
        pc.wait(20)
    failure = raised.value
    assert (failure.topic, failure.partition, failure.offset) == ("t", 0, 0)
    assert failure.stalled_for == pytest.approx(30)
    assert "stall_threshold=30.0s" in str(failure)
    report = pc.health()
    assert report.lifecycle is Lifecycle.CLOSED
    assert not report.healthy
    assert report.failure is not None
    assert "PartitionStalled" in report.failure


def test_on_stall_dead_letter_dead_letters_the_record_holding_the_partition(
    harness, cluster, clock, wait_until
):
    # Given t[0]'s first record blocks in its handler call, on_stall=DEAD_LETTER
    handle, release, calls = blocked_partition(cluster)
    hooks = StallHooks()
    pc = harness.make(
        Options(
            stall_threshold=30,
            on_stall="dead_letter",
            retry_delay=0,
            commit_interval=1000,
            max_concurrency=2,
        ),
        clock=clock,
        hooks=hooks,
    )
    pc.poll(handle)
    wait_until(lambda: len(calls) == 3)
    # When the threshold passes
    clock.advance(30)
    # Then the record holding t[0] (offset 0) is written to the dead-letter topic with reason
    # "stalled" instead of running again; its hung call is abandoned (left to end)
    wait_until(lambda: len(cluster.records("t.dlq")) == 1)
    [letter] = cluster.records("t.dlq")
    info = read_dead_letter(letter.headers())
    assert info is not None
    assert (info.topic, info.partition, info.offset) == ("t", 0, 0)
    assert info.reason == Reason.STALLED
    assert info.error_type == "parallel_consumer.errors.DeadlineExceeded"
    assert "on_stall=DEAD_LETTER" in info.error_message
    wait_until(lambda: pc.statistics().records_dead_lettered == 1)
    assert hooks.stalls[0].action == "dead_letter"
    assert len(calls) == 3  # it never ran again
    release.set()
    wait_until(lambda: pc.statistics().overrunning_calls == 0)
    stats = pc.statistics()
    assert (stats.records_succeeded, stats.records_dead_lettered) == (2, 1)


def test_a_paused_consumer_does_not_stall(harness, cluster, clock, wait_until):
    # Given a record that waits because the consumer is paused
    cluster.create_topic("t")
    release = threading.Event()
    calls: list[int] = []

    def handle(ctx: PollContext) -> None:
        calls.append(ctx.offset)
        release.wait(30)

    hooks = StallHooks()
    pc = harness.make(Options(stall_threshold=10, commit_interval=1000), clock=clock, hooks=hooks)
    pc.poll(handle)
    cluster.produce("t", b"x", key=b"a")
    wait_until(lambda: calls == [0])
    pc.pause()
    # When the threshold passes while paused, then nothing is reported
    clock.advance(100)
    assert pc.health().stalled_partitions == ()
    # When resumed, then the clock starts again
    pc.resume()
    pc.statistics()
    clock.advance(9.9)
    assert pc.health().stalled_partitions == ()
    assert hooks.stalls == []
    clock.advance(0.1)
    wait_until(lambda: hooks.stalls)
    release.set()


def test_stall_detection_off(harness, cluster, clock, wait_until):
    handle, release, calls = blocked_partition(cluster)
    hooks = StallHooks()
    pc = harness.make(Options(stall_threshold=None), clock=clock, hooks=hooks)
    pc.poll(handle)
    wait_until(lambda: len(calls) == 3)
    clock.advance(10_000)
    report = pc.health()
    assert report.healthy
    assert report.stall_threshold is None
    p0 = next(p for p in report.partitions if p.partition == 0)
    assert p0.oldest_incomplete_offset == 0
    assert hooks.stalls == []
    release.set()


def test_health_before_start_and_after_close(harness, cluster, wait_until):
    cluster.create_topic("t")
    pc = harness.make(Options())
    report = pc.health()
    assert report.lifecycle is Lifecycle.NEW
    assert report.healthy
    assert report.partitions == ()
    pc.poll(lambda ctx: None)
    pc.close()
    report = pc.health()
    assert not report.healthy
    assert report.reasons == ("lifecycle is CLOSED",)


def test_on_stall_dead_letter_takes_a_record_waiting_for_its_retry(
    harness, cluster, clock, wait_until
):
    # Given a record that failed and waits 100 s for its retry, with stall_threshold=10
    cluster.create_topic("t")
    cluster.produce("t", b"x", key=b"a")
    attempts: list[int] = []

    def handle(ctx: PollContext) -> None:
        attempts.append(ctx.attempts)
        if ctx.attempts == 0:
            raise RuntimeError("down")

    hooks = StallHooks()
    pc = harness.make(
        Options(stall_threshold=10, on_stall="dead_letter", retry_delay=100, commit_interval=1000),
        clock=clock,
        hooks=hooks,
    )
    pc.poll(handle)
    wait_until(lambda: attempts == [0])
    wait_until(lambda: pc.statistics().retry_waiting == 1)
    # When the partition stalls, then the record holding it is taken out of the retry queue
    # and dead-lettered with its last error; its retry never runs
    clock.advance(10)
    wait_until(lambda: hooks.stalls)
    wait_until(lambda: len(cluster.records("t.dlq")) == 1)
    info = read_dead_letter(cluster.records("t.dlq")[0].headers())
    assert info is not None
    assert (info.offset, info.reason, info.attempts) == (0, Reason.STALLED, 1)
    assert (info.error_type, info.error_message) == ("builtins.RuntimeError", "down")
    wait_until(lambda: pc.statistics().records_dead_lettered == 1)
    clock.advance(100)
    assert pc.statistics().retry_waiting == 0
    assert attempts == [0]
    assert pc.statistics().deadline_exceeded == 0


def test_a_subscription_that_matches_no_topic_makes_health_unhealthy_after_the_bound(
    harness, cluster, wait_until, monkeypatch, caplog
):
    # Given a consumer subscribed to a misspelled topic only (the bound lowered for the test)
    monkeypatch.setattr("parallel_consumer.health.MISSING_TOPICS_UNHEALTHY_AFTER", 0.2)
    cluster.create_topic("orders")
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        pc = harness.make(Options(), topics=("ordres",))
        pc.poll(lambda ctx: None)
        # Then health() says so once the bound has passed, and one WARNING named it
        wait_until(lambda: not pc.health().healthy, what="unhealthy")
    report = pc.health()
    assert report.missing_topics == ("ordres",)
    assert any("matches no topic" in reason and "'ordres'" in reason for reason in report.reasons)
    assert caplog.text.count("'ordres' does not exist") == 1
    # And when the topic appears, the consumer is healthy again
    monkeypatch.setattr("parallel_consumer.kafka.topic_check.CHECK_EVERY", 0.05)
    cluster.create_topic("ordres")
    pc._poller._missing._next_check = 0.0  # (the next check comes at once, not in 5 s)
    wait_until(lambda: pc.health().healthy, what="healthy again")
    pc.close()
