"""The side topic's writing side over the fake cluster: the topic is created on the first spill,
a partition gets a side record only when its map changed, a tombstone once its map fits inline
again, and a refused topic creation stops the consumer with a message that says what to do.
An asynchronous commit goes to the client only once its side record is acknowledged, without the
poller waiting for it, and never for a partition revoked meanwhile."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError
from confluent_kafka import TopicPartition as KafkaTopicPartition

from parallel_consumer._events import Commit
from parallel_consumer.kafka.assigned import AssignedPartitions
from parallel_consumer.kafka.client_offsets import CommitClient
from parallel_consumer.kafka.spill_store import SpillFailed, SpillStore
from parallel_consumer.offsets.spill import (
    checksum,
    parse_reference,
    read_side_value,
    side_key,
    side_value,
)
from parallel_consumer.testing._fake_producer import FakeAdmin, FakeProducer
from parallel_consumer.testing._fake_topics import FakeTopics
from parallel_consumer.work.commit_tracker import OffsetCommit

TOPIC = "g.pc-offsets"
TP = ("orders", 3)


def _store(cluster: FakeTopics) -> tuple[SpillStore, list[FakeProducer]]:
    producers: list[FakeProducer] = []

    def producer(config: dict[str, Any]) -> FakeProducer:
        assert "group.id" not in config  # a consumer-only setting would only be logged as ignored
        producers.append(FakeProducer(cluster, config))
        return producers[-1]

    def no_reader(config: dict[str, Any]) -> Any:
        raise AssertionError("writing reads nothing")

    store = SpillStore(
        {"bootstrap.servers": "fake:9092", "group.id": "g", "session.timeout.ms": 6000},
        group="g",
        topic=TOPIC,
        producer_factory=producer,
        consumer_factory=no_reader,
        admin_factory=lambda config: FakeAdmin(cluster),
    )
    return store, producers


def _spill(offset: int, metadata: str) -> OffsetCommit:
    return OffsetCommit(TP, 1, offset, metadata, spill=True)


def test_a_changed_map_is_written_once_and_referenced_until_it_changes_again() -> None:
    cluster = FakeTopics()
    store, _ = _store(cluster)
    # Given a map that must spill
    refs = store.references([_spill(100, "A" * 5000)])
    # Then the side topic was created and holds one record keyed by the partition
    [record] = cluster.records(TOPIC)
    assert record.key() == side_key("g", *TP)
    ref = parse_reference(refs[TP])
    assert ref is not None
    assert (ref.topic, ref.partition, ref.offset) == (TOPIC, 0, 0)
    assert ref.checksum == checksum(side_value(100, "A" * 5000))
    found = read_side_value(
        ref, record.key(), record.value(), expected_key=side_key("g", *TP), committed_offset=100
    )
    assert found == "A" * 5000
    # When the same commit is sent again (a retry): no second record, the same reference
    assert store.references([_spill(100, "A" * 5000)]) == refs
    assert len(cluster.records(TOPIC)) == 1
    # When the map changes: one more record, a new reference
    again = store.references([_spill(100, "B" * 5000)])
    assert again[TP] != refs[TP]
    assert len(cluster.records(TOPIC)) == 2
    assert store.records_written == 2


def test_a_partition_back_inline_gets_one_tombstone() -> None:
    cluster = FakeTopics()
    store, _ = _store(cluster)
    store.references([_spill(100, "A" * 5000)])
    # When its map fits inline again: no tombstone while that commit is not stored ...
    assert store.references([OffsetCommit(TP, 1, 200, "bGw=")]) == {}
    assert len(cluster.records(TOPIC)) == 1
    # ... and once it is
    store.inline_stored([TP])
    # Then a tombstone of its key follows, once
    records = cluster.records(TOPIC)
    assert [(m.key(), m.value()) for m in records[1:]] == [(side_key("g", *TP), None)]
    store.references([OffsetCommit(TP, 1, 201, "")])
    store.inline_stored([TP])
    assert len(cluster.records(TOPIC)) == 2
    assert store.tombstones_written == 1


def test_commits_that_fit_inline_touch_no_side_topic() -> None:
    cluster = FakeTopics()
    store, producers = _store(cluster)
    assert store.references([OffsetCommit(TP, 1, 5, "bGw=")]) == {}
    assert producers == []
    assert TOPIC not in cluster._logs


def test_a_side_topic_that_cannot_be_created_fails_for_good_with_what_to_do() -> None:
    cluster = FakeTopics()
    cluster.refuse_topic_creation = True
    store, _ = _store(cluster)
    with pytest.raises(SpillFailed) as failed:
        store.references([_spill(100, "A" * 5000)])
    assert failed.value.permanent
    message = str(failed.value)
    assert TOPIC in message
    assert "offset_map_topic" in message
    assert "spill_offset_maps" in message


def test_a_failed_side_write_fails_the_commit_for_now_and_is_written_again() -> None:
    cluster = FakeTopics()
    store, producers = _store(cluster)
    store.references([_spill(100, "A" * 5000)])
    producers[0].fail_next_deliveries(1)
    with pytest.raises(SpillFailed) as failed:
        store.references([_spill(101, "C" * 5000)])
    assert not failed.value.permanent
    # The next commit writes it (nothing was remembered of the failed write)
    refs = store.references([_spill(101, "C" * 5000)])
    assert parse_reference(refs[TP]) is not None


class _Client:
    """The consumer's commit call, recorded."""

    def __init__(self) -> None:
        self.commits: list[list[tuple[str, int, int, str | None]]] = []

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        assert asynchronous
        self.commits.append([(o.topic, o.partition, o.offset, o.metadata) for o in offsets])


def _async_client(cluster: FakeTopics) -> tuple[CommitClient, _Client, AssignedPartitions, Any]:
    store, producers = _store(cluster)
    store.references([_spill(1, "Z" * 5000)])  # the topic exists, the producer is made
    assigned = AssignedPartitions()
    assigned.assign([TP])
    client = _Client()
    producers[0].hold.set()  # delivery reports wait, as for a slow broker
    return CommitClient(client, assigned, store), client, assigned, producers[0]


def test_an_asynchronous_commit_waits_for_its_side_record_without_blocking_the_poller() -> None:
    cluster = FakeTopics()
    commits, client, assigned, producer = _async_client(cluster)
    command = Commit((_spill_epoch(assigned, 100, "A" * 5000),), sync=False, reply=Future())
    # When the commit is sent while the side record's acknowledgement has not come
    commits.commit(command, frozenset())
    commits.turn(time.monotonic(), 30.0)
    # Then nothing reached the client yet, and the call did not wait for the broker
    assert client.commits == []
    # When the acknowledgement comes
    producer.hold.clear()
    commits.turn(time.monotonic(), 30.0)
    # Then the commit carries the reference to it, and its answer settles the command
    [[(topic, partition, offset, metadata)]] = client.commits
    ref = parse_reference(metadata or "")
    assert (topic, partition, offset) == (*TP, 100)
    assert ref is not None
    assert ref.offset == len(cluster.records(TOPIC)) - 1
    commits.on_commit(None, [KafkaTopicPartition(*TP, 100)])
    assert command.reply.result(0)[0].error is None


def test_a_partition_revoked_while_its_side_record_is_on_its_way_is_never_committed() -> None:
    cluster = FakeTopics()
    commits, client, assigned, producer = _async_client(cluster)
    command = Commit((_spill_epoch(assigned, 100, "A" * 5000),), sync=False, reply=Future())
    commits.commit(command, frozenset())
    # When the partition is revoked (its final commit went out) before the acknowledgement
    assigned.forget((TP,))
    producer.hold.clear()
    commits.turn(time.monotonic(), 30.0)
    # Then the older offset is not committed after the final one
    assert client.commits == []
    [answer] = command.reply.result(0)
    assert answer.error is not None


def _spill_epoch(assigned: AssignedPartitions, offset: int, metadata: str) -> OffsetCommit:
    return OffsetCommit(TP, assigned.epochs[TP], offset, metadata, spill=True)


def test_a_side_record_acknowledged_after_its_partition_was_revoked_is_never_referenced_again() -> (
    None
):
    # (Another member may write newer records of the key meanwhile: a reference to this one
    # would name a record that compaction may drop.)
    cluster = FakeTopics()
    store, _ = _store(cluster)
    write = store.start([_spill(100, "A" * 5000)])
    assert write.pending
    # When the partition is revoked while its side record is on its way, and acknowledged after
    store.forget([TP])
    assert store.finish(write, block=True) is not None
    # Then the same map, once the partition is back, gets a record of its own
    again = store.start([_spill(100, "A" * 5000)])
    assert again.pending
    store.finish(again, block=True)
    assert len(cluster.records(TOPIC)) == 2


def test_side_records_acknowledged_after_an_aborted_transaction_are_never_referenced_again() -> (
    None
):
    cluster = FakeTopics()
    store, _ = _store(cluster)
    write = store.start([_spill(100, "A" * 5000)])
    store.forget()
    store.finish(write, block=True)
    assert store.start([_spill(100, "A" * 5000)]).pending


def test_no_tombstone_is_written_before_the_inline_commit_that_replaces_the_reference() -> None:
    cluster = FakeTopics()
    commits, client, assigned, producer = _async_client(cluster)
    producer.hold.clear()
    spilled = Commit((_spill_epoch(assigned, 100, "A" * 5000),), sync=False, reply=Future())
    commits.commit(spilled, frozenset())
    commits.turn(time.monotonic(), 30.0)
    commits.on_commit(None, [KafkaTopicPartition(*TP, 100)])
    # When the map fits again and its inline commit fails
    inline = OffsetCommit(TP, assigned.epochs[TP], 200, "bGw=")
    command = Commit((inline,), sync=False, reply=Future())
    commits.commit(command, frozenset())
    commits.turn(time.monotonic(), 30.0)
    assert client.commits[-1] == [(*TP, 200, "bGw=")]
    failed = KafkaTopicPartition(*TP, 200)
    commits.on_commit(KafkaError(KafkaError.REBALANCE_IN_PROGRESS), [failed])
    assert command.reply.result(0)[0].error is not None
    # Then the side topic still holds the committed reference's record, with no tombstone after
    assert [m.value() for m in cluster.records(TOPIC)][-1] is not None
    # When the inline commit is sent again and stored
    commits.commit(Commit((inline,), sync=False, reply=Future()), frozenset())
    commits.turn(time.monotonic(), 30.0)
    commits.on_commit(None, [KafkaTopicPartition(*TP, 200)])
    # Then the key's tombstone follows
    assert [(m.key(), m.value()) for m in cluster.records(TOPIC)][-1] == (
        side_key("g", *TP),
        None,
    )


def test_after_a_failed_side_write_every_map_is_written_again_and_the_topic_checked_again() -> None:
    cluster = FakeTopics()
    store, producers = _store(cluster)
    other = ("orders", 4)
    store.references([_spill(100, "A" * 5000), OffsetCommit(other, 1, 7, "B" * 5000, spill=True)])
    # When a later side write fails (the side topic deleted meanwhile, say)
    producers[0].fail_next_deliveries(1)
    with pytest.raises(SpillFailed):
        store.references([_spill(101, "C" * 5000)])
    # Then the next commit writes the unchanged map of the other partition again, rather than
    # referencing a record that may be gone
    assert store.start([OffsetCommit(other, 1, 7, "B" * 5000, spill=True)]).pending
