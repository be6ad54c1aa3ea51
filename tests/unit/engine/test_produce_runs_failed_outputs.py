"""poll_and_produce in runs, when records or their outputs fail, on the in-memory fakes: a call
that fails its record with ``PollContext.fail`` still produces its outputs, a rejected output
fails only its own record (both used to break the run), and revokes, a failed output while the
next run is out, transactional rebalances with failed deliveries, close with outputs on their
way, and a wrong return value each keep holds, credit and commits right."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import Future

import pytest
from produce_doubles import (
    TP,
    WARM_UP,
    engine,
    messages,
    new_runs,
    out,
    outputs,
    produce_inputs,
    released,
)

from parallel_consumer import (
    CommitMode,
    OnExhausted,
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
from parallel_consumer.produce import ProduceError


def finished(pc) -> int:
    stats = pc.statistics()
    return stats.records_succeeded + stats.records_skipped_on_failure


def test_ctx_fail_skip_with_an_output_in_a_run_still_produces_the_output(
    harness, cluster, wait_until
):
    """docs/failure-handling.md (With poll_and_produce): "An output the handler returns for a
    record it also fails is the handler's choice and is produced each time." """
    n = WARM_UP + 2_000
    cluster.create_topic("t")
    cluster.create_topic("out")
    produce_inputs(cluster, 0, WARM_UP, 50)
    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=4, retry_delay=0))

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord:
        if int(ctx.value) % 10 == 0:
            ctx.fail(ctx.record, Skip("not interesting, but tell downstream"))
        return ProducerRecord("out", ctx.value, key=ctx.key)

    wait_until(lambda: finished(pc) >= WARM_UP, timeout=60)
    runs_before = pc.statistics().runs
    produce_inputs(cluster, WARM_UP, n, 50)
    wait_until(lambda: finished(pc) >= n, timeout=60)
    assert pc.statistics().runs > runs_before  # (the second part went out in runs)
    written = sorted(int(m.value()) for m in outputs(cluster))
    missing = sorted(set(range(n)) - set(written))
    assert not missing, f"{len(missing)} skipped records lost their output, e.g. {missing[:5]}"


def test_a_rejected_output_in_a_run_does_not_fail_the_other_records_of_the_run(
    harness, cluster, wait_until
):
    """One record's output is larger than message.max.bytes: produce() rejects it. Only that
    record fails, as it would one call at a time."""
    n = WARM_UP + 2_000
    big = WARM_UP + 500
    cluster.create_topic("t")
    cluster.create_topic("out")
    produce_inputs(cluster, 0, WARM_UP, 50)
    pc = harness.make(
        Options(
            ordering=ProcessingOrder.KEY,
            max_concurrency=4,
            retry_delay=0,
            max_retries=0,
            on_retries_exhausted=OnExhausted.SKIP,
        ),
        producer_config={"message.max.bytes": 1_000},
    )

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> ProducerRecord:
        value = b"x" * 2_000 if int(ctx.value) == big else ctx.value
        return ProducerRecord("out", value, key=ctx.key)

    wait_until(lambda: pc.statistics().records_succeeded >= WARM_UP, timeout=60)
    produce_inputs(cluster, WARM_UP, n, 50)
    wait_until(lambda: finished(pc) >= n, timeout=60)
    stats = pc.statistics()
    assert stats.runs > 0
    written = {int(m.value()) for m in outputs(cluster)}
    missing = sorted(set(range(n)) - written - {big})
    assert stats.records_skipped_on_failure == 1, (
        f"{stats.records_skipped_on_failure} records skipped, {len(missing)} innocent ones "
        f"without output, e.g. {missing[:5]}"
    )
    assert not missing


# -- stepped by hand: the test plays the worker and the producer ------------------------------


def work(controller, run, calls: int | None = None, *, report: bool = True) -> None:
    """Play the worker: run ``calls`` records of ``run`` (all by default), each returning
    one output; report the run's end if ``report``."""
    run.started = 1.0
    calls = len(run.pending) if calls is None else calls
    for _ in range(calls):
        message = run.pending.popleft()
        run.outputs.append(out(message))
        run.done += 1
    if report:
        controller.post(RunDone(run, run.done, None, controller._clock.monotonic(), 1e-6))


def test_revoke_and_reassign_while_run_outputs_are_on_their_way_keeps_holds_and_credit():
    controller, runner, sent = engine()
    seen: set = set()
    controller.post(RecordsPolled({TP: (1, messages("abc"))}))
    controller.run_once(block=False)
    (r1,) = new_runs(runner, seen)
    work(controller, r1)
    controller.run_once(block=False)
    assert len(sent.runs) == 1  # a, b, c held until acknowledged
    # more records of a held key: no run starts on it
    controller.post(RecordsPolled({TP: (1, messages("ad", 3))}))
    controller.run_once(block=False)
    assert not new_runs(runner, seen)
    # revoke and assign again (new epoch): the same records come again
    reply: Future = Future()
    controller.post(PartitionsRevoked((TP,), reply))
    controller.post(PartitionsAssigned((Assignment(TP, 2, None, None),)))
    controller.post(RecordsPolled({TP: (2, messages("abcad"))}))
    controller.run_once(block=False)
    assert reply.done()
    assert not new_runs(runner, seen)  # a is still held (outputs of epoch 1 on their way)
    # the old outputs are acknowledged: stale, holds end, the new epoch's records run
    controller.post(OutputsDelivered((), ((sent.runs[0][0], None),)))
    controller.run_once(block=False)
    assert not controller._shards._held
    (r2,) = new_runs(runner, seen)
    assert [m.key() for m in r2.messages] == [b"a", b"b", b"c"]
    work(controller, r2)
    controller.run_once(block=False)
    controller.post(OutputsDelivered((), ((sent.runs[-1][0], None),)))
    controller.run_once(block=False)
    (r3,) = new_runs(runner, seen)
    work(controller, r3)
    controller.run_once(block=False)
    controller.post(OutputsDelivered((), ((sent.runs[-1][0], None),)))
    controller.run_once(block=False)
    assert not controller._shards._held
    assert controller._pending.records == 0
    assert controller._runs.records_out == 0
    assert released(controller) == 3 + 2 + 5
    assert controller._partitions[TP].totals.succeeded >= 5


def test_failed_run_output_detaches_the_run_out_and_every_record_finishes_once():
    controller, runner, sent = engine()
    seen: set = set()
    controller.post(RecordsPolled({TP: (1, messages("ab"))}))
    controller.run_once(block=False)
    (r1,) = new_runs(runner, seen)
    work(controller, r1)
    controller.run_once(block=False)
    controller.post(RecordsPolled({TP: (1, messages("cdea", 2))}))
    controller.run_once(block=False)
    (r2,) = new_runs(runner, seen)
    assert [m.key() for m in r2.messages] == [b"c", b"d", b"e"]  # (cut before held a)
    # the worker finished c and is inside d when a's output fails
    work(controller, r2, 1, report=False)
    r2.pending.popleft()  # d started
    controller.post(OutputsDelivered((), ((sent.runs[0][0], {0: ProduceError("x")}),)))
    controller.run_once(block=False)
    assert r2.detached
    assert r2.adopted is not None
    # a@0 is retried alone; a@5 waits behind it in lane a
    singles = {ctx.records[0].offset: b for b, ctx in runner.singles}
    assert 0 in singles
    assert 5 not in singles
    # the worker ends d (it returned an output)
    r2.outputs.append(out(r2.messages[1]))
    r2.done += 1
    controller.post(RunDone(r2, 2, None, controller._clock.monotonic(), 1e-6))
    # a@0's retry succeeds
    controller.post(WorkDone(singles[0], (None,), out(r1.messages[0]), 1.0))
    controller.run_once(block=False)
    done_calls = {singles[0]}
    # acknowledge everything sent so far, until nothing is left
    for _ in range(10):
        runs = [(r, None) for r, _, _ in sent.runs]
        calls = [(b, tuple((0, 0) for _ in o)) for b, o in sent.calls]
        sent.runs.clear()
        sent.calls.clear()
        if runs or calls:
            controller.post(OutputsDelivered(tuple(calls), tuple(runs)))
        for b, ctx in [(b, ctx) for b, ctx in runner.singles if b not in done_calls]:
            done_calls.add(b)
            controller.post(WorkDone(b, (None,), out(ctx.records[0].message), 1.0))
        for r in new_runs(runner, seen):
            work(controller, r)
        controller.run_once(block=False)
    state = controller._partitions[TP]
    assert state.totals.succeeded == 6
    assert not controller._shards._held
    assert not controller._in_flight
    assert not controller._pending
    assert controller._pending.records == 0
    assert controller._runs.records_out == 0
    assert released(controller) == 6


# -- transactional, with rebalances and failed deliveries while runs are out -------------------


def coordinates(ctx: PollContext) -> ProducerRecord:
    return ProducerRecord("out", b"%d:%d" % (ctx.partition, int(ctx.value)), key=ctx.key)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_transactional_runs_with_rebalances_and_failed_deliveries(harness, cluster, seed):
    rng = random.Random(seed)
    keys, waves, per_wave = 200, 6, 2_000
    cluster.create_topic("t", 2)
    cluster.create_topic("out")
    produce_inputs(cluster, 0, WARM_UP, keys, 2)
    pc = harness.make(
        Options(
            ordering=ProcessingOrder.KEY,
            max_concurrency=8,
            retry_delay=0,
            commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
            commit_interval=0.05,
        ),
        producer_config={"transactional.id": "tx"},
    )
    pc.poll_and_produce(coordinates)
    producer, consumer = harness.producers[0], harness.consumers[0]
    end = WARM_UP

    def committed_upto() -> tuple:
        return tuple((cluster.committed("g", "t", p) or (0,))[0] for p in (0, 1))

    def target(end: int) -> tuple:
        return ((end + 1) // 2, end // 2)

    deadline = time.monotonic() + 60
    while committed_upto() != target(end):
        assert time.monotonic() < deadline, "warm-up"
        time.sleep(0.005)
    producer.fail_deliveries_at_random(0.01, seed=seed)
    for _ in range(waves):
        produce_inputs(cluster, end, end + per_wave, keys, 2)
        end += per_wave
        time.sleep(rng.random() * 0.05)
        action = rng.choice(["revoke", "lose", "revoke_assign", "none"])
        tp = ("t", rng.randrange(2))
        if action == "revoke":
            consumer.rebalance(revoke=[tp])
            time.sleep(rng.random() * 0.05)
            consumer.rebalance(assign=[tp])
        elif action == "lose":
            consumer.lose([tp])
            time.sleep(rng.random() * 0.05)
            consumer.rebalance(assign=[tp])
        elif action == "revoke_assign":
            consumer.rebalance(revoke=[tp], assign=[tp])
    producer.fail_deliveries_at_random(0.0)
    deadline = time.monotonic() + 90
    while committed_upto() != target(end):
        assert pc.failure is None, pc.failure
        assert time.monotonic() < deadline, (
            f"stalled: committed {committed_upto()} of {target(end)}; {pc.statistics()}"
        )
        time.sleep(0.01)
    committed = producer.committed_outputs()
    twice = {v for v, c in Counter(committed).items() if c > 1}
    assert not twice, f"{len(twice)} outputs committed twice"
    expected = {b"%d:%d" % (i % 2, i) for i in range(end)}
    missing = expected - set(committed)
    assert not missing, f"{len(missing)} inputs committed without their output"
    lanes: dict = {}
    for value in committed:
        partition, i = value.split(b":")
        lanes.setdefault((partition, int(i) % keys), []).append(int(i))
    for lane, values in lanes.items():
        assert values == sorted(values), f"outputs of {lane} out of order"
    assert pc.statistics().runs > 0


def handle_plain(ctx: PollContext) -> ProducerRecord:
    return ProducerRecord("out", ctx.value, key=ctx.key)


@pytest.mark.parametrize("drain", [True, False])
@pytest.mark.parametrize("transactional", [False, True])
def test_close_with_run_outputs_on_their_way(harness, cluster, wait_until, drain, transactional):
    keys = 100
    cluster.create_topic("t")
    cluster.create_topic("out")
    produce_inputs(cluster, 0, WARM_UP, keys)
    if transactional:
        options = Options(
            ordering=ProcessingOrder.KEY,
            max_concurrency=8,
            retry_delay=0,
            commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
            commit_interval=0.05,
        )
        pc = harness.make(options, producer_config={"transactional.id": "tx"})
    else:
        options = Options(ordering=ProcessingOrder.KEY, max_concurrency=8, retry_delay=0)
        pc = harness.make(options)
    pc.poll_and_produce(handle_plain)
    producer = harness.producers[0]
    wait_until(lambda: (cluster.committed("g", "t", 0) or (0,))[0] == WARM_UP, timeout=60)
    producer.hold.set()
    produce_inputs(cluster, WARM_UP, WARM_UP + 2_000, keys)
    wait_until(lambda: pc.statistics().outputs_sent >= WARM_UP + keys, timeout=30)
    threading.Timer(0.3, producer.hold.clear).start()
    started = time.monotonic()
    pc.close(drain=drain, timeout=10)
    assert time.monotonic() - started < 8, "close waited for its deadline"
    upto = (cluster.committed("g", "t", 0) or (0,))[0]
    if transactional:
        values = {int(v) for v in producer.committed_outputs()}
    else:
        values = {int(m.value()) for m in outputs(cluster)}
    missing = sorted(set(range(upto)) - values)
    assert not missing, f"committed up to {upto} but {len(missing)} outputs missing"
    if drain:
        assert upto == WARM_UP + 2_000


def test_a_wrong_return_value_in_a_run_fails_only_its_record(harness, cluster, wait_until):
    n = WARM_UP + 2_000
    bad = WARM_UP + 500
    cluster.create_topic("t")
    cluster.create_topic("out")
    produce_inputs(cluster, 0, WARM_UP, 50)
    pc = harness.make(
        Options(
            ordering=ProcessingOrder.KEY,
            max_concurrency=4,
            retry_delay=0,
            max_retries=0,
            on_retries_exhausted=OnExhausted.SKIP,
        )
    )

    @pc.poll_and_produce
    def handle(ctx: PollContext) -> object:
        if int(ctx.value) == bad:
            return "not an output"
        return ProducerRecord("out", ctx.value, key=ctx.key)

    wait_until(lambda: pc.statistics().records_succeeded >= WARM_UP, timeout=60)
    produce_inputs(cluster, WARM_UP, n, 50)
    wait_until(lambda: finished(pc) >= n, timeout=60)
    assert pc.statistics().records_skipped_on_failure == 1
    written = sorted(int(m.value()) for m in outputs(cluster))
    assert written == sorted(set(range(n)) - {bad})
