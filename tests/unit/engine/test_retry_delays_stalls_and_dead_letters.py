"""Failure handling at its edges, on the fakes (no broker): retry delays that are NaN, infinite
or zero, the stall policy's dead letters (whatever max_retries, for calls that keep timing out,
not for a record still waiting for a worker), dead letters whose transaction aborts or whose
error cannot be printed, results past their deadline, callbacks raising SystemExit, a regex
subscription matching the dead-letter topic, and close cancelling calls. Each failed on an
earlier version of the failure handling."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from doubles import IdleRunner, StuckPoller, blocked_partition

from parallel_consumer import DeadLetter, NoHooks, Options, PollContext, RecordContext, Retry
from parallel_consumer._events import Assignment, PartitionsAssigned, RecordsPolled, WorkDone
from parallel_consumer.dead_letter import Reason, read_dead_letter
from parallel_consumer.engine.controller import Controller
from parallel_consumer.engine.letters import DeadLetters
from parallel_consumer.kafka.committers import ConsumerCommitter
from parallel_consumer.kafka.producer import Outputs
from parallel_consumer.retry import retry_delay
from parallel_consumer.testing.clock import FakeClock
from parallel_consumer.testing.fakes import FakeCluster


class RecordingRunner(IdleRunner):
    capacity = 4

    def __init__(self) -> None:
        self.submitted: list[tuple[int, PollContext]] = []

    def submit(self, batch: int, context: PollContext) -> None:
        self.submitted.append((batch, context))


@pytest.fixture
def stepped() -> Iterator[tuple[Controller, RecordingRunner, FakeCluster, FakeClock]]:
    clock = FakeClock()
    cluster = FakeCluster()
    cluster.create_topic("t", 2)
    cluster.create_topic("t.dlq", 2)
    options = Options(max_retries=10, retry_delay=1)
    poller = StuckPoller()
    runner = RecordingRunner()
    controller = Controller(
        options,
        runner=runner,
        poller=poller,
        committer=ConsumerCommitter(poller, options.commit_mode),
        clock=clock,
    )
    outputs = Outputs(cluster.producer({}), post=controller.post, transactional=False, name="r")
    outputs.start()
    try:
        controller.start(
            lambda ctx: None,
            thread=False,
            outputs=outputs,
            produces=False,
            dead_letters=DeadLetters(options, "g"),
        )
        controller.post(
            PartitionsAssigned(
                (Assignment(("t", 0), 1, None, None), Assignment(("t", 1), 1, None, None))
            )
        )
        yield controller, runner, cluster, clock
    finally:
        outputs.close(abort=False)


def test_retry_with_a_nan_delay_never_gives_a_nan_backoff() -> None:
    # Retry's constructor only rejects delay < 0, which NaN is not; retry_delay returns
    # error.delay without the `seconds >= 0` check the provider's value gets.
    try:
        error = Retry("nan", delay=float("nan"))
    except (ValueError, TypeError):
        return  # rejected up front: fine
    delay = retry_delay(Options(), error, RecordContext(None, 1))  # type: ignore[arg-type]
    assert math.isfinite(delay)
    assert delay >= 0


def test_a_nan_retry_delay_does_not_block_the_retries_of_other_partitions(stepped) -> None:
    controller, runner, cluster, clock = stepped
    # Given two records of two partitions
    cluster.produce("t", b"a", key=b"a", partition=0)
    cluster.produce("t", b"b", key=b"b", partition=1)
    controller.post(
        RecordsPolled(
            {
                ("t", 0): (1, [m for m in cluster.records("t") if m.partition() == 0]),
                ("t", 1): (1, [m for m in cluster.records("t") if m.partition() == 1]),
            }
        )
    )
    controller.run_once(block=False)
    by_value = {ctx.record.value: batch for batch, ctx in runner.submitted}
    # When one fails with Retry(delay=nan) (a computed delay gone wrong) and the other with an
    # ordinary error (retry_delay=1 s)
    # (Retry(delay=nan) is refused at construction now: the NaN is set on the attribute, which
    # retry_delay checks again and replaces by retry_delay)
    nan_retry = Retry("x")
    nan_retry.delay = float("nan")
    controller.post(WorkDone(by_value[b"a"], (nan_retry,), None, clock.monotonic()))
    controller.run_once(block=False)
    controller.post(WorkDone(by_value[b"b"], (ValueError("b"),), None, clock.monotonic()))
    controller.run_once(block=False)
    assert len(runner.submitted) == 2
    # Then, long after its 1 s delay, the other partition's record runs again
    clock.advance(100)
    controller.run_once(block=False)
    values = [ctx.record.value for _, ctx in runner.submitted[2:]]
    assert b"b" in values


class _StallHooks(NoHooks):
    def __init__(self) -> None:
        self.skipped: list[tuple[RecordContext, str]] = []

    def on_skip(self, record: RecordContext, error: BaseException | None, reason: str) -> None:
        self.skipped.append((record, reason))


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_on_stall_dead_letter_writes_a_stalled_letter_whatever_max_retries(
    harness, cluster, clock, wait_until, policy
):
    # Given t[0]'s first record hangs in its handler call, on_stall=DEAD_LETTER, and
    # max_retries=0 (on_retries_exhausted=SKIP or the default DEAD_LETTER)
    handle, release, calls = blocked_partition(cluster)
    hooks = _StallHooks()
    pc = harness.make(
        Options(
            stall_threshold=30,
            on_stall="dead_letter",
            max_retries=0,
            on_retries_exhausted=policy,
            retry_delay=0,
            commit_interval=1000,
            max_concurrency=2,
        ),
        clock=clock,
        hooks=hooks,
    )
    try:
        pc.poll(handle)
        wait_until(lambda: len(calls) == 3)
        # When the stall threshold passes
        clock.advance(30)
        # Then (docs/health.md, on_stall DEAD_LETTER) the record holding the partition is
        # written to the dead-letter topic with reason "stalled"
        wait_until(
            lambda: (
                pc.statistics().records_dead_lettered + pc.statistics().records_skipped_on_failure
                == 1
            )
        )
        assert hooks.skipped == []
        [letter] = cluster.records("t.dlq")
        info = read_dead_letter(letter.headers())
        assert info is not None
        assert info.offset == 0
        assert info.reason == Reason.STALLED
    finally:
        release.set()


def test_a_dead_lettered_record_whose_transaction_aborts_keeps_its_attempts(cluster, wait_until):
    from parallel_consumer import CommitMode, ParallelConsumer, ProducerRecord
    from parallel_consumer.testing.fakes import FakeProducer

    cluster.create_topic("t")
    cluster.create_topic("out")
    producers: list[FakeProducer] = []

    def producer(config: dict[str, Any]) -> FakeProducer:
        producers.append(cluster.producer(config))
        return producers[-1]

    pc = ParallelConsumer(
        {"bootstrap.servers": "fake:1", "group.id": "g"},
        Options(
            commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
            max_retries=1,
            retry_delay=0,
        ),
        consumer_factory=cluster.consumer,
        producer_factory=producer,
        admin_factory=cluster.admin,
        producer_config={"transactional.id": "tx"},
    )
    pc.subscribe("t")
    calls: list[int] = []
    try:

        @pc.poll_and_produce
        def handle(ctx: PollContext) -> ProducerRecord:
            calls.append(ctx.attempts)
            raise ValueError("bad")

        # Given the transaction holding the record's dead letter and offset aborts
        producers[0].fail_next_commit()
        cluster.produce("t", b"bad", key=b"k")
        wait_until(lambda: any(offsets for _, offsets in producers[0].committed_transactions))
    finally:
        pc.close()
    assert producers[0].aborts >= 1
    # Then the record comes again keeping its attempt count (as the transactional page says of
    # an aborted transaction: "its handler runs once more and, failing again, the record is
    # dead-lettered in the next transaction"), and every failure counts towards max_retries
    # (observed: [0, 1, 0, 1]: the dead letter was acknowledged, which dropped the record's
    # failure history, before the transaction holding it aborted)
    assert calls == [0, 1, 2], calls


@pytest.mark.parametrize("source", ["provider", "signal"])
def test_an_infinite_retry_delay_is_not_accepted(source) -> None:
    record = RecordContext(None, 1)  # type: ignore[arg-type]
    if source == "provider":
        options = Options(retry_delay=2, retry_delay_provider=lambda r: float("inf"))
        delay = retry_delay(options, ValueError("x"), record)
    else:
        try:
            error = Retry("x", delay=float("inf"))
        except (ValueError, TypeError):
            return
        delay = retry_delay(Options(retry_delay=2), error, record)
    assert math.isfinite(delay)


def test_zero_initial_backoff_stays_zero_for_many_attempts() -> None:
    from parallel_consumer import exponential_backoff

    provider = exponential_backoff(initial=0, multiplier=2, max=60, jitter=0)
    assert provider(RecordContext(None, 1100)) == 0  # type: ignore[arg-type]


def dead_letter_from_cause(ctx: PollContext) -> None:
    """A process-runner handler (module level: it is pickled to the worker)."""
    try:
        int(ctx.value)
    except ValueError as exc:
        raise DeadLetter("not a number") from exc


def test_process_runner_dead_letter_headers_name_the_cause(harness, cluster, wait_until):
    cluster.create_topic("t")
    cluster.produce("t", b"abc", key=b"k")
    pc = harness.make(Options(runner="process", processes=1, dead_letter_topic="dlq"))
    cluster.create_topic("dlq")
    pc.poll(dead_letter_from_cause)
    wait_until(lambda: len(cluster.records("dlq")) == 1, timeout=60)
    info = read_dead_letter(cluster.records("dlq")[0].headers())
    assert info is not None
    assert info.error_type == "builtins.ValueError", info.error_type


def test_health_overrunning_calls_are_part_of_deadline_exceeded(
    harness, cluster, clock, wait_until
):
    handle, release, calls = blocked_partition(cluster)
    pc = harness.make(
        Options(
            stall_threshold=30,
            on_stall="dead_letter",
            retry_delay=0,
            commit_interval=1000,
            max_concurrency=2,
        ),
        clock=clock,
    )
    try:
        pc.poll(handle)
        wait_until(lambda: len(calls) == 3)
        clock.advance(30)
        wait_until(lambda: pc.statistics().records_dead_lettered == 1)
        report = pc.health()
        # "overrunning_calls: of those [deadline_exceeded], calls still running on a thread"
        assert report.overrunning_calls == 1
        assert report.overrunning_calls <= report.deadline_exceeded
    finally:
        release.set()


class CancellingRunner(RecordingRunner):
    def cancel(self, batch: int, error: BaseException | None = None) -> None:
        pass


def test_a_result_that_finished_past_its_deadline_never_counts() -> None:
    clock = FakeClock()
    options = Options(processing_timeout=30, retry_delay=1000)
    poller = StuckPoller()
    runner = CancellingRunner()
    controller = Controller(
        options,
        runner=runner,
        poller=poller,
        committer=ConsumerCommitter(poller, options.commit_mode),
        clock=clock,
    )
    controller.start(lambda ctx: None, thread=False)
    controller.post(PartitionsAssigned((Assignment(("t", 0), 1, None, None),)))
    cluster = FakeCluster()
    cluster.create_topic("t")
    cluster.produce("t", b"v", key=b"k")
    controller.post(RecordsPolled({("t", 0): (1, cluster.records("t"))}))
    controller.run_once(block=False)
    [(batch, _)] = runner.submitted
    # Given the call returns 10 s after its 30 s deadline (the controller was busy, or had not
    # woken yet, when the result arrived)
    clock.advance(40)
    controller.post(WorkDone(batch, (None,), None, clock.monotonic()))
    controller.run_once(block=False)
    # Then its late result does not count: the record fails with DeadlineExceeded
    stats = controller.statistics()
    assert (stats.records_succeeded, stats.deadline_exceeded) == (0, 1)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


@pytest.mark.parametrize(
    "error",
    [ValueError("bad value b'\\xff' -> \udcff"), _Unprintable("x")],
    ids=["lone-surrogate", "str-raises"],
)
def test_a_dead_letter_is_written_whatever_the_error_message(harness, cluster, wait_until, error):
    cluster.create_topic("t")
    cluster.produce("t", b"\xff", key=b"k")
    cluster.produce("t", b"ok", key=b"k")
    done: list[bytes] = []
    pc = harness.make(Options(max_retries=0, commit_interval=0.01))

    @pc.poll
    def handle(ctx: PollContext) -> None:
        if ctx.value == b"\xff":
            raise error
        done.append(ctx.value)

    wait_until(lambda: pc.failure is not None or pc.statistics().records_dead_lettered == 1)
    assert pc.failure is None, pc.failure
    wait_until(lambda: done == [b"ok"])
    assert len(cluster.records("t.dlq")) == 1


def test_on_stall_dead_letter_acts_on_a_record_whose_calls_keep_timing_out(
    harness, cluster, clock, wait_until
):
    cluster.create_topic("t")
    cluster.produce("t", b"block", key=b"a")
    release = threading.Event()
    calls: list[int] = []

    def handle(ctx: PollContext) -> None:
        calls.append(ctx.attempts)
        release.wait(20)  # hangs (in engine time) at every attempt

    pc = harness.make(
        Options(
            processing_timeout=20,  # each attempt abandoned after 20 s ...
            retry_delay=10,  # ... and retried 10 s later: one attempt every 30 s
            stall_threshold=30,
            on_stall="dead_letter",
            commit_interval=1000,
            max_concurrency=8,
        ),
        clock=clock,
    )
    try:
        pc.poll(handle)
        wait_until(lambda: len(calls) == 1)
        # The partition is held from t=0. At t=30 the stall is seen while the retry that just
        # started runs ("given its chance"); docs/health.md: "the record is dead-lettered if
        # it still holds the partition at the next episode" (t=60). Go on until t=150.
        for step in range(1, 16):
            clock.advance(10)
            if step % 3 == 0:
                wait_until(
                    lambda n=step // 3 + 1: len(calls) >= n or pc.statistics().records_dead_lettered
                )
            time.sleep(0.02)
        stats = pc.statistics()
        assert (stats.partition_stalls, len(calls)) >= (2, 1)
        assert stats.records_dead_lettered == 1, (stats.partition_stalls, calls)
    finally:
        release.set()


def _raise_system_exit(*args: object) -> None:
    raise SystemExit(3)


@pytest.mark.parametrize("which", ["callback", "provider"])
def test_a_callback_raising_system_exit_is_contained(harness, cluster, wait_until, which):
    cluster.create_topic("t")
    cluster.produce("t", b"bad", key=b"k")
    calls: list[int] = []
    if which == "callback":
        options = Options(max_retries=0, retries_exhausted_callback=_raise_system_exit)
    else:
        options = Options(max_retries=1, retry_delay=0, retry_delay_provider=_raise_system_exit)
    pc = harness.make(options)

    @pc.poll
    def handle(ctx: PollContext) -> None:
        calls.append(ctx.attempts)
        raise ValueError("bad")

    wait_until(lambda: pc.failure is not None or pc.statistics().records_dead_lettered == 1)
    assert pc.failure is None, pc.failure


def test_a_regex_subscription_matching_the_dead_letter_topic_is_refused(
    harness, cluster, wait_until
):
    from parallel_consumer import ConfigurationError

    cluster.create_topic("orders")
    cluster.create_topic("orders.dlq")
    cluster.produce("orders", b"bad", key=b"k")
    seen: list[str] = []
    pc = harness.make(Options(dead_letter_topic="orders.dlq", max_retries=0), topics=("^orders.*",))

    def handle(ctx: PollContext) -> None:
        seen.append(ctx.topic)
        raise ValueError("bad")

    # What happens instead: the consumer starts, reads its own dead letters back from
    # orders.dlq and dead-letters each again (tens of dead letters per 0.1 s on the fakes)
    with pytest.raises(ConfigurationError, match="subscribed"):
        pc.poll(handle)


def test_on_stall_dead_letter_leaves_a_record_waiting_for_a_worker_alone(
    harness, cluster, clock, wait_until
):
    cluster.create_topic("t", 2)
    release = threading.Event()
    calls: list[bytes] = []

    def handle(ctx: PollContext) -> None:
        calls.append(ctx.value)
        if ctx.value == b"block":
            release.wait(10)

    pc = harness.make(
        Options(
            stall_threshold=30,
            on_stall="dead_letter",
            retry_delay=0,
            commit_interval=1000,
            max_concurrency=1,  # one worker (and a backlog of one call in the runner)
        ),
        clock=clock,
    )
    try:
        pc.poll(handle)
        # Given t[0]'s record hangs on the only worker, and t[1]'s record is handed to the
        # runner behind it (it waits for the worker: its call has not started)
        cluster.produce("t", b"block", key=b"a", partition=0)
        wait_until(lambda: calls == [b"block"])
        cluster.produce("t", b"free", key=b"b", partition=1)
        wait_until(lambda: pc.statistics().in_flight == 2)
        # When both partitions are found stalled
        clock.advance(30)
        wait_until(lambda: pc.statistics().partition_stalls == 2)
        time.sleep(0.1)
        # Then t[1]'s record, which never ran, is not dead-lettered (docs/health.md: "a record
        # waiting in its lane for a worker is not what holds the partition up ... left alone")
        assert [m.value() for m in cluster.records("t.dlq")] == [b"block"]
    finally:
        release.set()
    wait_until(lambda: calls.count(b"free") >= 1)


def test_close_does_not_dead_letter_the_calls_it_cancels(harness, cluster, wait_until):
    import asyncio

    cluster.create_topic("t")
    started = threading.Event()
    pc = harness.make(Options(max_retries=0, commit_interval=0.01))

    @pc.poll
    async def handle(ctx: PollContext) -> None:
        started.set()
        await asyncio.sleep(10)  # a slow but healthy call

    cluster.produce("t", b"healthy", key=b"a")
    wait_until(started.is_set)
    # When the consumer closes without draining, the call is cancelled ("closing with 1
    # records in flight ...: they are not committed and will be processed again")
    pc.close(drain=False, timeout=2)
    # Then the record is left for the next owner, not written to the dead-letter topic
    assert pc.statistics().records_dead_lettered == 0
    assert cluster.records("t.dlq") == []
