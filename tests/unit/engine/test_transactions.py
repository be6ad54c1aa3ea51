"""The transactional mode on the fakes: aborts, revokes, lost partitions and slow deliveries.

Each test checks the exactly-once rule on what the fake producer committed: an input's offset
is committed only in a transaction that also holds its output, and an output only in one that
holds (or precedes) its input's offset. Several failed on an earlier version of the mode.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from parallel_consumer import (
    CommitMode,
    InternalError,
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    ProducerRecord,
)
from parallel_consumer.testing.fakes import FakeCluster, FakeConsumer, FakeProducer

TP = tuple[str, int]


class Setup:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.consumers: list[FakeConsumer] = []
        self.producers: list[FakeProducer] = []
        self.instances: list[ParallelConsumer] = []

    def make(self, topics: str, **options: Any) -> ParallelConsumer:
        def consumer(config: dict[str, Any]) -> FakeConsumer:
            self.consumers.append(self.cluster.consumer(config))
            return self.consumers[-1]

        def producer(config: dict[str, Any]) -> FakeProducer:
            self.producers.append(self.cluster.producer(config))
            return self.producers[-1]

        pc = ParallelConsumer(
            {"bootstrap.servers": "fake:1", "group.id": "g"},
            Options(commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER, **options),
            consumer_factory=consumer,
            producer_factory=producer,
            producer_config={"transactional.id": "tx"},
        )
        pc.subscribe(topics)
        self.instances.append(pc)
        return pc


@pytest.fixture
def setup() -> Iterator[Setup]:
    made = Setup(FakeCluster())
    yield made
    for pc in made.instances:
        for producer in made.producers:
            producer.hold.clear()
        with contextlib.suppress(Exception):
            pc.close(drain=False, timeout=2)


def wait(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what or condition}")
        time.sleep(0.005)


def offset(cluster: FakeCluster, topic: str, partition: int) -> int | None:
    found = cluster.committed("g", topic, partition)
    return None if found is None else found[0]


def coordinates(ctx: PollContext) -> ProducerRecord:
    return ProducerRecord("out", f"{ctx.topic}:{ctx.partition}:{ctx.offset}")


def exactly_once_violations(cluster: FakeCluster, producer: FakeProducer, tps: list[TP]) -> list:
    """Inputs below a partition's committed offset without a committed output, and committed
    outputs twice."""
    committed = producer.committed_outputs()
    wrong: list[object] = [v for v in set(committed) if committed.count(v) > 1]
    for topic, partition in tps:
        found = cluster.committed("g", topic, partition)
        upto = found[0] if found else 0
        wrong.extend(
            (topic, partition, offset)
            for offset in range(upto)
            if f"{topic}:{partition}:{offset}".encode() not in committed
        )
    return wrong


def test_an_abort_inside_a_revoke_does_not_commit_the_revoked_inputs(setup: Setup) -> None:
    # Given 20 inputs over 2 partitions, all processed, their outputs in the open transaction
    cluster = setup.cluster
    cluster.create_topic("t", 2)
    cluster.create_topic("out")
    for i in range(20):
        cluster.produce("t", b"v", partition=i % 2)
    pc = setup.make("t", ordering=ProcessingOrder.KEY, commit_interval=1.0)
    pc.poll_and_produce(coordinates)
    wait(lambda: pc.statistics().records_succeeded == 20)
    producer, consumer = setup.producers[0], setup.consumers[0]

    # When the next transaction commit fails (and is aborted) while t[1] is being revoked
    producer.fail_next_commit()
    consumer.rebalance(revoke=[("t", 1)])
    wait(lambda: producer.aborted_transactions, what="the abort")
    wait(lambda: offset(cluster, "t", 0) == 10, what="t[0] processed again and committed")

    # Then no input of t[1] is committed without its output, and nothing twice
    assert exactly_once_violations(cluster, producer, [("t", 0), ("t", 1)]) == []


def test_a_rewind_goes_back_to_records_held_in_the_pollers_overflow(setup: Setup) -> None:
    # Given a consumer out of credit (deliveries held) when partition u[0] is assigned, so
    # its first record waits in the poller's overflow
    cluster = setup.cluster
    cluster.create_topic("t")
    cluster.create_topic("out")
    pc = setup.make(
        "^(t|u)$",
        ordering=ProcessingOrder.KEY,
        max_concurrency=1,
        max_buffered_records=4,
        fetch_batch_size=4,
        commit_interval=0.01,
    )
    pc.poll_and_produce(coordinates)
    producer = setup.producers[0]
    producer.hold.set()
    for _ in range(10):  # (after the hold: none of them can finish)
        cluster.produce("t", b"v", key=b"k")
    # the poller runs out of credit, waits, then pauses everything to serve the group
    wait(
        lambda: (pc.statistics().poller.waiting_for_credit or 0.0) > 1.1,
        what="the poller waiting for credit long enough to pause everything",
    )
    cluster.create_topic("u")
    for _ in range(3):
        cluster.produce("u", b"w", key=b"j")
    setup.consumers[0].rebalance(assign=[("u", 0)])
    wait(lambda: pc._poller._assigned.overflow, what="a record in the overflow")

    # When the next transaction aborts (a rewind) and deliveries go on
    producer.fail_next_commit()
    producer.hold.clear()
    wait(lambda: producer.aborted_transactions, what="the abort")
    wait(lambda: offset(cluster, "u", 0) == 3, what="u[0] committed to the end")

    # Then u@0 was not skipped
    assert exactly_once_violations(cluster, producer, [("t", 0), ("u", 0)]) == []


def test_lost_partitions_abort_the_transaction_holding_their_outputs(setup: Setup) -> None:
    cluster = setup.cluster
    cluster.create_topic("t", 2)
    cluster.create_topic("out")
    for i in range(20):
        cluster.produce("t", b"v", partition=i % 2)
    pc = setup.make("t", ordering=ProcessingOrder.KEY, commit_interval=1.0)
    pc.poll_and_produce(coordinates)
    wait(lambda: pc.statistics().records_succeeded == 20)
    producer = setup.producers[0]
    assert len(producer.open_outputs) == 20  # all in the open transaction

    setup.consumers[0].lose([("t", 1)])
    wait(lambda: producer.aborted_transactions, what="the abort")
    wait(lambda: offset(cluster, "t", 0) == 10, what="t[0] committed again")
    assert cluster.committed("g", "t", 1) is None
    assert exactly_once_violations(cluster, producer, [("t", 0), ("t", 1)]) == []
    assert not any(v.startswith(b"t:1:") for v in producer.committed_outputs())


def test_a_revoke_that_times_out_aborts_and_a_later_assignment_is_kept(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("parallel_consumer.kafka.poller.REVOKE_TIMEOUT", 1.0)
    cluster = setup.cluster
    cluster.create_topic("t", 2)
    cluster.create_topic("out")
    pc = setup.make("t", ordering=ProcessingOrder.KEY, commit_interval=0.2)
    pc.poll_and_produce(coordinates)
    wait(lambda: setup.consumers and setup.consumers[0]._assigned)
    producer, consumer = setup.producers[0], setup.consumers[0]
    # An output of t[1]@0 is sent and not acknowledged for longer than the revoke waits
    producer.hold.set()
    cluster.produce("t", b"a", partition=1)
    wait(lambda: pc.statistics().outputs_sent == 1)
    consumer.rebalance(revoke=[("t", 1)])
    wait(lambda: producer.aborted_transactions, timeout=5, what="the abort after the timeout")

    def epoch_of_t1() -> int | None:
        found = [p.epoch for p in pc.statistics().partitions if (p.topic, p.partition) == ("t", 1)]
        return found[0] if found else None

    before = epoch_of_t1()
    consumer.rebalance(assign=[("t", 1)])  # t[1] comes back
    wait(lambda: epoch_of_t1() not in (None, before), what="t[1] assigned again")
    producer.hold.clear()
    for _ in range(5):
        cluster.produce("t", b"b", partition=1)
    wait(
        lambda: offset(cluster, "t", 1) == 6,
        what="t[1] processed and committed to the end after coming back",
    )
    assert exactly_once_violations(cluster, producer, [("t", 0), ("t", 1)]) == []


@pytest.mark.parametrize("rejection", ["at_once", "on_delivery"])
def test_a_rejected_output_aborts_the_other_outputs_of_its_call(
    setup: Setup, rejection: str
) -> None:
    # Given a call whose second output fails on the first attempt: rejected by produce() at
    # once (too large), or reported as not delivered (a missing topic)
    cluster = setup.cluster
    cluster.create_topic("t")
    cluster.create_topic("out")
    cluster.produce("t", b"v")
    attempts: list[int] = []

    def handle(ctx: PollContext) -> list[ProducerRecord]:
        attempts.append(ctx.attempts)
        if ctx.attempts == 0 and rejection == "at_once":
            second = ProducerRecord("out", b"x" * 2_000_000)
        elif ctx.attempts == 0:
            second = ProducerRecord("missing-topic", b"second")
        else:
            second = ProducerRecord("out", b"second")
        return [coordinates(ctx), second]

    pc = setup.make("t", retry_delay=0, commit_interval=0.05)
    pc.poll_and_produce(handle)
    wait(lambda: cluster.committed("g", "t", 0) is not None, what="the commit")
    producer = setup.producers[0]
    # Then the first attempt's outputs were aborted, and the retry's committed once
    assert attempts[:2] == [0, 1]
    assert producer.committed_outputs().count(b"t:0:0") == 1
    assert producer.aborted_transactions


def test_a_fatal_producer_error_stops_the_consumer_with_the_reason(setup: Setup) -> None:
    from confluent_kafka import KafkaError

    cluster = setup.cluster
    cluster.create_topic("t")
    cluster.create_topic("out")
    pc = setup.make("t")
    pc.poll_and_produce(coordinates)
    setup.producers[0].fail_fatally(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    with pytest.raises(InternalError, match="fenced"):
        pc.wait(10)
    assert pc.failure is not None


def test_a_full_producer_queue_does_not_block_the_controller(setup: Setup) -> None:
    cluster = setup.cluster
    cluster.create_topic("t")
    cluster.create_topic("out")
    pc = setup.make("t", ordering=ProcessingOrder.UNORDERED)
    pc.poll_and_produce(coordinates)
    producer = setup.producers[0]
    full = threading.Event()
    full.set()
    original = producer.produce

    def produce(*args: Any, **kwargs: Any) -> None:
        if full.is_set():
            raise BufferError("queue full")
        original(*args, **kwargs)

    producer.produce = produce  # type: ignore[method-assign]
    for _ in range(50):  # (after the queue is full: none of them can get through)
        cluster.produce("t", b"v")
    # While the queue stays full, the controller still answers at once
    wait(lambda: pc.statistics().delivering > 0, what="outputs waiting for room")
    started = time.monotonic()
    pc.statistics()
    assert time.monotonic() - started < 1.0
    # and once there is room, everything goes through
    full.clear()
    wait(lambda: pc.statistics().records_succeeded == 50, what="every input done")
    assert len(producer.committed_outputs()) + len(producer.open_outputs) == 50
