"""Chains when a call hangs or fails: a stall dead letter frees the chain's lane, a
stall-abandoned call of a detached run holds one slot, a failed call reported early keeps its
retry ahead of the calls not started, every dispatched call ends in ``on_work_done``, and the
release of a stuck chain races its owner safely. Each failed on an earlier version of chains."""

from __future__ import annotations

import threading
import time

import pytest

from parallel_consumer import Options, PollContext, ProcessingOrder
from parallel_consumer.engine import controller as controller_module


def _produce(cluster, start: int, n: int) -> None:
    with cluster._cond:
        for i in range(start, start + n):
            cluster.produce("t", b"%d" % i, key=b"k", partition=0)


@pytest.mark.parametrize("chains", [True, False])
def test_stall_dead_letter_of_a_hung_chain_call_frees_its_lane(
    harness, cluster, clock, wait_until, monkeypatch, chains
):
    monkeypatch.setattr(controller_module, "CHAINS", chains)
    cluster.create_topic("t", 1)
    release = threading.Event()
    hung = threading.Event()
    done: list[int] = []

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 40 and ctx.attempts == 0:
            hung.set()
            release.wait(30)
            return
        time.sleep(0.001)
        done.append(ctx.offset)

    pc = harness.make(
        Options(
            ordering=ProcessingOrder.PARTITION,
            max_concurrency=2,
            stall_threshold=30,
            on_stall="dead_letter",
            commit_interval=1000,
        ),
        clock=clock,
    )
    pc.poll(handle)
    try:
        # Calls of a millisecond: the engine measures them
        _produce(cluster, 0, 40)
        wait_until(lambda: len(done) >= 40, timeout=20)
        # Then 20 more records arrive together; offset 40 hangs
        _produce(cluster, 40, 20)
        wait_until(hung.is_set)

        def engine_holds_all_20() -> bool:
            stats = pc.statistics()
            return stats.in_flight + stats.waiting >= 20

        wait_until(engine_holds_all_20)
        # When the partition stalls: on_stall=DEAD_LETTER gives up on offset 40
        clock.advance(30)
        wait_until(lambda: pc.statistics().records_dead_lettered == 1)
        clock.advance(30)  # a second stall episode (now at offset 41) changes nothing
        # Then the records behind it run (as they do without chains)
        wait_until(
            lambda: len(done) >= 59,
            timeout=5,
            what=f"records behind 40 (done={len(done)}, chains={pc.statistics().chains})",
        )
    finally:
        release.set()
        pc.close()


class _Outputs:
    transactional = False
    backlog = False

    def __init__(self) -> None:
        self.sent: list[object] = []

    def send(self, batch: int, outputs: list[object]) -> None:
        self.sent.append((batch, outputs))

    def pump(self) -> None:
        pass

    def close(self, *, abort: bool) -> None:
        pass


def test_a_stall_abandoned_call_of_a_detached_run_holds_one_slot():
    """F3, through the stall policy: the adopted call of a detached run, abandoned by
    on_stall=DEAD_LETTER, leaves the in-flight table and becomes an overrun; its run stays out
    until the worker reports. It must still count once against the call limit."""
    from confluent_kafka import Message
    from doubles import RunTaker, stepped_controller

    from parallel_consumer._events import RecordsPolled
    from parallel_consumer.engine.letters import DeadLetters
    from parallel_consumer.testing.clock import FakeClock

    runner = RunTaker()
    clock = FakeClock()
    options = Options(
        ordering=ProcessingOrder.KEY,
        commit_interval=1000,
        stall_threshold=30,
        on_stall="dead_letter",
        dead_letter_topic="dlq",
    )
    controller = stepped_controller(
        clock,
        options=options,
        runner=runner,
        outputs=_Outputs(),
        produces=False,
        dead_letters=DeadLetters(options, "g"),
    )
    controller._observe_service(1e-6)
    messages = [Message(topic="t", partition=0, offset=o, key=b"k%d" % o) for o in range(100)]
    controller.post(RecordsPolled({("t", 0): (1, messages)}))
    controller.run_once(block=False)
    (run,) = [task for task in runner.taken if hasattr(task, "pending")]
    run.started = 1.0
    run.pending.popleft()  # its first call (offset 0) hangs
    controller._detach_run(run, drop=False)
    controller.chunk_size = 1
    controller.run_once(block=False)
    limit = runner.capacity + runner.backlog
    assert len(controller._in_flight) + controller._workers_in_runs() == limit
    # Every call but the hung one ends: the others complete
    from parallel_consumer._events import WorkDone

    hung = run.adopted[1]
    for batch in list(controller._in_flight):
        if batch.id != hung:
            controller.post(WorkDone(batch.id, (None,), None, clock.monotonic()))
    controller.run_once(block=False)
    # When offset 0 holds t[0] for stall_threshold: it is abandoned and dead-lettered
    clock.advance(31)
    controller.run_once(block=False)
    clock.advance(31)
    controller.run_once(block=False)
    assert controller._counters.partition_stalls >= 1
    assert hung not in controller._in_flight
    held = controller._workers_in_runs() + controller._deadlines.overruns
    assert held == 1, f"the hung call holds {held} slots of the call limit"


def test_a_failed_chain_call_reported_early_keeps_its_retry_ahead_of_the_unstarted():
    """ThreadRunner.release_stuck may take a chain's failed result (and post it) before the
    chain's owner posts the calls it did not start (WorkDoneMany.unstarted): two events. With
    retry_delay=0 the failed record's retry is back at the front of its lane before the
    unstarted records come back; put_back must not put them ahead of it."""
    from confluent_kafka import Message
    from doubles import ChainTaker, stepped_controller

    from parallel_consumer._events import RecordsPolled, WorkDoneMany
    from parallel_consumer.testing.clock import FakeClock

    runner = ChainTaker()
    clock = FakeClock()
    options = Options(ordering=ProcessingOrder.PARTITION, retry_delay=0, commit_interval=1000)
    controller = stepped_controller(clock, options=options, runner=runner)
    controller._observe_service(0.002)  # calls of 2 ms: chains of up to 10
    tp = ("t", 0)
    messages = [Message(topic="t", partition=0, offset=o, key=b"k") for o in range(5)]
    controller.post(RecordsPolled({tp: (1, messages)}))
    controller.run_once(block=False)
    [chain] = runner.chains
    assert [ctx.offset for _, ctx in chain] == [0, 1, 2, 3, 4]
    ids = [batch for batch, _ in chain]
    now = clock.monotonic()
    # The stuck check reports offsets 0 (ok) and 1 (failed) while the owner decides the rest
    controller.post(
        WorkDoneMany(
            [(ids[0], (None,), None, now, False), (ids[1], (RuntimeError("x"),), None, now, False)],
            0.002,
        )
    )
    controller.run_once(block=False)
    # Then the owner reports offsets 2..4 unstarted
    controller.post(WorkDoneMany([], 0.002, ids[2:]))
    controller.run_once(block=False)
    dispatched = [ctx.offset for chain in runner.chains[1:] for _, ctx in chain]
    dispatched += [ctx.offset for _, ctx in runner.singles]
    assert dispatched[:1] == [1], f"lane order broken: dispatched {dispatched}"


def test_every_dispatched_call_ends_in_on_work_done(harness, cluster, wait_until):
    """hooks.md: on_dispatch = a call was handed to the runner, on_work_done = the call ended.
    A chain's calls that come back unstarted got on_dispatch but never on_work_done."""
    from parallel_consumer import NoHooks

    class Pairs(NoHooks):
        def __init__(self) -> None:
            self.dispatched: set[int] = set()
            self.ended: set[int] = set()

        def on_dispatch(self, batch, context):
            self.dispatched.add(batch)

        def on_work_done(self, batch, errors, duration):
            self.ended.add(batch)

    cluster.create_topic("t", 1)
    done: list[int] = []

    def handle(ctx: PollContext) -> None:
        time.sleep(0.001)
        if ctx.offset % 25 == 24 and ctx.attempts == 0:
            raise RuntimeError("transient")
        done.append(ctx.offset)

    hooks = Pairs()
    pc = harness.make(
        Options(ordering=ProcessingOrder.PARTITION, max_concurrency=2, retry_delay=0),
        hooks=hooks,
    )
    pc.poll(handle)
    _produce(cluster, 0, 200)
    wait_until(lambda: len(done) >= 200, timeout=30)
    stats = pc.statistics()
    pc.close()
    assert stats.chains > 0
    assert hooks.dispatched - hooks.ended == set()


def test_race_release_stuck_reports_the_failure_before_the_owner_puts_back(
    harness, cluster, wait_until, monkeypatch
):
    """The real thread runner, with the owner preempted (a sleep) between appending a failed
    chain call's result and taking the calls it will not start: the stuck check reports the
    failure, its retry (retry_delay=0) goes to the front of the lane, then the unstarted calls
    come back ahead of it."""
    from parallel_consumer.runners import threads

    original = threads._Chunk.take_calls

    def slow_take_calls(self):
        if self.chain and "worker" in threading.current_thread().name and self.results:
            time.sleep(0.05)  # preempted right here
        return original(self)

    monkeypatch.setattr(threads._Chunk, "take_calls", slow_take_calls)
    cluster.create_topic("t", 1)
    order: list[int] = []
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        time.sleep(0.002)
        fail = ctx.offset == 60 and ctx.attempts == 0
        if fail:
            time.sleep(0.03)  # the chain is past STUCK_AFTER when it fails
            raise RuntimeError("transient")
        with lock:
            order.append(ctx.offset)

    pc = harness.make(Options(ordering=ProcessingOrder.PARTITION, max_concurrency=2, retry_delay=0))
    pc.poll(handle)
    _produce(cluster, 0, 50)
    wait_until(lambda: len(order) >= 50, timeout=30)
    _produce(cluster, 50, 30)
    wait_until(lambda: len(order) >= 80, timeout=30)
    pc.close()
    assert order == sorted(order), [o for o in order if o >= 55][:12]
