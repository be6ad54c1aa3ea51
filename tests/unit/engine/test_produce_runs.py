"""poll_and_produce in runs (docs/performance.md#runs): while calls are short, a partition's
records go to a worker as a run, and the run's outputs go to the producer together; its records
finish once every output is acknowledged.

These tests break deliveries at random while runs are out and check what a user downstream
sees: every input's output, each once, and per key in input order. The outputs are read from
the fake cluster's log (not from ``statistics()``, which would wake the controller). Each would
fail if a failed output let a later record of its key produce first (a run holding a key twice,
a new run starting on a key whose outputs are on their way, or a lane running beside them), or
if a record whose output failed were dropped or committed."""

from __future__ import annotations

from collections import defaultdict

import pytest
from produce_doubles import WARM_UP, outputs, produce_inputs

from parallel_consumer import CommitMode, Options, PollContext, ProcessingOrder, ProducerRecord


def by_key(messages) -> dict[bytes, list[int]]:
    lanes: dict[bytes, list[int]] = defaultdict(list)
    for m in messages:
        lanes[m.key()].append(int(m.value()))
    return lanes


def handle(ctx: PollContext) -> ProducerRecord:
    return ProducerRecord("out", ctx.value, key=ctx.key)


@pytest.mark.parametrize(
    ("ordering", "keys", "partitions"),
    [
        (ProcessingOrder.KEY, 300, 1),
        (ProcessingOrder.KEY, 5_000, 2),
        (ProcessingOrder.UNORDERED, 300, 2),
    ],
)
def test_failed_outputs_of_runs_are_retried_in_key_order(
    harness, cluster, wait_until, ordering, keys, partitions
):
    # Given a pipeline whose output deliveries fail at random (2 %), warmed up on short calls
    # so that the rest of the input arrives in runs
    n = 30_000
    cluster.create_topic("t", partitions)
    cluster.create_topic("out", 2)
    produce_inputs(cluster, 0, WARM_UP, keys, partitions)
    pc = harness.make(Options(ordering=ordering, max_concurrency=8, retry_delay=0))
    pc.poll_and_produce(handle)
    harness.producers[0].fail_deliveries_at_random(0.02, seed=7)
    wait_until(lambda: len({m.value() for m in outputs(cluster)}) >= WARM_UP, timeout=60)

    # When the rest arrives
    produce_inputs(cluster, WARM_UP, n, keys, partitions)
    wait_until(lambda: len({m.value() for m in outputs(cluster)}) >= n, timeout=120)

    # Then every input has exactly one output (a failed delivery writes nothing)
    written = outputs(cluster)
    assert sorted(int(m.value()) for m in written) == list(range(n))
    # and in KEY order a key's outputs follow its inputs, although deliveries failed
    if ordering is ProcessingOrder.KEY:
        for key, values in by_key(written).items():
            assert values == sorted(values), f"outputs of {key!r} out of order"
    stats = pc.statistics()
    assert stats.runs > 0
    assert stats.outputs_failed > 0
    wait_until(lambda: pc.statistics().records_succeeded == n, timeout=30)


def test_a_run_holds_no_key_twice_while_its_outputs_are_on_their_way(harness, cluster, wait_until):
    # Given a pipeline on few keys, warmed up, whose producer holds delivery reports back
    keys = 4
    cluster.create_topic("t")
    cluster.create_topic("out")
    produce_inputs(cluster, 0, WARM_UP, keys, 1)
    seen: list[int] = []
    pc = harness.make(Options(ordering=ProcessingOrder.KEY, max_concurrency=4, retry_delay=0))

    @pc.poll_and_produce
    def record(ctx: PollContext) -> ProducerRecord:
        seen.append(ctx.offset)
        return handle(ctx)

    wait_until(lambda: len(outputs(cluster)) >= WARM_UP, timeout=60)
    wait_until(lambda: pc.statistics().records_succeeded == WARM_UP)
    producer = harness.producers[0]
    producer.hold.set()

    # When more records of the same keys arrive
    before = len(seen)
    produce_inputs(cluster, WARM_UP, WARM_UP + 400, keys, 1)
    wait_until(lambda: len(seen) >= before + keys, timeout=30)
    # Then no record of a key runs while the output of one before it is unacknowledged: one
    # record per key, until the reports come
    # (once the controller counts their outputs on their way, it has handled the run's end,
    # and would have handed out more records of these keys by now if it could)
    wait_until(lambda: pc.statistics().delivering >= keys, timeout=30)
    assert len(seen) - before == keys
    producer.hold.clear()
    wait_until(lambda: len(outputs(cluster)) >= WARM_UP + 400, timeout=60)
    for key, values in by_key(outputs(cluster)).items():
        assert values == sorted(values), f"outputs of {key!r} out of order"


def test_transactional_runs_commit_each_output_once_across_aborts(harness, cluster, wait_until):
    # Given a transactional pipeline in runs where three outputs fail along the way (each
    # failure aborts the open transaction; its records run again from the committed offset)
    n = 20_000
    keys = 500
    cluster.create_topic("t")
    cluster.create_topic("out")
    produce_inputs(cluster, 0, WARM_UP, keys, 1)
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
    pc.poll_and_produce(handle)
    producer = harness.producers[0]
    wait_until(lambda: cluster.committed("g", "t", 0) == (WARM_UP, None), timeout=60)
    for part in range(3):
        start = WARM_UP + part * (n - WARM_UP) // 3
        end = WARM_UP + (part + 1) * (n - WARM_UP) // 3
        produce_inputs(cluster, start, end, keys, 1)
        producer.fail_next_deliveries(1)
        wait_until(lambda end=end: cluster.committed("g", "t", 0) == (end, None), timeout=60)

    # Then the committed transactions hold each input's output exactly once, per key in order
    committed = [int(v) for v in producer.committed_outputs()]
    assert sorted(committed) == list(range(n))
    lanes: dict[int, list[int]] = defaultdict(list)
    for value in committed:
        lanes[value % keys].append(value)
    for values in lanes.values():
        assert values == sorted(values)
    stats = pc.statistics()
    assert stats.runs > 0
    assert stats.outputs_failed >= 3
    assert producer.aborts >= 1
