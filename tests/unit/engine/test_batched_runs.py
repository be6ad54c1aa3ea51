"""Batched runs: with ``batch_size`` > 1 and short calls, a partition's consecutive records go
to one worker as a run that calls the handler with batches of them (docs/performance.md#runs),
keeping the batch rules of docs/ordering.md "Batches".

Each test would fail if a batch of a run held two records of one key (KEY order), broke a
key's order, ran a record twice or never, lost or repeated the records around one failed with
``PollContext.fail`` or a batch that raised, or left a revoke's final commit short of what the
run finished."""

from __future__ import annotations

import threading
from collections import defaultdict

from doubles import stepped_controller

from parallel_consumer import Options, PollContext, ProcessingOrder
from parallel_consumer.testing.clock import FakeClock


def produce_keyed(cluster, n: int, keys: int, partitions: int, start: int = 0) -> None:
    if not start:
        cluster.create_topic("t", partitions)
    with cluster._cond:
        for i in range(start, n):
            cluster.produce("t", b"%d" % i, key=b"k%d" % (i % keys), partition=i % partitions)


def warmed_up(cluster, pc, handle, wait_until, n: int, keys: int, warm_up: int = 1_000) -> None:
    """Start ``pc`` on ``warm_up`` records of one partition and wait until they are done (the
    engine measured its calls, the lanes are empty); then produce the rest, up to ``n``: it
    goes to runs."""
    produce_keyed(cluster, warm_up, keys, partitions=1)
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded >= warm_up, timeout=60)
    produce_keyed(cluster, n, keys, partitions=1, start=warm_up)


class Calls:
    """Each handler call's records as (partition, key, offset, attempts)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[list[tuple[int, bytes, int, int]]] = []

    def add(self, ctx: PollContext) -> None:
        with self.lock:
            self.calls.append([(r.partition, r.key, r.offset, r.attempts) for r in ctx.records])

    def records(self) -> int:
        with self.lock:
            return sum(len(c) for c in self.calls)

    def by_key(self) -> dict[tuple[int, bytes], list[int]]:
        lanes: dict[tuple[int, bytes], list[int]] = defaultdict(list)
        with self.lock:
            for call in self.calls:
                for partition, key, offset, _ in call:
                    lanes[(partition, key)].append(offset)
        return lanes


def test_batched_runs_in_key_order_hold_distinct_keys_and_keep_each_keys_order(
    harness, cluster, wait_until
):
    # Given 20,000 records of 50 keys on 2 partitions, batches of 10, and a very short handler
    produce_keyed(cluster, 20_000, keys=50, partitions=2)
    calls = Calls()
    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=8, batch_size=10))
    pc.poll(calls.add)
    wait_until(lambda: calls.records() >= 20_000, timeout=60)
    wait_until(lambda: pc.statistics().records_succeeded == 20_000, timeout=30)

    # Then runs carried the batches, each a partition's records of distinct keys, at most 10
    assert pc.statistics().runs > 0
    with calls.lock:
        sizes = [len(c) for c in calls.calls]
        for call in calls.calls:
            lanes = [(partition, key) for partition, key, _, _ in call]
            assert len(set(lanes)) == len(lanes), f"two records of one key in a batch: {call}"
    assert max(sizes) == 10
    # and each key saw its records once each, in offset order
    lanes = calls.by_key()
    for offsets in lanes.values():
        assert offsets == sorted(set(offsets))
    assert sum(len(v) for v in lanes.values()) == 20_000


def test_batched_runs_in_key_order_cut_a_batch_where_a_key_repeats(harness, cluster, wait_until):
    # Given 6,000 records of 3 keys on one partition and batches of up to 10, the last 5,000
    # polled once the first are done (the lanes are empty: they go to runs)
    calls = Calls()
    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=4, batch_size=10))
    warmed_up(cluster, pc, calls.add, wait_until, 6_000, keys=3)
    wait_until(lambda: pc.statistics().records_succeeded == 6_000, timeout=60)

    # Then no batch held more records than there are keys, and each key kept its order
    assert pc.statistics().runs > 0
    with calls.lock:
        assert max(len(c) for c in calls.calls) == 3
    for offsets in calls.by_key().values():
        assert offsets == sorted(set(offsets))


def test_batched_runs_unordered_take_any_consecutive_records(harness, cluster, wait_until):
    # Given 20,000 records of 5 keys on 2 partitions, UNORDERED, batches of 50
    produce_keyed(cluster, 20_000, keys=5, partitions=2)
    calls = Calls()
    pc = harness.make(Options(ordering=ProcessingOrder.UNORDERED, max_concurrency=8, batch_size=50))
    pc.poll(calls.add)
    wait_until(lambda: pc.statistics().records_succeeded == 20_000, timeout=60)

    # Then runs carried full batches (keys repeat in them), each record ran once
    assert pc.statistics().runs > 0
    with calls.lock:
        assert max(len(c) for c in calls.calls) == 50
        seen = [(p, o) for call in calls.calls for p, _, o, _ in call]
    assert len(seen) == len(set(seen)) == 20_000


def test_a_record_failed_with_ctx_fail_in_a_batched_run_alone_is_retried(
    harness, cluster, wait_until
):
    # Given 10,000 records of 100 keys on one partition, batches of 10, and one record (late
    # enough to be in a run) that the handler fails with ctx.fail on its first attempt
    failing = 7_003
    calls = Calls()

    def handle(ctx: PollContext) -> None:
        calls.add(ctx)
        for record in ctx.records:
            if record.offset == failing and record.attempts == 0:
                ctx.fail(record, RuntimeError("first attempt fails"))

    pc = harness.make(
        Options(ordering=ProcessingOrder.KEY, max_concurrency=4, batch_size=10, retry_delay=0.05)
    )
    warmed_up(cluster, pc, handle, wait_until, 10_000, keys=100)
    wait_until(lambda: pc.statistics().records_succeeded == 10_000, timeout=60)

    # Then only that record ran twice; its key's later records ran after its retry, in order
    assert pc.statistics().runs > 0
    lanes = calls.by_key()
    ran = [o for offsets in lanes.values() for o in offsets]
    assert len(ran) == 10_001
    assert ran.count(failing) == 2
    key = (0, b"k%d" % (failing % 100))
    offsets = lanes[key]
    assert offsets == sorted(offsets)
    for other, offsets in lanes.items():
        if other != key:
            assert offsets == sorted(set(offsets))


def test_a_batch_of_a_run_that_raises_retries_its_records_in_key_order(
    harness, cluster, wait_until
):
    # Given 10,000 records of 100 keys on one partition, batches of 10, and a handler that
    # raises on the first attempt of the batch holding one record late enough to be in a run
    failing = 7_003
    calls = Calls()
    raised: list[list[int]] = []

    def handle(ctx: PollContext) -> None:
        calls.add(ctx)
        if any(r.offset == failing and r.attempts == 0 for r in ctx.records):
            raised.append([r.offset for r in ctx.records])
            raise RuntimeError("the batch fails")

    pc = harness.make(
        Options(ordering=ProcessingOrder.KEY, max_concurrency=4, batch_size=10, retry_delay=0.05)
    )
    warmed_up(cluster, pc, handle, wait_until, 10_000, keys=100)
    wait_until(lambda: pc.statistics().records_succeeded == 10_000, timeout=60)

    # Then the records of the failed batch ran again, once; every key kept its order
    assert pc.statistics().runs > 0
    assert len(raised) == 1
    lanes = calls.by_key()
    ran = [o for offsets in lanes.values() for o in offsets]
    assert len(ran) == 10_000 + len(raised[0])
    assert set(ran) == set(range(10_000))
    for offsets in lanes.values():
        assert offsets == sorted(offsets)


def batched_run(ordering: ProcessingOrder):
    """A stepped controller over a RunTaker, batches of 10, that handed out one run of 100
    records of distinct keys on t[0]: (controller, runner, run)."""
    from confluent_kafka import Message
    from doubles import RunTaker

    from parallel_consumer._events import RecordsPolled

    runner = RunTaker()
    options = Options(ordering=ordering, commit_interval=60, batch_size=10)
    controller = stepped_controller(FakeClock(), options=options, runner=runner)
    controller.dispatch.observe_service(1e-6)  # calls measured short: records go out in runs
    messages = [Message(topic="t", partition=0, offset=o, key=b"k%d" % o) for o in range(100)]
    controller.post(RecordsPolled({("t", 0): (1, messages)}))
    controller.run_once(block=False)
    (run,) = [task for task in runner.taken if hasattr(task, "pending")]
    assert run.batched
    assert [len(batch) for batch in run.pending] == [10] * 10
    return controller, runner, run


def test_a_revoke_commits_the_batches_a_batched_run_finished():
    from concurrent.futures import Future

    from parallel_consumer._events import Commit, PartitionsRevoked

    controller, _, run = batched_run(ProcessingOrder.KEY)
    # The worker finished 4 batches; the 5th is in progress
    run.started = 1.0
    for _ in range(5):
        run.pending.popleft()
    run.done = 40
    # When the partition is revoked
    reply: Future[None] = Future()
    controller.post(PartitionsRevoked((("t", 0),), reply))
    controller.run_once(block=False)
    # Then the final commit covers the 40 records of the finished batches
    assert reply.done()
    commits = [c for c in controller._poller.commands if isinstance(c, Commit)]
    assert commits, "no final commit"
    assert commits[-1].offsets[0].offset == 40
    assert controller.runs.runs.records_out == 0


def test_a_detached_batched_run_keeps_its_batch_in_progress_as_one_call():
    controller, _, run = batched_run(ProcessingOrder.UNORDERED)
    # The worker finished 2 batches; the 3rd hangs, and the run is detached
    run.started = 1.0
    for _ in range(3):
        run.pending.popleft()
    run.done = 20
    controller.runs.detach(run, drop=False)
    # Then the batch in progress is one call of the in-flight table, of its 10 records
    assert run.adopted is not None
    indices, batch_id = run.adopted
    assert indices == range(20, 30)
    assert controller.runs.adopted[batch_id] is run
    assert len(controller.ledger.in_flight) == 1
    assert controller.ledger.in_flight.records == 10
