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
