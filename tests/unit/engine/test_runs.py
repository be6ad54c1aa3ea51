"""Runs: while calls are far shorter than a thread hop, a partition's consecutive records go
to one worker as a run (docs/performance.md#runs). These tests watch what a user sees, the
handler's calls, and read ``statistics()`` only once the records they wait for were seen.

Each would fail if a run broke key order, ran a record twice or never, held other keys behind
a failed or hung record, kept calls that turned slow on one worker, or started a call after
``close(drain=False)``."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from doubles import stepped_controller

from parallel_consumer import Lifecycle, Options, PollContext, ProcessingOrder
from parallel_consumer.engine import controller as controller_module
from parallel_consumer.testing.clock import FakeClock

WARM_UP = 3_000


def produce_keyed(cluster, n: int, keys: int, partitions: int, start: int = 0) -> None:
    if not start:
        cluster.create_topic("t", partitions)
    with cluster._cond:
        for i in range(start, n):
            cluster.produce("t", b"%d" % i, key=b"k%d" % (i % keys), partition=i % partitions)


def warmed_up(cluster, pc, handle, wait_until, n: int, keys: int, partitions: int = 1) -> None:
    """Start ``pc`` on WARM_UP short calls and wait until they are done (the engine has
    measured its calls, and no lane holds records); then produce the rest, up to ``n``: it
    arrives in runs."""
    produce_keyed(cluster, WARM_UP, keys, partitions)
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded >= WARM_UP, timeout=60)
    produce_keyed(cluster, n, keys, partitions, start=WARM_UP)


class Log:
    """What the handler saw, in the order it saw it, and lanes running at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[int, bytes, int, float]] = []
        self.active: dict[object, int] = defaultdict(int)
        self.overlaps: list[object] = []
        self.most_at_once = 0
        self.running = 0

    def enter(self, ctx: PollContext, lane: object) -> None:
        with self.lock:
            self.active[lane] += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            if self.active[lane] > 1:
                self.overlaps.append(lane)

    def leave(self, ctx: PollContext, lane: object) -> None:
        with self.lock:
            self.active[lane] -= 1
            self.running -= 1
            self.calls.append((ctx.partition, ctx.key, ctx.offset, time.monotonic()))

    def count(self) -> int:
        with self.lock:
            return len(self.calls)

    def by_lane(self) -> dict[tuple[int, bytes], list[int]]:
        lanes: dict[tuple[int, bytes], list[int]] = defaultdict(list)
        with self.lock:
            for partition, key, offset, _ in self.calls:
                lanes[(partition, key)].append(offset)
        return lanes


def test_short_calls_go_out_in_runs_and_keep_key_order(harness, cluster, wait_until):
    # Given 40,000 records of 500 keys on 4 partitions and a handler far shorter than a hop
    produce_keyed(cluster, 40_000, keys=500, partitions=4)
    log = Log()

    def handle(ctx: PollContext) -> None:
        lane = (ctx.partition, ctx.key)
        log.enter(ctx, lane)
        log.leave(ctx, lane)

    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=8))
    pc.poll(handle)
    wait_until(lambda: log.count() >= 40_000, timeout=60)

    # Then each key ran one record at a time, in offset order, each record once; and runs
    # carried the records
    assert not log.overlaps
    lanes = log.by_lane()
    for offsets in lanes.values():
        assert offsets == sorted(set(offsets))
    assert sum(len(v) for v in lanes.values()) == 40_000
    stats = pc.statistics()
    assert stats.runs > 0
    assert stats.records_succeeded == 40_000


def test_a_failed_record_holds_its_key_and_not_the_others(harness, cluster, wait_until):
    # Given one partition of 6,000 records of 100 keys, short calls, and one record (after
    # runs are on) whose first attempt fails; its retry comes 0.5 s later
    failing = WARM_UP + 7
    failing_key = b"k%d" % (failing % 100)
    log = Log()
    failed_at: list[float] = []

    def handle(ctx: PollContext) -> None:
        lane = ctx.key
        log.enter(ctx, lane)
        try:
            if ctx.offset == failing and ctx.attempts == 0:
                failed_at.append(time.monotonic())
                raise RuntimeError("first attempt fails")
        finally:
            log.leave(ctx, lane)

    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=8, retry_delay=0.5))
    warmed_up(cluster, pc, handle, wait_until, 6_000, keys=100)
    wait_until(lambda: pc.statistics().records_succeeded == 6_000, timeout=60)

    # Then the failed record's key waited for its retry: its later records ran after it, in
    # order; every other key went on meanwhile (all their records ran before the retry)
    assert not log.overlaps
    lanes = log.by_lane()
    key_offsets = lanes[(0, failing_key)]
    assert key_offsets == sorted(key_offsets)
    assert key_offsets.count(failing) == 2  # the failed attempt and the retry
    with log.lock:
        retried_at = [t for _, _, o, t in log.calls if o == failing][-1]
        others_after_retry = [o for _, k, o, t in log.calls if k != failing_key and t >= retried_at]
    assert retried_at - failed_at[0] >= 0.4
    assert others_after_retry == [], "other keys waited for the failed record's retry"
    for (_, key), offsets in lanes.items():
        if key != failing_key:
            assert offsets == sorted(set(offsets))
    assert pc.statistics().runs > 0


def test_a_hung_call_in_a_run_holds_only_its_key(harness, cluster, wait_until):
    # Given one partition of 6,000 records of 50 keys and a call that hangs (after runs are on)
    hung = WARM_UP + 11
    hung_key = b"k%d" % (hung % 50)
    release = threading.Event()
    log = Log()

    def handle(ctx: PollContext) -> None:
        lane = ctx.key
        log.enter(ctx, lane)
        if ctx.offset == hung:
            release.wait(60)
        log.leave(ctx, lane)

    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=8))
    warmed_up(cluster, pc, handle, wait_until, 6_000, keys=50)
    hung_key_records = sum(1 for i in range(6_000) if i % 50 == hung % 50)
    try:
        # Then every record of the other keys runs while it hangs; none of its own key after it
        wait_until(lambda: log.count() >= 6_000 - hung_key_records + hung // 50, timeout=60)
        time.sleep(0.1)
        lanes = log.by_lane()
        assert all(o < hung for o in lanes[(0, hung_key)])
        assert sum(len(v) for k, v in lanes.items() if k[1] != hung_key) == (
            6_000 - hung_key_records
        )
    finally:
        release.set()
    wait_until(lambda: log.count() >= 6_000, timeout=30)
    assert not log.overlaps
    assert log.by_lane()[(0, hung_key)] == sorted(log.by_lane()[(0, hung_key)])
    stats = pc.statistics()
    assert stats.runs_detached >= 1
    assert stats.records_succeeded == 6_000


def test_calls_that_turn_slow_leave_their_run_for_other_workers(harness, cluster, wait_until):
    # Given one partition (UNORDERED), 3,000 short calls, then 200 calls of 5 ms each
    log = Log()

    def handle(ctx: PollContext) -> None:
        log.enter(ctx, ctx.offset)
        if ctx.offset >= WARM_UP:
            time.sleep(0.005)
        log.leave(ctx, ctx.offset)

    pc = harness.make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=8))
    warmed_up(cluster, pc, handle, wait_until, WARM_UP + 200, keys=WARM_UP + 200)
    wait_until(lambda: log.count() >= WARM_UP + 200, timeout=60)

    # Then the slow calls ran side by side on several workers, not one after another in a run
    # (one after another would take 1 s; eight at a time about 0.13 s)
    assert log.most_at_once > 1
    with log.lock:
        slow = [t for _, _, o, t in log.calls if o >= WARM_UP]
    assert max(slow) - min(slow) < 0.8


def test_close_without_drain_starts_no_call_of_a_run_after_it(
    harness, cluster, wait_until, monkeypatch
):
    # Given runs of short calls that are never detached, and a call, deep inside a run, that
    # closes the consumer without drain and returns once it is closing
    monkeypatch.setattr(controller_module, "STUCK_AFTER", 60.0)
    closing = threading.Event()
    late: list[int] = []
    calls = [0]
    closer: list[threading.Thread] = []

    def handle(ctx: PollContext) -> None:
        if closing.is_set():
            late.append(ctx.offset)
            return
        calls[0] += 1
        if calls[0] == WARM_UP + 100 and not closer:
            thread = threading.Thread(target=pc.close, kwargs={"drain": False, "timeout": 10})
            thread.start()  # (before it is published: the test thread joins what it finds)
            closer.append(thread)
            wait_until(lambda: pc._controller.lifecycle is not Lifecycle.RUNNING, timeout=10)
            closing.set()

    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=8))
    warmed_up(cluster, pc, handle, wait_until, 20_000, keys=20_000)
    wait_until(lambda: bool(closer), timeout=60)
    assert pc.statistics().runs > 0
    closer[0].join(20)
    assert not closer[0].is_alive()

    # Then no call started after the close took back what had not started
    assert late == [], f"{len(late)} calls started after close(drain=False)"
    assert pc._controller.lifecycle is Lifecycle.CLOSED


@pytest.mark.parametrize("ordering", list(ProcessingOrder))
def test_statistics_count_the_records_of_a_run_as_in_flight(
    harness, cluster, wait_until, monkeypatch, ordering
):
    # Given a run whose call hangs (never detached), deep in a partition of 8,000 records
    monkeypatch.setattr(controller_module, "STUCK_AFTER", 60.0)
    release = threading.Event()
    entered = threading.Event()
    hang_at = WARM_UP + 500

    def handle(ctx: PollContext) -> None:
        if ctx.offset == hang_at:
            entered.set()
            release.wait(30)

    pc = harness.make(Options(ordering=ordering, max_concurrency=8))
    warmed_up(cluster, pc, handle, wait_until, 8_000, keys=8_000)
    try:
        assert entered.wait(30)
        # Then statistics and health show the run's records as in flight, and nothing is lost
        stats = pc.statistics()
        assert stats.runs > 0
        assert stats.in_flight >= 1
        assert stats.held == stats.waiting + stats.in_flight + stats.retry_waiting
        [row] = pc.health().partitions
        assert row.in_flight == stats.in_flight
    finally:
        release.set()
    wait_until(lambda: pc.statistics().records_succeeded == 8_000, timeout=60)
    assert pc.statistics().in_flight == 0


class _Message:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


def test_a_process_pause_does_not_end_the_fast_path():
    """A run's report is wall time: every report that spans a full garbage collection (20-50
    ms here) is inflated at once, one per worker. They must not make the engine take its
    calls for slow ones, while calls that really turned slow still end the fast path."""
    clock = FakeClock()
    controller = stepped_controller(clock)
    controller._chunks = True  # a runner that takes chunks and runs
    controller._service_clock = clock.monotonic  # (real time, here under the test's control)
    for _ in range(20):
        clock.advance(0.001)
        controller._observe_service(2e-6)
    assert controller.chunk_size >= controller_module.RUN_FROM_CHUNK
    # the runs of 8 partitions, 64 records each, all spanned the same 40 ms pause
    clock.advance(0.04)
    for _ in range(8):
        controller._observe_service((0.04 + 64 * 2e-6) / 64)
    assert controller.chunk_size >= controller_module.RUN_FROM_CHUNK
    # calls of 1 ms from now on: within 10 reports 10 ms apart, calls go one by one
    for _ in range(10):
        clock.advance(controller_module.STUCK_CHECK_EVERY)
        controller._observe_service(0.001)
    assert controller.chunk_size == 1
    # and calls short again bring the fast path back
    for _ in range(40):
        controller._observe_service(2e-6)
    assert controller.chunk_size >= controller_module.RUN_FROM_CHUNK


@pytest.mark.parametrize("start", [0.0, -1.0, 1e6])
def test_calls_of_milliseconds_after_a_short_first_one_go_one_by_one_within_30_ms(start):
    """W1's handler sleeps 0-4 ms; a first call of sleep(0) reports microseconds. The
    following reports, 2 ms each, one per millisecond, must switch chunks and runs off within
    three windows, whatever the clock reads."""
    clock = FakeClock(start=start)
    controller = stepped_controller(clock)
    controller._chunks = True
    controller._service_clock = clock.monotonic
    controller._observe_service(3e-6)
    assert controller.chunk_size > 1
    for _ in range(30):
        clock.advance(0.001)
        controller._observe_service(0.002)
    assert controller.chunk_size == 1


def _looked_at(controller, run, looks: list[tuple[float, int]]) -> None:
    for at, done in looks:
        run.done = done
        controller._check_runs(at)


def test_one_look_at_a_paused_run_does_not_detach_it():
    """A look that finds no progress for 40 ms (the whole process was paused) is not enough:
    the next look, once the run went on, finds it fine. A call that hangs is detached at the
    second look that agrees."""
    controller = stepped_controller(FakeClock())
    run = controller._runs.start(("t", 0), 1, [_Message(o) for o in range(10_000)], timed=None)
    detached: list[object] = []
    controller._detach_run = lambda run, drop: detached.append(run)  # type: ignore[method-assign]
    run.started = 100.0
    # calls of 20 us (under RUN_SLOW_CALL), a 40 ms pause from 2 ms on
    _looked_at(controller, run, [(100.001, 50), (100.043, 100), (100.0535, 625)])
    assert not detached
    # now a call hangs: no progress at 25 ms, nor at the next look
    _looked_at(controller, run, [(100.080, 625), (100.085, 625)])
    assert not detached  # (too soon after the first look to agree)
    _looked_at(controller, run, [(100.091, 625)])
    assert detached == [run]


@pytest.mark.parametrize("call", [0.005, 0.012, 0.015, 0.019, 0.020, 0.021, 0.025])
@pytest.mark.parametrize("look", [0.0100, 0.0101, 0.0105])
def test_a_run_of_calls_of_milliseconds_is_detached_within_40_ms(call, look):
    """Calls of 5-25 ms in a run (a handler that turned slow): at 10 ms looks, some find a
    call ended and some none; each must still find the run slow, or two looks never agree
    and the run keeps one worker busy for seconds while the others are idle."""
    controller = stepped_controller(FakeClock())
    run = controller._runs.start(("t", 0), 1, [_Message(o) for o in range(2_500)], timed=None)
    detached: list[object] = []
    controller._detach_run = lambda run, drop: detached.append(run)  # type: ignore[method-assign]
    run.started = now = 100.0
    while not detached and now < 101.0:
        now += look
        run.done = int((now - 100.0) / call)
        controller._check_runs(now)
    assert detached, "never detached"
    assert now - 100.0 <= 0.04


def test_a_revoke_commits_what_the_run_out_already_finished():
    """Records a run finished before a revoke are committed by the revoke's final commit: the
    partition's next owner must not run them again."""
    from concurrent.futures import Future

    from confluent_kafka import Message
    from doubles import RunTaker

    from parallel_consumer._events import Commit, PartitionsRevoked, RecordsPolled

    runner = RunTaker()
    options = Options(ordering=ProcessingOrder.UNORDERED, commit_interval=60)
    controller = stepped_controller(FakeClock(), options=options, runner=runner)
    controller._observe_service(1e-6)  # calls measured short: records go out in runs
    messages = [Message(topic="t", partition=0, offset=o, key=b"k") for o in range(100)]
    controller.post(RecordsPolled({("t", 0): (1, messages)}))
    controller.run_once(block=False)
    (run,) = [task for task in runner.taken if hasattr(task, "pending")]
    # The worker took the run and finished its first 40 calls; the 41st is in progress
    run.started = 1.0
    for _ in range(41):
        run.pending.popleft()
    run.done = 40
    # When the partition is revoked
    reply: Future[None] = Future()
    controller.post(PartitionsRevoked((("t", 0),), reply))
    controller.run_once(block=False)
    # Then the final commit covers the 40 finished records
    assert reply.done()
    commits = [c for c in controller._poller.commands if isinstance(c, Commit)]
    assert commits, "no final commit"
    assert commits[-1].offsets[0].offset == 40
    # and every record of the run is accounted for once: none is left counted as out
    assert controller._runs.records_out == 0


def test_a_hung_call_of_a_detached_run_holds_one_slot_of_the_call_limit():
    """A detached run's call in progress is a single call of the in-flight table, and its run
    stays out until the worker reports: the call must count once against the call limit, not
    twice, or every hung call costs the engine one more worker."""
    from confluent_kafka import Message
    from doubles import RunTaker

    from parallel_consumer._events import RecordsPolled

    runner = RunTaker()
    options = Options(ordering=ProcessingOrder.KEY, commit_interval=60)
    controller = stepped_controller(FakeClock(), options=options, runner=runner)
    controller._observe_service(1e-6)  # calls measured short: records go out in runs
    messages = [Message(topic="t", partition=0, offset=o, key=b"k%d" % o) for o in range(100)]
    controller.post(RecordsPolled({("t", 0): (1, messages)}))
    controller.run_once(block=False)
    (run,) = [task for task in runner.taken if hasattr(task, "pending")]
    # The worker took the run; its first call hangs, and the run is detached
    run.started = 1.0
    run.pending.popleft()
    controller._detach_run(run, drop=False)
    assert run.adopted is not None
    assert len(controller._in_flight) == 1
    assert controller._runs.out  # (until the worker reports)
    # Then the hung call holds one slot: the other records fill the rest of the limit
    controller.chunk_size = 1  # (calls slow now: one by one)
    controller.run_once(block=False)
    limit = runner.capacity + runner.backlog
    assert len(controller._in_flight) == limit
    assert controller._workers_in_runs() == 0
