"""Bundles (several lanes' calls in one runner task) and the backlog kept for longest lanes
first: a bundle's reserve, the sizing of bundles from the records that can run (not revoked
lanes, not records of a blocked partition), the timing of a bundled call, and the final commit
of a revoke covering the calls a bundle finished or reported. Each failed on an earlier version
of bundles."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import Future

import pytest
from confluent_kafka import Message
from doubles import BundleTaker, Durations, StuckPoller, stepped_controller

from parallel_consumer import Options, PollContext, ProcessingOrder
from parallel_consumer._events import (
    Assignment,
    Commit,
    PartitionsAssigned,
    PartitionsRevoked,
    RecordsPolled,
    WorkDone,
    WorkDoneMany,
)
from parallel_consumer.engine.controller import Controller
from parallel_consumer.kafka.committers import ConsumerCommitter
from parallel_consumer.runners.base import RunnerFeatures
from parallel_consumer.runners.threads import ThreadRunner
from parallel_consumer.testing.clock import FakeClock
from parallel_consumer.work import sizing

TP = ("t", 0)
T_0, T_1 = ("t", 0), ("t", 1)


class Taker(BundleTaker):
    """Takes chains too (and runs nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.chains: list[list[tuple[int, PollContext]]] = []

    def submit_chain(self, calls: list[tuple[int, PollContext]]) -> None:
        self.chains.append(list(calls))

    def take_back_chain(self, chain: int) -> tuple[list[object], list[int]]:
        return [], []

    @property
    def features(self) -> RunnerFeatures:
        return RunnerFeatures(chunks=self, chains=self)


def test_a_bundle_left_open_by_chains_does_not_lend_its_reserve_to_them():
    """KEY order, calls of 3 ms, 100 ready lanes (> LONGEST_FIRST_LANES x slots: plain take):
    the first lane has one record (it opens a bundle, capacity += bundle - 1), the others two
    (chains). The chains use the bundle's reserve; the bundle stays at one call; the pass
    hands out more workers than the call limit (5)."""
    runner = Taker()
    controller = stepped_controller(
        FakeClock(),
        options=Options(ordering=ProcessingOrder.KEY, max_concurrency=4, commit_interval=1000),
        runner=runner,
    )
    assert controller.dispatch.modes.chains
    assert controller.dispatch.modes.bundles
    controller.dispatch.observe_service(0.003)
    messages = [Message(topic="t", partition=0, offset=0, key=b"single")]
    offset = 1
    for _ in range(2):
        for k in range(1, 100):
            messages.append(Message(topic="t", partition=0, offset=offset, key=b"k%d" % k))
            offset += 1
    controller.post(RecordsPolled({TP: (1, messages)}))
    controller.run_once(block=False)
    handed = len(runner.singles) + len(runner.chunks) + len(runner.chains)
    held = (
        len(controller.ledger.in_flight)
        - controller.dispatch.chains.extra
        - controller.dispatch.bundles.extra
    )
    assert held == handed
    assert handed <= controller.dispatch.call_limit(), (
        f"{handed} workers handed out for a call limit of {controller.dispatch.call_limit()}: "
        f"{len(runner.singles)} singles, {len(runner.chunks)} bundles, {len(runner.chains)} chains"
    )


# -- a revoke while a bundle is out: its finished calls are not covered by the final commit ------


def _threaded_stepped(handler, clock, reported, **options):
    """A stepped controller with a real thread runner; ``reported`` is set once the runner has
    posted a call's result (WorkDone or WorkDoneMany)."""
    opts = Options(commit_interval=1000, **options)
    poller = StuckPoller()
    runner = ThreadRunner(2, clock)
    controller = Controller(
        opts,
        runner=runner,
        poller=poller,
        committer=ConsumerCommitter(poller, opts.commit_mode),
        clock=clock,
    )
    post = controller.post

    def post_and_tell(event: object) -> None:
        post(event)  # type: ignore[arg-type]
        if isinstance(event, WorkDone | WorkDoneMany):
            reported.set()

    controller.post = post_and_tell  # type: ignore[method-assign]  # (the runner's done callback)
    controller.start(handler, thread=False)
    controller.post(PartitionsAssigned((Assignment(TP, 1, None, None),)))
    return controller, poller, runner


@pytest.mark.parametrize("bundles", [False, True])
def test_revoke_final_commit_covers_a_call_that_finished_before_it(monkeypatch, bundles):
    """Offset 0 returns at once; offset 1 blocks until after the revoke. Without bundles the
    call of offset 0 reports as soon as it returns and the revoke's final commit covers it
    (commits 1). In a bundle [0, 1, 2, 3] its result waits in the bundle until the bundle ends
    (or the stuck check): the final commit leaves it out and the next owner runs it again.
    Chains and runs settle their finished calls on revoke (_recall_chains, _settle_run);
    bundles do not."""
    monkeypatch.setattr(sizing, "BUNDLES", bundles)
    entered = threading.Event()
    release = threading.Event()

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 1:
            entered.set()
            release.wait(10)

    clock = FakeClock()
    reported = threading.Event()
    controller, poller, runner = _threaded_stepped(
        handle, clock, reported, ordering=ProcessingOrder.UNORDERED, max_concurrency=2
    )
    try:
        controller.run_once(block=False)
        controller.dispatch.observe_service(0.003)
        messages = [Message(topic="t", partition=0, offset=o, key=b"k%d" % o) for o in range(40)]
        controller.post(RecordsPolled({TP: (1, messages)}))
        controller.run_once(block=False)
        assert (controller.statistics().bundles > 0) == bundles
        assert entered.wait(5)  # (in a bundle, offset 0 returned before offset 1 began)
        if not bundles:
            # The single call of offset 0 ran on the other worker: wait until its WorkDone is
            # posted (a fixed 5 ms is not enough for that worker on a loaded machine)
            assert reported.wait(10)
        reply: Future[None] = Future()
        controller.post(PartitionsRevoked((TP,), reply))
        controller.run_once(block=False)
        assert reply.done()
        commits = [c for cmd in poller.commands if isinstance(cmd, Commit) for c in cmd.offsets]
        assert commits
        assert max(c.offset for c in commits) >= 1, commits
    finally:
        release.set()
        runner.stop(1.0)


# -- minor: a stuck bundle's calls run by other workers are timed from the bundle's hand-out ----


def test_a_bundle_call_run_by_another_worker_is_timed_as_the_call_itself():
    """Bundle [a, b, c, d]: a hangs; after STUCK_AFTER the runner hands b, c, d to other
    workers, each reported alone (WorkDone, took=3 ms). Their on_work_done duration (and the
    metrics' slow_after check) count from the bundle's hand-out: the 50 ms wait behind a, not
    the 3 ms call. (WorkDone.took, or finished_at - took, is at hand.)"""

    hooks = Durations()
    runner = Taker()
    clock = FakeClock()
    controller = stepped_controller(
        clock,
        hooks,
        options=Options(ordering=ProcessingOrder.UNORDERED, commit_interval=1000),
        runner=runner,
    )
    controller.dispatch.observe_service(0.003)
    messages = [Message(topic="t", partition=0, offset=o, key=b"k%d" % o) for o in range(100)]
    controller.post(RecordsPolled({TP: (1, messages)}))
    controller.run_once(block=False)
    ids = [batch for batch, _ in runner.chunks[0]]
    clock.advance(0.05)
    for batch in ids[1:]:
        controller.post(WorkDone(batch, (None,), None, clock.monotonic(), took=0.003))
    controller.run_once(block=False)
    for batch in ids[1:]:
        assert hooks.seen[batch] == pytest.approx(0.003, abs=0.002), hooks.seen


# -- minor: pause backlog of bundles counts calls of the first record's partition only ---------


def test_bundled_records_count_as_their_own_partitions_backlog_with_batches():
    """batch_size=2, UNORDERED, t[0] and t[1]: a call's batch holds one record of each
    partition (take is round-robin over partitions). Bundles.by_tp counts one per call, under
    the first record's partition: t[1]'s bundled records are no backlog of t[1], and t[0]'s
    count half. Chains count every record (batch_size 1)."""
    runner = Taker()
    controller = stepped_controller(
        FakeClock(),
        options=Options(ordering=ProcessingOrder.UNORDERED, batch_size=2, commit_interval=1000),
        runner=runner,
    )
    controller.post(PartitionsAssigned((Assignment(("t", 1), 1, None, None),)))
    controller.run_once(block=False)
    controller.dispatch.observe_service(0.003)
    batches = {
        tp: (1, [Message(topic="t", partition=tp[1], offset=o, key=None) for o in range(200)])
        for tp in (("t", 0), ("t", 1))
    }
    controller.post(RecordsPolled(batches))
    controller.run_once(block=False)
    assert runner.chunks
    in_bundles: dict[tuple[str, int], int] = {}
    for chunk in runner.chunks:
        for _, ctx in chunk:
            for r in ctx.records:
                tp = (r.topic, r.partition)
                in_bundles[tp] = in_bundles.get(tp, 0) + 1
    assert controller.dispatch.bundles.by_tp == in_bundles


# -- minor: lanes of a revoked partition still count as ready when bundles are sized -----------


def test_revoked_lanes_do_not_make_bundles_of_the_few_lanes_left():
    """KEY order, calls of 3 ms, 5 call slots. t[0] has 100 one-record lanes, t[1] has 8; t[0]
    is revoked before the next pass. ShardMap.ready_count() still counts t[0]'s removed lanes
    (they stay in the ready deque until a take passes them): the pass sizes bundles for 108
    ready lanes and hands t[1]'s 8 records out as two bundles of 4 on two workers, while three
    slots stay empty (with 8 ready lanes there would be no bundles: 5 singles)."""
    runner = Taker()
    controller = stepped_controller(
        FakeClock(),
        options=Options(ordering=ProcessingOrder.KEY, max_concurrency=4, commit_interval=1000),
        runner=runner,
    )
    # (chains or not: one record per lane here)
    controller.dispatch.modes = dataclasses.replace(controller.dispatch.modes, chains=False)
    controller.post(PartitionsAssigned((Assignment(("t", 1), 1, None, None),)))
    controller.run_once(block=False)
    controller.dispatch.observe_service(0.003)
    t0 = [Message(topic="t", partition=0, offset=o, key=b"a%d" % o) for o in range(100)]
    t1 = [Message(topic="t", partition=1, offset=o, key=b"b%d" % o) for o in range(8)]
    controller.post(RecordsPolled({("t", 0): (1, t0), ("t", 1): (1, t1)}))
    controller.post(PartitionsRevoked((("t", 0),), Future()))
    controller.run_once(block=False)
    handed = len(runner.singles) + len(runner.chunks)
    assert handed == controller.dispatch.call_limit(), (
        f"{[len(c) for c in runner.chunks]} bundles and {len(runner.singles)} singles "
        f"for 8 records and {controller.dispatch.call_limit()} slots"
    )


# -- records parked behind a blocked partition ---------------------------------------------------


def _play(controller, runner, clock, fail):
    """Report every call handed out (singles only), failing offsets for which fail() holds."""
    while runner.singles:
        calls, runner.singles[:] = list(runner.singles), []
        for batch, ctx in calls:
            err = RuntimeError("down") if fail(ctx) else None
            controller.post(WorkDone(batch, (err,), None, clock.monotonic()))
        controller.run_once(block=False)


def test_records_of_a_blocked_unordered_partition_do_not_size_bundles():
    """UNORDERED. t[0] is blocked (offset map too large: holes waiting for a 100 s retry) and
    holds 200 parked records; t[1] has 8 ready records, calls of 3 ms, 5 call slots.
    ready_count() is ShardMap.waiting, which counts t[0]'s parked records: the pass sizes
    bundles for 208 ready records and hands t[1]'s 8 out as two bundles of 4 on two workers,
    while three slots stay empty, for as long as t[0] stays blocked (nothing corrects it, unlike
    the KEY-order parked lanes a take drops from the ready queue)."""
    runner = BundleTaker()
    clock = FakeClock()
    controller = stepped_controller(
        clock,
        options=Options(
            ordering=ProcessingOrder.UNORDERED,
            commit_interval=1,
            retry_delay=100,
            max_metadata_bytes=16,
            spill_offset_maps=False,
        ),
        runner=runner,
    )
    controller.post(PartitionsAssigned((Assignment(T_1, 1, None, None),)))
    controller.post(
        RecordsPolled({T_0: (1, [Message(topic="t", partition=0, offset=o) for o in range(40)])})
    )
    controller.run_once(block=False)
    _play(controller, runner, clock, lambda ctx: ctx.offset % 4 == 1)
    clock.advance(1.1)
    controller.run_once(block=False)
    assert T_0 in controller.ledger.commits.blocked
    parked = [Message(topic="t", partition=0, offset=o) for o in range(40, 240)]
    ready = [Message(topic="t", partition=1, offset=o) for o in range(8)]
    controller.dispatch.observe_service(0.003)
    controller.post(RecordsPolled({T_0: (1, parked), T_1: (1, ready)}))
    controller.run_once(block=False)
    handed = len(runner.singles) + len(runner.chunks)
    assert handed == min(8, controller.dispatch.call_limit()), (
        f"{[len(c) for c in runner.chunks]} bundles and {len(runner.singles)} singles "
        f"for 8 runnable records and {controller.dispatch.call_limit()} slots"
    )


# -- a revoke that came in while the stuck check ran ----------------------------------------------


class StuckReporter(BundleTaker):
    """Its stuck check finds the first call of the first bundle finished (the rest hangs) and
    reports it the way the thread runner does; meanwhile the poller posted a revoke of t[0]."""

    controller: Controller

    def release_stuck(self, after: float, report: Callable[[WorkDoneMany], None]) -> int:
        if not self.chunks:
            return 0
        reply: Future[None] = Future()
        self.controller.post(PartitionsRevoked((TP,), reply))  # (the poller, meanwhile)
        batch = self.chunks[0][0][0]
        report(WorkDoneMany([(batch, (None,), None, 0.0, False)], 0.003))
        return 0


def test_a_revoke_posted_during_the_stuck_check_commits_the_calls_it_reported():
    """The stuck check reports the finished calls of a stuck bundle. Posted as an event they
    came behind a revoke the poller posted while the check ran: the revoke's final commit left
    them out (_settle_bundled no longer found them in the bundle), and the partition's next
    owner ran them again. The controller now handles them at once."""
    runner = StuckReporter()
    clock = FakeClock()
    controller = stepped_controller(
        clock,
        options=Options(ordering=ProcessingOrder.UNORDERED, commit_interval=1000),
        runner=runner,
    )
    runner.controller = controller
    controller.dispatch.observe_service(0.003)
    messages = [Message(topic="t", partition=0, offset=o, key=b"k%d" % o) for o in range(100)]
    controller.post(RecordsPolled({TP: (1, messages)}))
    controller.run_once(block=False)
    assert runner.chunks
    assert runner.chunks[0][0][1].offset == 0
    controller.overdue.next_stuck_check = 0.0  # (the check is due)
    controller.run_once(block=False)  # the stuck check
    controller.run_once(block=False)  # the revoke
    poller = controller._poller
    commits = [c for cmd in poller.commands if isinstance(cmd, Commit) for c in cmd.offsets]
    assert [(c.tp, c.offset) for c in commits] == [(TP, 1)]
