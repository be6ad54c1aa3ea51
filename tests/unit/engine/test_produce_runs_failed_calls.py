"""poll_and_produce in runs, when a call fails its record with ``PollContext.fail`` (Skip,
DeadLetter, a plain exception, no outputs), in KEY and UNORDERED order and in the transactional
mode, compared with the same consumer with runs off; the in-flight state of the failed record
between its run's end and its outputs' acknowledgement (lane, statistics, credit, hooks, a
revoke in between); the detached-run adopted call; and ``Outputs._produce`` with several
rejected calls in one run and a full queue in the middle. On the in-memory fakes."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message
from doubles import stepped_controller
from produce_doubles import (
    TP,
    WARM_UP,
    FakeOutputs,
    Taker,
    engine,
    messages,
    new_runs,
    out,
    produce_inputs,
    released,
)

import parallel_consumer.engine.controller as controller_module
from parallel_consumer import (
    CommitMode,
    DeadLetter,
    Options,
    PollContext,
    ProcessingOrder,
    ProducerRecord,
    Skip,
)
from parallel_consumer._events import (
    Assignment,
    OutputsDelivered,
    PartitionsAssigned,
    PartitionsRevoked,
    RecordsPolled,
    RunDone,
    WorkDone,
)
from parallel_consumer.hooks import NoHooks
from parallel_consumer.kafka.producer import Outputs
from parallel_consumer.testing.clock import FakeClock

# -- stepped by hand: the test plays the worker and the producer ------------------------------


class CountingHooks(NoHooks):
    def __init__(self) -> None:
        self.seen: Counter = Counter()

    def on_failure(self, record, error) -> None:
        self.seen["failure", record.offset] += 1

    def on_retry(self, record, error, delay) -> None:
        self.seen["retry", record.offset] += 1

    def on_skip(self, record, error, reason) -> None:
        self.seen["skip", record.offset] += 1

    def on_dead_letter(self, record, error, reason) -> None:
        self.seen["dead_letter", record.offset] += 1


def play(run, plan: list) -> tuple[int, BaseException | None]:
    """Play the worker of ``run``: ``plan`` per call, ("ok", value) or ("fail", error, value):
    a call that failed its record with PollContext.fail and returned ``value``. Returns the
    RunDone's ``ok`` and ``error``."""
    run.started = 1.0
    for step in plan:
        run.pending.popleft()
        if step[0] == "ok":
            run.outputs.append(step[1])
            run.done += 1
            continue
        run.outputs.append(step[2])
        return run.done, step[1]
    return run.done, None


def lane_busy(controller, key: bytes) -> int:
    shard = controller._shards._shards.get(("t", 0, key))
    return 0 if shard is None else shard.busy


FAILURES = {
    "skip": lambda: Skip("tell downstream anyway"),
    "dead_letter": lambda: DeadLetter("bad"),
    "plain": lambda: RuntimeError("flaky"),
}


@pytest.mark.parametrize("ordering", [ProcessingOrder.KEY, ProcessingOrder.UNORDERED])
@pytest.mark.parametrize("kind", sorted(FAILURES))
@pytest.mark.parametrize("returns", ["output", "none"])
def test_ctx_fail_in_a_run_produces_then_fails_once(ordering, kind, returns):
    """A run a0, b1, c2: a0 succeeds, b1 is failed with PollContext.fail and returns an output
    (or None). b1's output is produced as a call of its own; its failure applies once that is
    acknowledged (not before), exactly once; its lane stays busy meanwhile; credit and
    statistics add up."""
    hooks = CountingHooks()
    controller, runner, sent = engine(ordering, hooks, dead_letters=True)
    seen: set = set()
    msgs = messages("abc")
    controller.post(RecordsPolled({TP: (1, msgs)}))
    controller.run_once(block=False)
    (run,) = new_runs(runner, seen)
    value = out(msgs[1]) if returns == "output" else None
    ok, error = play(run, [("ok", out(msgs[0])), ("fail", FAILURES[kind](), value)])
    controller.post(RunDone(run, ok, error, controller._clock.monotonic(), 1e-6))
    controller.run_once(block=False)
    assert [o for _, o, _ in sent.runs] == [[out(msgs[0])]]
    state = controller._partitions[TP]
    if returns == "output":
        assert sent.calls
        assert sent.calls[0][1] == [value]
        batch = sent.calls[0][0]
        # nothing applied yet: b1 unfinished, no hook called, its lane busy, counted
        assert not hooks.seen
        assert 1 in state.incomplete
        if ordering is ProcessingOrder.KEY:
            assert lane_busy(controller, b"b") == 1
        stats = controller.statistics()
        assert stats.delivering == 2  # a0 (run outputs) and b1
        # (c2 went to its lane and out as a single call; b1 is no call in flight)
        assert [i.offset for b in controller._in_flight for i in b.items] == [2]
        # more of key b polled: it waits for b1 (KEY)
        controller.post(RecordsPolled({TP: (1, messages("b", 3))}))
        controller.run_once(block=False)
        dispatched = {ctx.records[0].offset for _, ctx in runner.singles}
        if ordering is ProcessingOrder.KEY:
            assert 3 not in dispatched
        controller.post(OutputsDelivered(((batch, ((0, 0),)),), ((sent.runs[0][0], None),)))
        controller.run_once(block=False)
    else:
        assert not [b for b, _ in sent.calls if b > 0]  # (a dead letter may be on its way)
        controller.post(OutputsDelivered((), ((sent.runs[0][0], None),)))
        controller.run_once(block=False)
    expected = {
        "skip": {("skip", 1): 1},
        "dead_letter": {},  # (written once its letter is acknowledged)
        "plain": {("failure", 1): 1, ("retry", 1): 1},
    }[kind]
    assert dict(hooks.seen) == expected
    if kind == "dead_letter":
        letters = [(b, o) for b, o in sent.calls if b < 0]
        assert len(letters) == 1
        controller.post(OutputsDelivered(((letters[0][0], ((0, 0),)),)))
        controller.run_once(block=False)
        assert dict(hooks.seen) == {("dead_letter", 1): 1}
    # finish everything still out: calls of the lanes succeed with their output
    done_calls: set = set()
    for _ in range(10):
        calls = [(b, tuple((0, 0) for _ in o)) for b, o in sent.calls if b > 0]
        runs = [(r, None) for r, _, _ in sent.runs]
        sent.calls.clear()
        sent.runs.clear()
        if calls or runs:
            controller.post(OutputsDelivered(tuple(calls), tuple(runs)))
        for b, ctx in [(b, c) for b, c in runner.singles if b not in done_calls]:
            done_calls.add(b)
            controller.post(WorkDone(b, (None,), out(ctx.records[0].message), 1.0))
        for r in new_runs(runner, seen):
            ok, error = play(r, [("ok", out(m)) for m in list(r.pending)])
            controller.post(RunDone(r, ok, error, controller._clock.monotonic(), 1e-6))
        controller.run_once(block=False)
    total = 3 + (1 if returns == "output" else 0)
    stats = controller.statistics()
    assert stats.in_flight == 0
    assert stats.delivering == 0
    assert stats.waiting == 0
    assert not controller._shards._held
    assert released(controller) == total
    assert controller._partitions[TP].incomplete.lowest() is None
    finished = (
        stats.records_succeeded + stats.records_skipped_on_failure + stats.records_dead_lettered
    )
    assert finished == total
    for key in (b"a", b"b", b"c"):
        assert lane_busy(controller, key) == 0


def test_ctx_fail_in_a_run_then_revoke_and_reassign_before_its_outputs_are_acknowledged():
    """b1 failed with PollContext.fail and its output is on its way when the partition is
    revoked and assigned again: the new epoch's b must wait for the old output (lane held as
    for a stale call), the old result is stale, credit comes back once."""
    hooks = CountingHooks()
    controller, runner, sent = engine(ProcessingOrder.KEY, hooks, dead_letters=True)
    seen: set = set()
    msgs = messages("ab")
    controller.post(RecordsPolled({TP: (1, msgs)}))
    controller.run_once(block=False)
    (run,) = new_runs(runner, seen)
    ok, error = play(run, [("ok", out(msgs[0])), ("fail", RuntimeError("x"), out(msgs[1]))])
    controller.post(RunDone(run, ok, error, controller._clock.monotonic(), 1e-6))
    controller.run_once(block=False)
    ((batch, _),) = sent.calls
    reply: Future = Future()
    controller.post(PartitionsRevoked((TP,), reply))
    controller.post(PartitionsAssigned((Assignment(TP, 2, None, None),)))
    controller.post(RecordsPolled({TP: (2, messages("ab"))}))
    controller.run_once(block=False)
    assert reply.done()
    assert not new_runs(runner, seen)  # a held by run outputs, b by the stale call
    assert not runner.singles
    controller.post(OutputsDelivered(((batch, ((0, 0),)),), ((sent.runs[0][0], None),)))
    controller.run_once(block=False)
    assert not hooks.seen  # stale: the record's failure is not counted
    assert controller.statistics().results_stale >= 2
    # epoch 2's a and b can go now
    started = new_runs(runner, seen)
    offsets = sorted(
        [m.offset() for r in started for m in r.messages]
        + [ctx.records[0].offset for _, ctx in runner.singles]
    )
    assert offsets == [0, 1]
    assert released(controller) == 2
    assert not controller._shards._stale_running


def test_ctx_fail_in_a_detached_run_adopted_call():
    """The stuck check detached a run while b1 ran; b1 then fails its record with
    PollContext.fail and returns an output: produced once, failure after acknowledgement."""
    hooks = CountingHooks()
    controller, runner, sent = engine(ProcessingOrder.KEY, hooks, dead_letters=True)
    seen: set = set()
    msgs = messages("abc")
    controller.post(RecordsPolled({TP: (1, msgs)}))
    controller.run_once(block=False)
    (run,) = new_runs(runner, seen)
    run.started = 1.0
    run.pending.popleft()
    run.outputs.append(out(msgs[0]))
    run.done = 1
    run.pending.popleft()  # b1 started
    controller._detach_run(run, drop=False)
    assert run.adopted is not None
    controller.run_once(block=False)
    assert len(sent.runs) == 1  # a0's output
    run.outputs.append(out(msgs[1]))  # b1 returned an output and failed its record
    controller.post(RunDone(run, 1, RuntimeError("x"), controller._clock.monotonic(), 1e-6))
    controller.run_once(block=False)
    calls = [(b, o) for b, o in sent.calls if b > 0]
    assert len(calls) == 1
    assert calls[0][1] == [out(msgs[1])]
    assert not hooks.seen
    assert lane_busy(controller, b"b") == 1
    controller.post(OutputsDelivered(((calls[0][0], ((0, 0),)),)))
    controller.run_once(block=False)
    assert dict(hooks.seen) == {("failure", 1): 1, ("retry", 1): 1}
    # c2 (its lane) and b1's retry (retry_delay=0) are single calls now
    assert sorted(i.offset for b in controller._in_flight for i in b.items) == [1, 2]
    assert not controller._adopted


@pytest.mark.parametrize("interval", [None, 0.0])
def test_metrics_sample_a_failed_call_of_a_run_once(interval):
    """Metrics (CallSampling with interval None, or 0: every call) see the call of a run that
    failed its record with PollContext.fail once, with its real duration. The fix's path adds
    an in-flight batch started *now* and runs _work_done, which samples the same call again
    with a duration <= 0."""
    from parallel_consumer.hooks import CallSampling

    samples: list = []
    runner = Taker()
    sent = FakeOutputs()
    options = Options(ordering=ProcessingOrder.KEY, commit_interval=60, retry_delay=0)
    controller = stepped_controller(FakeClock(), options=options, runner=runner, outputs=sent)
    controller._sampling = CallSampling(
        interval,
        10.0,
        lambda records, errors, took, periodic: samples.append(
            ([m.offset() for m in records], took, periodic)
        ),
    )
    controller._observe_service(1e-6)
    controller.run_once(block=False)
    seen: set = set()
    msgs = messages("ab")
    controller.post(RecordsPolled({TP: (1, msgs)}))
    controller.run_once(block=False)
    (run,) = new_runs(runner, seen)
    ok, error = play(run, [("ok", out(msgs[0])), ("fail", RuntimeError("x"), out(msgs[1]))])
    controller._clock.advance(0.5)  # (the controller handles the report a little later)
    # the worker timed both calls (the first, and the failed one)
    event = RunDone(
        run, ok, error, controller._clock.monotonic() - 0.5, 1e-6, ((0, 1e-6), (1, 2e-6))
    )
    controller.post(event)
    controller.run_once(block=False)
    of_b1 = [s for s in samples if s[0] == [1]]
    assert len(of_b1) == 1, f"call of offset 1 sampled {len(of_b1)} times: {of_b1}"


# -- the producer: several rejected calls in one run, a full queue in the middle ------------


class ScriptedProducer:
    """produce() raises per script (by call number), else records the delivery callback."""

    def __init__(self, script: dict[int, BaseException]) -> None:
        self.script = script
        self.calls = 0
        self.produced: list[tuple[bytes, Any]] = []

    def produce(self, topic, value, key, partition=-1, headers=None, on_delivery=None):
        self.calls += 1
        error = self.script.get(self.calls)
        if error is not None:
            raise error
        self.produced.append((value, on_delivery))

    def poll(self, timeout):
        return 0


def rejected() -> KafkaException:
    return KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))


def test_produce_run_with_rejections_and_a_full_queue_in_between():
    """Outputs of one run: owners [0, 0, 1, 1, 2, 3, 3]. Output 1 (call 0) is rejected; the
    queue is full at output 2 (call 1, first try); after the pump output 3 (call 1) is
    rejected; output 4 (call 2) goes; output 5 (call 3) is rejected. Calls 0, 1 and 3 fail,
    call 2 does not; nothing is produced twice, nothing of a failed call after its rejection."""
    owners = [0, 0, 1, 1, 2, 3, 3]
    records = [ProducerRecord("out", b"%d" % i) for i in range(len(owners))]
    # produce() call numbers: 1 -> out0 ok, 2 -> out1 rejected, 3 -> out2 BufferError,
    # (pump) 4 -> out2 ok, 5 -> out3 rejected, 6 -> out4 ok, 7 -> out5 rejected
    producer = ScriptedProducer({2: rejected(), 3: BufferError(), 5: rejected(), 7: rejected()})
    outputs = Outputs(producer, post=lambda e: None, transactional=False)
    outputs.send_run(7, records, owners)
    assert outputs.backlog
    outputs.pump()
    assert not outputs.backlog
    assert [v for v, _ in producer.produced] == [b"0", b"2", b"4"]
    assert not outputs._settled_runs
    for _, report in producer.produced:
        msg = Message(topic="out", partition=0, offset=0, value=b"")
        report(None, msg)
    (settled,) = list(outputs._settled_runs)
    run_id, failures = settled
    assert run_id == 7
    assert sorted(failures) == [0, 1, 3]
    assert "output 1" in str(failures[0])  # (numbered within its call)
    assert "output 1" in str(failures[1])
    assert "output 0" in str(failures[3])


def test_produce_single_call_rejected_after_resuming_from_the_backlog():
    """One call (send), 3 outputs; queue full at output 1, then output 1 rejected on pump:
    output 2 is not sent, the call settles once with every output accounted for."""
    records = [ProducerRecord("out", b"%d" % i) for i in range(3)]
    producer = ScriptedProducer({2: BufferError(), 3: rejected()})
    outputs = Outputs(producer, post=lambda e: None, transactional=False)
    outputs.send(5, records)
    outputs.pump()
    assert [v for v, _ in producer.produced] == [b"0"]
    producer.produced[0][1](None, Message(topic="out", partition=0, offset=9, value=b""))
    (settled,) = list(outputs._settled)
    batch, results = settled
    assert batch == 5
    assert results[0] == (0, 9)
    assert all(isinstance(r, BaseException) for r in results[1:])


# -- the real thing on the fakes: runs on vs off ---------------------------------------------


def log_values(cluster, topic: str) -> list:
    return [m.value() for p in cluster._logs[topic] for m in list(p)]


class Hooked(NoHooks):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: Counter = Counter()

    def _add(self, what, record) -> None:
        with self.lock:
            self.seen[what, int(record.value)] += 1

    def on_failure(self, record, error) -> None:
        self._add("failure", record)

    def on_skip(self, record, error, reason) -> None:
        self._add("skip", record)

    def on_dead_letter(self, record, error, reason) -> None:
        self._add("dead_letter", record)


def handler(ctx: PollContext) -> Any:
    """value % 53: 0 Skip + output, 1 plain failure + output on the first attempt, 2 DeadLetter
    + output, 3 plain failure returning None on the first attempt, 4 two outputs; else one
    output. (Sparse, so that runs go on between failures.)"""
    v = int(ctx.value)
    kind = v % 53
    first = ctx.record.attempts == 0
    mine = ProducerRecord("out", ctx.value, key=ctx.key)
    if kind == 0:
        ctx.fail(ctx.record, Skip("tell downstream"))
    elif kind == 1 and first:
        ctx.fail(ctx.record, RuntimeError("flaky"))
    elif kind == 2:
        ctx.fail(ctx.record, DeadLetter("bad"))
    elif kind == 3 and first:
        ctx.fail(ctx.record, RuntimeError("flaky, no output"))
        return None
    elif kind == 4:
        return [mine, ProducerRecord("out", ctx.value + b"+", key=ctx.key)]
    return mine


FAILED_IN_RUNS: Counter = Counter()


@pytest.fixture(autouse=True)
def count_failed_calls_in_runs(monkeypatch):
    """Counts runs that ended in a call that failed its record with PollContext.fail and
    returned a value (the path that lost outputs), to show the comparison exercised it."""
    original = controller_module.Controller._on_run_done

    def spy(self, event):
        run = event.run
        if event.error is not None and run.outputs is not None and len(run.outputs) > event.ok:
            FAILED_IN_RUNS["detached" if run.adopted else "run"] += 1
        return original(self, event)

    FAILED_IN_RUNS.clear()
    monkeypatch.setattr(controller_module.Controller, "_on_run_done", spy)


def run_scenario(harness, cluster, wait_until, *, ordering, transactional) -> dict:
    n = WARM_UP + 5 * 1_000
    cluster.create_topic("t")
    cluster.create_topic("out")
    cluster.create_topic("dlq")
    produce_inputs(cluster, 0, WARM_UP, 50)
    hooks = Hooked()
    extra: dict = {}
    if transactional:
        extra = {"commit_mode": CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER, "commit_interval": 0.05}
    pc = harness.make(
        Options(
            ordering=ordering, max_concurrency=4, retry_delay=0, dead_letter_topic="dlq", **extra
        ),
        hooks=hooks,
        producer_config={"transactional.id": "tx"} if transactional else None,
    )
    pc.poll_and_produce(handler)

    def finished() -> int:
        s = pc.statistics()
        return s.records_succeeded + s.records_skipped_on_failure + s.records_dead_lettered

    wait_until(lambda: finished() >= WARM_UP, timeout=60)
    runs_before = pc.statistics().runs
    for start in range(WARM_UP, n, 1_000):  # in waves: runs start again after failures
        produce_inputs(cluster, start, start + 1_000, 50)
        wait_until(lambda start=start: finished() >= start + 1_000, timeout=60)
        # Each wave starts once the last one is committed: a commit past a partition's failed
        # records clears its failure history, which keeps runs off until then (transactional
        # commits come late enough that, without this, a whole scenario could pass without a
        # run).
        wait_until(
            lambda start=start: (cluster.committed("g", "t", 0) or (0,))[0] == start + 1_000,
            timeout=30,
        )
    wait_until(lambda: (cluster.committed("g", "t", 0) or (0,))[0] == n, timeout=30)
    s = pc.statistics()
    if transactional:
        # (dead letters included: committed_outputs does not tell topics apart)
        outs = list(harness.producers[0].committed_outputs())
    else:
        outs = log_values(cluster, "out")
    return {
        "outputs": Counter(outs),
        "dead": len(log_values(cluster, "dlq")) if not transactional else None,
        "hooks": dict(hooks.seen),
        "skipped": s.records_skipped_on_failure,
        "dead_lettered": s.records_dead_lettered,
        "failed": s.records_failed,
        "runs": s.runs - runs_before,
    }


@pytest.mark.parametrize(
    ("ordering", "transactional"),
    [
        (ProcessingOrder.KEY, False),
        (ProcessingOrder.UNORDERED, False),
        (ProcessingOrder.KEY, True),
    ],
)
def test_ctx_fail_variants_in_runs_match_runs_off(
    harness, cluster, wait_until, monkeypatch, ordering, transactional
):
    with_runs = run_scenario(
        harness, cluster, wait_until, ordering=ordering, transactional=transactional
    )
    # The path under test ran: runs started, and at least one ended in a fail() call that
    # returned a value (each wave starts on a clean failure history, see run_scenario)
    assert with_runs["runs"], "no run started"
    assert FAILED_IN_RUNS["run"], f"no run ended in a fail() call: {FAILED_IN_RUNS}"
    print(
        f"\n{ordering.name} transactional={transactional}: {with_runs['runs']} runs, "
        f"{dict(FAILED_IN_RUNS)} ended in a fail() call that returned a value"
    )
    # the same again, runs off, on a fresh cluster
    from parallel_consumer.testing.fakes import FakeCluster

    harness.close_all()
    monkeypatch.setattr(controller_module, "RUNS", False)
    other_cluster = FakeCluster()
    other = type(harness)(other_cluster)  # (not imported: conftest names collide)
    try:
        without = run_scenario(
            other, other_cluster, wait_until, ordering=ordering, transactional=transactional
        )
    finally:
        other.close_all()
    assert without["runs"] == 0
    for field in ("outputs", "dead", "hooks", "skipped", "dead_lettered", "failed"):
        assert with_runs[field] == without[field], field
