"""The hooks seam: what the engine reports, on which thread, and that a broken hook is harmless."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import Message
from doubles import stepped_controller

from parallel_consumer import ConfigurationError, NoHooks, Options, PollContext, StallReport
from parallel_consumer._events import RecordsPolled
from parallel_consumer.hooks import active_hooks, guarded
from parallel_consumer.testing.clock import FakeClock
from parallel_consumer.work.stall import StallWatch


class Recorder(NoHooks):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def _add(self, name: str) -> None:
        with self.lock:
            self.calls.append((name, threading.current_thread().name))

    def on_dispatch(self, batch: int, context: PollContext) -> None:
        self._add("dispatch")

    def on_work_done(
        self, batch: int, errors: Sequence[BaseException | None], duration: float
    ) -> None:
        assert duration >= 0
        self._add("work_done")

    def on_commit(self, answers: Sequence[Any]) -> None:
        self._add("commit")

    def on_rebalance(self, kind: str, partitions: Sequence[Any]) -> None:
        self._add(f"rebalance:{kind}")

    def on_call_start(self, batch: int, context: PollContext) -> None:
        self._add("call_start")

    def on_call_end(self, batch: int, context: PollContext, error: BaseException | None) -> None:
        self._add("call_end")

    def names(self) -> set[str]:
        with self.lock:
            return {name for name, _ in self.calls}


def test_hooks_see_dispatch_calls_commits_and_rebalances_on_the_right_threads(
    harness, cluster, wait_until
):
    cluster.create_topic("t", 1)
    for i in range(3):
        cluster.produce("t", b"%d" % i, partition=0)
    hooks = Recorder()
    pc = harness.make(Options(commit_interval=0.05), hooks=hooks)
    pc.poll(lambda ctx: None)
    wait_until(lambda: {"commit", "call_end"} <= hooks.names())
    pc.close()
    threads = {}
    for name, thread in hooks.calls:
        role = "worker" if "-worker-" in thread else thread.rsplit("-", 1)[-1]
        threads.setdefault(name, set()).add(role)
    assert threads["dispatch"] == {"controller"}
    assert threads["work_done"] == {"controller"}
    assert threads["rebalance:assigned"] == {"controller"}
    assert threads["call_start"] == {"worker"}
    assert threads["call_end"] == {"worker"}


def test_a_hook_that_raises_is_logged_and_processing_goes_on(harness, cluster, wait_until):
    class Broken(NoHooks):
        def on_dispatch(self, batch: int, context: PollContext) -> None:
            raise RuntimeError("exporter down")

        def on_call_start(self, batch: int, context: PollContext) -> None:
            raise RuntimeError("tracer down")

    cluster.create_topic("t", 1)
    for i in range(5):
        cluster.produce("t", b"%d" % i, partition=0)
    done: list[int] = []
    pc = harness.make(Options(), hooks=Broken())
    pc.poll(lambda ctx: done.append(ctx.offset))
    wait_until(lambda: len(done) == 5)
    pc.close()


def test_hooks_missing_a_method_are_rejected_at_construction(harness):
    class Partial:
        def on_dispatch(self, batch: int, context: PollContext) -> None:
            pass

    with pytest.raises(ConfigurationError, match="on_work_done"):
        harness.make(Options(), hooks=Partial())


def test_the_stall_watch_reports_once_per_episode():
    watch = StallWatch(after=1.0)
    assert watch.observe(0.0, stalled=True) is None
    assert watch.wake_at() == 1.0
    assert watch.observe(0.5, stalled=True) is None
    assert watch.observe(1.5, stalled=True) == 1.5
    assert watch.observe(3.0, stalled=True) is None  # reported already
    assert watch.wake_at() is None
    assert watch.observe(3.1, stalled=False) is None
    assert watch.observe(4.0, stalled=True) is None  # a new episode starts
    assert watch.observe(5.0, stalled=True) == 1.0


def test_records_that_cannot_be_dispatched_are_reported_as_a_stall():
    # Given a controller whose shards (by an injected fault) never hand out a waiting record
    clock = FakeClock()
    reports: list[StallReport] = []

    class Hooks(NoHooks):
        def on_stall(self, report: StallReport) -> None:
            reports.append(report)

    controller = stepped_controller(clock, hooks=Hooks())
    controller._shards.take = lambda blocked: None  # type: ignore[method-assign]
    controller.post(RecordsPolled({("t", 0): (1, [Message(topic="t", partition=0, offset=0)])}))
    controller.run_once(block=False)
    # When a second passes without progress
    clock.advance(1.5)
    controller.run_once(block=False)
    # Then it is reported, once, and counted
    assert [r.waiting for r in reports] == [1]
    assert controller.statistics().stalls == 1


def test_the_engine_calls_only_the_hooks_an_object_implements(harness, cluster, wait_until):
    # Given hooks that implement on_commit only, through a NoHooks subclass
    calls: list[str] = []

    class OnlyCommits(NoHooks):
        def on_commit(self, answers: Sequence[Any]) -> None:
            calls.append("commit")

    hooks = OnlyCommits()
    assert active_hooks(hooks) == {"on_commit"}
    guarded_hooks = guarded(hooks)
    # Then the others stay the plain no-ops (nothing wraps them on the path of a record)
    assert guarded_hooks.on_work_done.__func__ is NoHooks.on_work_done  # type: ignore[attr-defined]
    assert guarded_hooks.on_success.__func__ is NoHooks.on_success  # type: ignore[attr-defined]
    # and an object that is not a NoHooks counts as implementing everything
    assert active_hooks(Recorder()) >= {"on_dispatch", "on_work_done"}
    assert active_hooks(type("Duck", (), {})()) == {
        name for name in dir(NoHooks) if name.startswith("on_")
    }
    assert active_hooks(NoHooks()) == set()
    cluster.create_topic("t")
    cluster.produce("t", b"x")
    pc = harness.make(Options(commit_interval=0.05), hooks=hooks)
    pc.poll(lambda ctx: None)
    wait_until(lambda: "commit" in calls)
    pc.close()


def test_partition_totals_count_every_assignment_and_stay_after_a_revoke(
    harness, cluster, wait_until
):
    # Given two partitions, and a first attempt of offset 1 of t[0] that fails
    cluster.create_topic("t", 2)
    for i in range(4):
        cluster.produce("t", b"%d" % i, partition=i % 2)
    pc = harness.make(Options(commit_interval=0.05, retry_delay=0))

    def handle(ctx: PollContext) -> None:
        if (ctx.partition, ctx.offset, ctx.attempts) == (0, 1, 0):
            raise ValueError("first attempt")

    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded == 4)
    # When t[0] is revoked, more records arrive, and it is assigned again
    consumer = harness.consumers[0]
    consumer.rebalance(revoke=[("t", 0)])
    wait_until(lambda: len(pc.statistics().partitions) == 1)
    cluster.produce("t", b"4", partition=0)
    cluster.produce("t", b"5", partition=1)
    consumer.rebalance(assign=[("t", 0)])
    wait_until(lambda: pc.statistics().records_succeeded == 6)
    totals = {
        (t.topic, t.partition): (t.succeeded, t.failed) for t in pc.statistics().partition_totals
    }
    pc.close()
    # Then the totals hold both assignments of t[0]
    assert totals == {("t", 0): (3, 1), ("t", 1): (3, 0)}


def test_a_hooks_object_with_an_attribute_named_active_still_gets_its_methods_called():
    """Claim: a user's hooks still get every method they implement (NoHooks
    subclasses and duck-typed objects, through guarded() and combine_hooks).

    Reproduction: a NoHooks subclass that overrides on_rebalance and keeps the partitions it
    was given in a frozenset attribute named ``active`` (a natural name for "partitions
    assigned now"). active_hooks() returns that attribute as the set of implemented hook
    methods, so guarded() (what ParallelConsumer installs) and combine_hooks() turn
    on_rebalance into the NoHooks no-op.

    Before the fix: on_rebalance is never called, through guarded() nor through combine_hooks().
    """
    from parallel_consumer import NoHooks
    from parallel_consumer.hooks import guarded
    from parallel_consumer.telemetry import combine_hooks

    class Assigned(NoHooks):
        def __init__(self) -> None:
            self.active: frozenset[tuple[str, int]] = frozenset()
            self.calls = 0

        def on_rebalance(self, kind: str, partitions: Any) -> None:
            self.calls += 1
            if kind == "assigned":
                self.active = self.active | set(partitions)

    mine = Assigned()
    guarded(mine).on_rebalance("assigned", [("t", 0)])
    combine_hooks(mine, Assigned()).on_rebalance("assigned", [("t", 1)])
    assert mine.calls == 2
    assert mine.active == {("t", 0), ("t", 1)}


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
