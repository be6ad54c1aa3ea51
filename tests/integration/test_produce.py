"""poll_and_produce on a real broker: every output present, per-key order, each commit mode.

Exactly-once under SIGKILL is in test_exactly_once.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from engine_support import Engines, committed_in_engine, end_offsets, wait_until
from produce_support import finish_and_read, output_of, read_outputs

from parallel_consumer import (
    CommitMode,
    Lifecycle,
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    ProduceError,
    ProduceResult,
    ProducerRecord,
)
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka

RECORDS = 10_000
PARTITIONS = (0, 1, 2)


@pytest.fixture
def engines() -> Iterator[Engines]:
    started = Engines()
    yield started
    started.close_all()


def producer_config_for(mode: CommitMode, group: str) -> dict[str, Any] | None:
    if mode is CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER:
        return {"transactional.id": f"{group}-tx"}
    return None


def start(
    engines: Engines,
    config: dict[str, Any],
    options: Options,
    source: str,
    handler: Any,
    *,
    on_produced: Any = None,
) -> ParallelConsumer:
    pc = ParallelConsumer(
        config,
        options,
        producer_config=producer_config_for(options.commit_mode, config["group.id"]),
    )
    engines._instances.append(pc)
    pc.subscribe(source)
    pc.poll_and_produce(handler, on_produced=on_produced)
    return pc


@pytest.mark.kafka_requires("transactions", "accurate_high_watermark")
@pytest.mark.parametrize("commit_mode", list(CommitMode), ids=lambda m: m.name.lower())
@pytest.mark.parametrize("ordering", list(ProcessingOrder), ids=lambda o: o.name.lower())
def test_every_input_has_its_output_in_key_order(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    ordering: ProcessingOrder,
    commit_mode: CommitMode,
) -> None:
    # Given 10,000 inputs with 200 random keys over 3 partitions
    seed = random.randrange(2**32)
    print(f"\nseed {seed}")
    rng = random.Random(seed)
    source, sink = topic(len(PARTITIONS)), topic(len(PARTITIONS))
    keys = [f"key-{rng.randrange(200)}" for _ in range(RECORDS)]
    produce_records(kafka.bootstrap_servers, source, RECORDS, keys=keys)
    delivered: list[ProduceResult] = []

    # When a pipeline turns each input into one output with the input's key
    def handle(ctx: PollContext) -> ProducerRecord:
        return output_of(ctx, sink)

    options = Options(ordering=ordering, max_concurrency=16, commit_mode=commit_mode)
    pc = start(engines, consumer_config, options, source, handle, on_produced=delivered.append)

    # Then the inputs are committed to the end, and a read_committed reader sees every input's
    # output exactly once (where order is kept, a key's outputs in its inputs' order)
    outputs, stats = finish_and_read(
        kafka.bootstrap_servers,
        pc,
        source,
        sink,
        PARTITIONS,
        in_order=ordering is not ProcessingOrder.UNORDERED,
    )
    assert pc.lifecycle is Lifecycle.CLOSED
    assert stats.outputs_acknowledged == RECORDS
    assert len(delivered) == RECORDS
    assert {(r.context.partition, r.context.offset) for r in delivered} == set(outputs.inputs)


@pytest.mark.kafka_requires("transactions", "accurate_high_watermark")
@pytest.mark.parametrize("commit_mode", list(CommitMode), ids=lambda m: m.name.lower())
@pytest.mark.parametrize("ordering", [ProcessingOrder.KEY, ProcessingOrder.UNORDERED])
def test_runs_produce_every_output_once_in_key_order(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    ordering: ProcessingOrder,
    commit_mode: CommitMode,
) -> None:
    # Given 20,000 inputs with 300 random keys over 3 partitions, and a pipeline without
    # on_produced whose calls are short: its records go out in runs, whose outputs go to the
    # producer together (docs/performance.md#runs)
    seed = random.randrange(2**32)
    print(f"\nseed {seed}")
    rng = random.Random(seed)
    records = 2 * RECORDS
    source, sink = topic(len(PARTITIONS)), topic(len(PARTITIONS))
    keys = [f"key-{rng.randrange(300)}" for _ in range(records)]
    produce_records(kafka.bootstrap_servers, source, records, keys=keys)

    def handle(ctx: PollContext) -> ProducerRecord:
        return output_of(ctx, sink)

    options = Options(ordering=ordering, max_concurrency=16, commit_mode=commit_mode)
    pc = start(engines, consumer_config, options, source, handle)

    # Then a read_committed reader sees every input's output exactly once, a key's outputs in
    # its inputs' order, and runs carried records
    _, stats = finish_and_read(
        kafka.bootstrap_servers,
        pc,
        source,
        sink,
        PARTITIONS,
        in_order=ordering is ProcessingOrder.KEY,
    )
    assert stats.outputs_acknowledged == records
    assert stats.runs > 0


@pytest.mark.kafka_requires("transactions", "accurate_high_watermark")
@pytest.mark.parametrize("ordering", [ProcessingOrder.KEY, ProcessingOrder.UNORDERED])
def test_batches_commit_their_outputs_in_transactions(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    ordering: ProcessingOrder,
) -> None:
    # Given 5,000 inputs with 50 keys over 3 partitions
    source, sink = topic(len(PARTITIONS)), topic(len(PARTITIONS))
    produce_records(kafka.bootstrap_servers, source, 5_000, keys=[f"k{i}" for i in range(50)])

    # When a transactional pipeline takes batches of 10 and returns one output per input
    def handle(ctx: PollContext) -> list[ProducerRecord]:
        return [output_of(PollContext([record]), sink) for record in ctx]

    options = Options(
        ordering=ordering,
        max_concurrency=8,
        batch_size=10,
        commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
    )
    pc = start(engines, consumer_config, options, source, handle)

    # Then every input is committed and has exactly one output, in key order
    finish_and_read(
        kafka.bootstrap_servers,
        pc,
        source,
        sink,
        PARTITIONS,
        in_order=ordering is ProcessingOrder.KEY,
    )


@pytest.mark.kafka_requires("transactions", "accurate_high_watermark")
@pytest.mark.parametrize(
    "commit_mode",
    [CommitMode.PERIODIC_CONSUMER_ASYNC, CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER],
    ids=lambda m: m.name.lower(),
)
@pytest.mark.parametrize("fault", ["too_large", "missing_topic"])
def test_an_undelivered_output_fails_its_input_and_nothing_commits_past_it(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    commit_mode: CommitMode,
    fault: str,
) -> None:
    # Given 300 inputs in one partition, and a pipeline whose output for offset 100 cannot be
    # delivered (over the producer's message.max.bytes, or to a topic that does not exist)
    # until the test lets it through
    source, sink = topic(1), topic(1)
    produce_records(kafka.bootstrap_servers, source, 300, keys=[f"k{i}" for i in range(30)])
    poison = 100
    let_through = engines.gate()
    failures: list[BaseException | None] = []

    def handle(ctx: PollContext) -> ProducerRecord:
        if ctx.offset == poison and not let_through.is_set():
            failures.append(ctx.last_failure)
            if fault == "too_large":
                return ProducerRecord(sink, b"x" * 2_000_000, key=ctx.key)
            return ProducerRecord(f"{sink}-missing", b"x", key=ctx.key)
        return output_of(ctx, sink)

    options = Options(
        ordering=ProcessingOrder.KEY,
        max_concurrency=8,
        commit_mode=commit_mode,
        retry_delay=0.2,
        commit_interval=0.1,
    )
    pc = ParallelConsumer(
        consumer_config,
        options,
        producer_config={
            **(producer_config_for(commit_mode, consumer_config["group.id"]) or {}),
            "message.timeout.ms": 2000,
        },
    )
    engines._instances.append(pc)
    pc.subscribe(source)
    pc.poll_and_produce(handle)

    # When the output keeps failing, the input is retried with the reason
    wait_until(lambda: len(failures) >= 3, timeout=60, what="three attempts of the poison input")
    reasons = failures[1:]
    assert all(isinstance(f, ProduceError) for f in reasons), reasons
    # (librdkafka waits for a missing topic to appear until message.timeout.ms)
    expected = "too large" if fault == "too_large" else "does the topic exist"
    assert all(expected in str(f).lower() for f in reasons), reasons
    # and nothing is committed past it, while the inputs after it are done (but those of its
    # key, which wait for it in KEY order)
    blocked = len(range(poison, 300, 30))
    wait_until(
        lambda: pc.statistics().records_succeeded >= 300 - blocked,
        timeout=60,
        what="every other input done",
        show=pc.statistics,
    )
    snapshot = pc.statistics().partitions[0]
    assert snapshot.committed_offset is None or snapshot.committed_offset <= poison

    # Then once the output can be delivered, everything commits and each input has one output
    let_through.set()
    ends = end_offsets(kafka.bootstrap_servers, source, [0])
    wait_until(
        lambda: committed_in_engine(pc.statistics(), ends),
        timeout=60,
        what="every input committed",
        show=pc.statistics,
    )
    pc.close()
    outputs = read_outputs(kafka.bootstrap_servers, sink, [0])
    assert set(outputs.inputs) == {(0, o) for o in range(300)}
    if commit_mode is CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER:
        assert outputs.duplicates == 0


@pytest.mark.kafka_requires("transactions", "accurate_high_watermark")
@pytest.mark.parametrize(
    "commit_mode",
    [CommitMode.PERIODIC_CONSUMER_ASYNC, CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER],
    ids=lambda m: m.name.lower(),
)
def test_transaction_markers_in_the_input_do_not_break_commits(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    commit_mode: CommitMode,
) -> None:
    # Given inputs written in transactions, every third one aborted, so the input holds
    # commit and abort markers and aborted records a read_committed consumer never sees
    from confluent_kafka import Producer

    source, sink = topic(2), topic(2)
    writer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"{source}-writer"}
    )
    writer.init_transactions(30)
    kept = 0
    for batch in range(30):
        writer.begin_transaction()
        for i in range(20):
            writer.produce(source, f"v{batch}-{i}", key=f"k{i % 7}", partition=i % 2)
        if batch % 3 == 2:
            writer.abort_transaction(30)
        else:
            writer.commit_transaction(30)
            kept += 20

    # When a pipeline processes them
    def handle(ctx: PollContext) -> ProducerRecord:
        return output_of(ctx, sink)

    options = Options(ordering=ProcessingOrder.KEY, max_concurrency=8, commit_mode=commit_mode)
    pc = start(engines, consumer_config, options, source, handle)

    # Then the committed offsets reach the end of the log (past the last marker)
    ends = end_offsets(kafka.bootstrap_servers, source, [0, 1])
    wait_until(
        lambda: committed_in_engine(pc.statistics(), ends),
        timeout=60,
        what="commits past the transaction markers",
        show=pc.statistics,
    )
    stats = pc.statistics()
    pc.close()
    # and only the committed inputs had outputs
    outputs = read_outputs(kafka.bootstrap_servers, sink, [0, 1])
    assert sum(outputs.inputs.values()) == kept
    assert outputs.duplicates == 0
    assert stats.records_succeeded == kept


@pytest.mark.kafka_requires("transactions", "accurate_high_watermark")
def test_rebalances_during_transactions_neither_deadlock_nor_duplicate(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
) -> None:
    # Given 12,000 inputs over 4 partitions and a transactional pipeline with some work: 15 ms
    # a call, 16 at once, so one instance needs about 11 s for them all and the second one
    # joins (a rebalance takes a few seconds) while records are left (with 0.5 ms calls the
    # first had committed every record before the second was given any, twice in CI)
    partitions = (0, 1, 2, 3)
    source, sink = topic(len(partitions)), topic(len(partitions))
    produce_records(kafka.bootstrap_servers, source, 12_000, keys=[f"k{i}" for i in range(100)])

    def handle(ctx: PollContext) -> ProducerRecord:
        time.sleep(0.015)
        return output_of(ctx, sink)

    options = Options(
        ordering=ProcessingOrder.KEY,
        max_concurrency=16,
        commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
    )
    first = start(engines, consumer_config, options, source, handle)
    wait_until(
        lambda: first.statistics().outputs_acknowledged >= 2_000,
        timeout=60,
        what="the first instance's progress",
    )
    # When a second instance joins mid-stream (partitions move while transactions are open),
    # and takes over partitions it produces for in its own transactions
    second = start(engines, consumer_config, options, source, handle)
    wait_until(
        lambda: (
            second.statistics().poller.assigned_partitions > 0
            and second.statistics().outputs_acknowledged > 0
        ),
        timeout=60,
        what="the second instance's progress",
        show=second.statistics,
    )
    # and the first one leaves again while the second goes on
    first.close()
    assert first.failure is None

    # Then the second commits every input to the end
    # and a read_committed reader sees each input's output exactly once, in key order
    finish_and_read(kafka.bootstrap_servers, second, source, sink, partitions)


@pytest.mark.kafka_requires("transactions", "accurate_high_watermark")
@pytest.mark.parametrize(
    "commit_mode",
    [CommitMode.PERIODIC_CONSUMER_ASYNC, CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER],
    ids=lambda m: m.name.lower(),
)
def test_async_handlers_produce_every_output_in_key_order(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    commit_mode: CommitMode,
) -> None:
    # Given 3,000 inputs with 100 keys over 3 partitions
    source, sink = topic(len(PARTITIONS)), topic(len(PARTITIONS))
    produce_records(kafka.bootstrap_servers, source, 3_000, keys=[f"k{i}" for i in range(100)])

    # When an async def pipeline awaits a little I/O and returns one output per input
    async def handle(ctx: PollContext) -> ProducerRecord:
        await asyncio.sleep(0.002)
        return output_of(ctx, sink)

    options = Options(ordering=ProcessingOrder.KEY, max_concurrency=200, commit_mode=commit_mode)
    pc = start(engines, consumer_config, options, source, handle)

    # Then every input is committed, with exactly one output each, in key order
    finish_and_read(kafka.bootstrap_servers, pc, source, sink, PARTITIONS)


@pytest.mark.kafka_requires("transactions", "accurate_high_watermark")
def test_a_call_with_a_rejected_output_commits_none_of_its_outputs(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
) -> None:
    # Given a call whose second output the producer rejects at once (over message.max.bytes)
    # on the first attempt, after its first output was sent into the open transaction
    source, sink = topic(1), topic(1)
    produce_records(kafka.bootstrap_servers, source, 20, keys=[f"k{i}" for i in range(5)])

    def handle(ctx: PollContext) -> list[ProducerRecord]:
        first = output_of(ctx, sink)
        if ctx.offset == 7 and ctx.attempts == 0:
            return [first, ProducerRecord(sink, b"x" * 2_000_000, key=ctx.key)]
        return [first]

    options = Options(
        ordering=ProcessingOrder.KEY,
        max_concurrency=4,
        retry_delay=0.2,
        commit_interval=0.2,
        commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
    )
    pc = start(engines, consumer_config, options, source, handle)
    # Then the first attempt's output was aborted with its transaction: exactly one each
    finish_and_read(kafka.bootstrap_servers, pc, source, sink, [0], in_order=False)


@pytest.mark.kafka_requires("transactions", "accurate_high_watermark")
def test_a_fenced_instance_stops_with_the_reason_and_outputs_stay_exactly_once(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
) -> None:
    # Given an instance running with a static identity (so a stable transactional id)
    source, sink = topic(2), topic(2)
    produce_records(kafka.bootstrap_servers, source, 3_000, keys=[f"k{i}" for i in range(20)])
    config = {**consumer_config, "group.instance.id": "the-same"}

    def handle(ctx: PollContext) -> ProducerRecord:
        time.sleep(0.002)
        return output_of(ctx, sink)

    options = Options(
        ordering=ProcessingOrder.KEY,
        max_concurrency=8,
        commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
    )
    first = start(engines, config, options, source, handle)
    wait_until(lambda: first.statistics().outputs_acknowledged >= 300, timeout=60, what="progress")
    # When a second instance starts with the same identity (a misconfiguration, or a restart
    # while the old process still runs), it fences the first one
    second = start(engines, config, options, source, handle)
    # Then the first stops by itself with an error that says so
    wait_until(lambda: first.lifecycle is Lifecycle.CLOSED, timeout=60, what="the first to stop")
    assert first.failure is not None
    assert "fenced" in str(first.failure) or "FENCED" in str(first.failure)
    # and the second commits everything, each output exactly once
    finish_and_read(kafka.bootstrap_servers, second, source, sink, [0, 1], in_order=False)
