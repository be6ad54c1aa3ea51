"""The poller, mostly driven by hand on the test thread: commits queued before a revoke land
before its final commit (and late ones never), a revoke during close still commits, consumed
records reach the controller grouped by partition in offset order, a record the client cannot
read stops the engine, commands come only from the poller's own thread, and a busy poller reads
positions at most every poll timeout."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message

from parallel_consumer import Options
from parallel_consumer._events import (
    Commit,
    PartitionsRevoked,
    RecordsPolled,
    RecordUnreadable,
    StopPoller,
)
from parallel_consumer.kafka import poller as poller_module
from parallel_consumer.kafka.poller import Poller
from parallel_consumer.testing.fakes import FakeCluster
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit


class _Controller:
    """Plays the controller's part for a poller: answers a revoke with a final commit."""

    def __init__(self) -> None:
        self.poller: Poller | None = None
        self.events: list[Any] = []
        self.final_offset = 0

    def post(self, event: Any) -> None:
        self.events.append(event)
        if isinstance(event, PartitionsRevoked):
            assert self.poller is not None
            (tp,) = event.tps
            self.poller.send(_commit(tp, 1, self.final_offset, sync=True))
            event.reply.set_result(None)


def _commit(tp: tuple[str, int], epoch: int, offset: int, *, sync: bool = False) -> Commit:
    return Commit((OffsetCommit(tp, epoch, offset, ""),), sync=sync, reply=Future())


def _poller(cluster: FakeCluster, controller: _Controller) -> tuple[Poller, Any]:
    consumers = []

    def factory(config: dict[str, Any]) -> Any:
        consumers.append(cluster.consumer(config))
        return consumers[0]

    poller = Poller(
        factory,
        {"group.id": "g", "bootstrap.servers": "fake"},
        post=controller.post,
        limit=100,
        fetch_batch=10,
    )
    controller.poller = poller
    return poller, consumers[0]


def _kafka_tp(tp: tuple[str, int]) -> Any:
    from confluent_kafka import TopicPartition

    return TopicPartition(*tp)


def test_a_commit_queued_before_a_revoke_never_lands_after_the_revoke_commit():
    # Given partition t[0] assigned (epoch 1), with a periodic commit of 15 queued
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    controller = _Controller()
    controller.final_offset = 20
    poller, consumer = _poller(cluster, controller)
    tp = ("t", 0)
    poller._on_assign(consumer, [_kafka_tp(tp)])
    queued = _commit(tp, 1, 15)
    poller.send(queued)
    # When the partition is revoked before the poller ran its commands
    poller._on_revoke(consumer, [_kafka_tp(tp)])
    # And a commit planned before the revoke arrives after it
    late = _commit(tp, 1, 17)
    poller.send(late)
    poller._run_commands()
    # Then the queued commit ran before the final one, and the late one never reached the client
    assert [offset for _, offset, _ in consumer.commit_log] == [15, 20]
    assert cluster.committed("g", "t", 0) == (20, None)
    assert late.reply.result(0) == (
        CommitAnswer(late.offsets[0], "the partition is no longer assigned"),
    )


def test_a_record_the_client_cannot_read_stops_the_engine_instead_of_being_skipped():
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    controller = _Controller()
    poller, consumer = _poller(cluster, controller)
    poller._on_assign(consumer, [_kafka_tp(("t", 0))])
    corrupt = Message(topic="t", partition=0, offset=7, error=KafkaError(KafkaError._BAD_MSG))
    poller._hand_over([corrupt])
    assert [e for e in controller.events if isinstance(e, RecordUnreadable)] == [
        RecordUnreadable(("t", 0), 7, str(KafkaError(KafkaError._BAD_MSG)))
    ]


def test_a_consumed_batch_is_delivered_grouped_by_partition_in_offset_order():
    # Given a consume() result that interleaves two partitions, with a record of a partition
    # revoked meanwhile and an error in between
    cluster = FakeCluster()
    cluster.create_topic("t", 3)
    controller = _Controller()
    poller, consumer = _poller(cluster, controller)
    poller._on_assign(consumer, [_kafka_tp(("t", 0)), _kafka_tp(("t", 1))])
    messages = [
        Message(topic="t", partition=0, offset=5),
        Message(topic="t", partition=0, offset=6),
        Message(topic="t", partition=2, offset=0),  # not (or no longer) assigned
        Message(topic="t", partition=1, offset=9),
        Message(topic="t", partition=1, offset=-1, error=KafkaError(KafkaError._PARTITION_EOF)),
        Message(topic="t", partition=0, offset=7),
        Message(topic="t", partition=2, offset=1),
        Message(topic="t", partition=1, offset=10),
    ]
    poller._hand_over(messages)
    # Then one event carries each assigned partition's records, in order, and nothing else
    (polled,) = [e for e in controller.events if isinstance(e, RecordsPolled)]
    assert {tp: [m.offset() for m in batch] for tp, (_, batch) in polled.batches.items()} == {
        ("t", 0): [5, 6, 7],
        ("t", 1): [9, 10],
    }
    assert poller._assigned.delivered_to == {("t", 0): 8, ("t", 1): 11}
    assert poller._assigned.first_seen == {("t", 0): 5, ("t", 1): 9}


def test_a_revoke_during_close_still_runs_its_final_commit_after_a_stop_request():
    # Given a poller inside a revoke callback, with a StopPoller queued before the controller's
    # final commit for the revoked partition (close and rebalance at the same time)
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    controller = _Controller()
    controller.final_offset = 9
    poller, consumer = _poller(cluster, controller)
    tp = ("t", 0)
    poller._on_assign(consumer, [_kafka_tp(tp)])
    poller.send(StopPoller())
    # When the partition is revoked
    poller._on_revoke(consumer, [_kafka_tp(tp)])
    # Then the final commit still reached the client
    assert cluster.committed("g", "t", 0) == (9, None)


def test_the_poller_refuses_commands_from_another_thread(harness, cluster, wait_until):
    cluster.create_topic("t", 1)
    pc = harness.make(Options())
    pc.poll(lambda ctx: None)
    wait_until(lambda: pc.statistics().poller.assigned_partitions == 1)
    with pytest.raises(RuntimeError, match="must send it commands instead"):
        pc._poller._run_command(StopPoller())


def test_a_poller_turning_every_few_ms_reads_positions_at_most_every_poll_timeout(
    harness, cluster, wait_until, monkeypatch
):
    """One record in a long call, nothing arriving: the poller turns every BUSY_POLL_TIMEOUT
    while it counts as busy. Each turn used to ask position() of every partition: with 1,024
    partitions the poller thread took about a quarter of a core, GIL
    time taken from the handlers. After an empty consume() the positions are now read at most
    every POLL_TIMEOUT. (Load only makes the gaps longer.)"""
    monkeypatch.setattr(poller_module, "BUSY_FOR", 60.0)  # (busy for the whole test)
    cluster.create_topic("t", 64)
    cluster.produce("t", b"x", key=b"k", partition=0)
    release = threading.Event()
    pc = harness.make(Options())
    pc.poll(lambda ctx: release.wait(10))
    try:
        wait_until(lambda: pc.statistics().in_flight == 1)
        consumer = harness.consumers[0]
        asked: list[float] = []
        turns: list[float] = []
        position, consume = consumer.position, consumer.consume

        def spy_position(partitions):
            asked.append(time.monotonic())
            return position(partitions)

        def spy_consume(num_messages=1, timeout=-1):
            turns.append(timeout)
            return consume(num_messages, timeout)

        consumer.position, consumer.consume = spy_position, spy_consume
        wait_until(lambda: len(asked) >= 6)
    finally:
        release.set()
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert min(gaps) >= poller_module.POLL_TIMEOUT * 0.9, gaps
    assert poller_module.BUSY_POLL_TIMEOUT in turns  # (the turns were the short ones)
    assert len(turns) > len(asked)
    pc.close()
