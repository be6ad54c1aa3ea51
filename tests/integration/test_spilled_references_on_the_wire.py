"""Where the two halves of offset maps without a limit meet, on a real broker: a spilled map's
reference committed through the exact path (``kafka/exact_commits.py``), plainly and inside a
transaction, reaches the broker byte for byte and restores the map; a later side record of the
key (an aborted transaction's, a newer one) never replaces the committed one; and a side record
behind another member's open (hanging) transaction is still read."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from engine_support import wait_until

from parallel_consumer.kafka import client_offsets
from parallel_consumer.kafka.committed_reader import CommittedReader
from parallel_consumer.kafka.exact_commits import ExactCommits
from parallel_consumer.kafka.spill_store import SpillFailed, SpillStore
from parallel_consumer.offsets import encode_offset_map
from parallel_consumer.offsets.spill import parse_reference
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory
from parallel_consumer.work.commit_tracker import OffsetCommit

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_requires("commit_metadata")]


def a_spilled_commit(topic: str, base: int = 100) -> OffsetCommit:
    """A commit whose map (of 400 holes) does not fit the 4 KB limit in any encoding."""
    holes = [base, *range(base + 3, base + 40_000, 97)]
    encoded = encode_offset_map(base, base + 40_000, holes)
    assert encoded is not None
    return OffsetCommit((topic, 0), 0, base, encoded.metadata, spill=True)


@pytest.fixture
def stores(consumer_config: dict[str, Any]) -> Iterator[Callable[[], SpillStore]]:
    made: list[SpillStore] = []
    side = f"side-{uuid.uuid4().hex[:8]}.pc-offsets"

    def make() -> SpillStore:
        made.append(
            SpillStore(
                consumer_config,
                group=str(consumer_config["group.id"]),
                topic=side,
                producer_factory=Producer,
                consumer_factory=Consumer,
                admin_factory=AdminClient,
            )
        )
        return made[-1]

    yield make
    for store in made:
        store.close()


@pytest.fixture
def member(consumer_config: dict[str, Any]) -> Iterator[Callable[[str], Consumer]]:
    started: list[Consumer] = []

    def join(topic: str) -> Consumer:
        consumer = Consumer(consumer_config)
        started.append(consumer)
        consumer.subscribe([topic])
        wait_until(
            lambda: (
                consumer.consume(timeout=0.1) is not None  # (a list: served the rebalance)
                and len(consumer.assignment()) == 1
                and consumer.memberid() is not None
            ),
            timeout=30,
            what="the assignment",
        )
        return consumer

    yield join
    for consumer in started:
        consumer.close()


def stored_exactly(config: dict[str, Any], topic: str) -> tuple[int, str | None]:
    reader = CommittedReader(config)
    try:
        answer = reader.read([(topic, 0)], timeout=15)
    finally:
        reader.close()
    assert answer is not None, reader.unavailable
    return answer[(topic, 0)]


def test_a_reference_committed_through_the_exact_path_is_stored_byte_for_byte_and_restores(
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    member: Callable[[str], Consumer],
    stores: Callable[[], SpillStore],
) -> None:
    # Given a group member and a map that must spill
    name = topic(1)
    consumer = member(name)
    exact = ExactCommits(consumer)
    commit = a_spilled_commit(name)
    store = stores()

    # When its side record is written and the commit goes out through the exact path
    refs = client_offsets.spill_references(store, [commit])
    assert exact.ready(), exact.unavailable
    [answer] = client_offsets.commit_sync(consumer, [commit], exact, refs)
    assert answer.error is None

    # Then the broker holds the reference itself, byte for byte (no NUL after it) ...
    offset, metadata = stored_exactly(consumer_config, name)
    assert (offset, metadata) == (commit.offset, refs[(name, 0)])
    # ... and another process's store resolves it to the very map
    assert stores().resolve((name, 0), offset, metadata) == commit.metadata


@pytest.mark.kafka_requires("transactions")
def test_a_reference_sent_exactly_to_a_transaction_commits_with_it_and_survives_a_later_abort(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    member: Callable[[str], Consumer],
    stores: Callable[[], SpillStore],
) -> None:
    # Given a group member, a transactional producer and a map that must spill
    name = topic(1)
    consumer = member(name)
    exact = ExactCommits(consumer)
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"{name}-tx"}
    )
    producer.init_transactions(30)
    store = stores()
    first = a_spilled_commit(name, base=100)

    # When its side record and its reference go to one transaction, exactly, and it commits
    producer.begin_transaction()
    refs = client_offsets.spill_references(store, [first], producer)
    wire = client_offsets.on_the_wire([first], refs)
    assert exact.send_offsets_to_transaction(producer, wire, 30)
    producer.commit_transaction(30)

    # Then the broker holds the reference byte for byte and a new store restores the map
    offset, metadata = stored_exactly(consumer_config, name)
    assert (offset, metadata) == (first.offset, refs[(name, 0)])
    assert stores().resolve((name, 0), offset, metadata) == first.metadata

    # When a later map's transaction aborts after its side record was written
    later = a_spilled_commit(name, base=200)
    producer.begin_transaction()
    aborted = client_offsets.spill_references(store, [later], producer)
    producer.abort_transaction(30)
    store.forget()

    # Then the commit is still the first reference, which restores the first map (the aborted
    # record's reference was never committed: it went with the aborted offsets)
    assert aborted[(name, 0)] != refs[(name, 0)]
    assert stored_exactly(consumer_config, name) == (first.offset, refs[(name, 0)])
    assert stores().resolve((name, 0), offset, metadata) == first.metadata
    producer.flush(10)


@pytest.mark.kafka_requires("transactions")
def test_a_side_record_behind_another_members_open_transaction_still_restores(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    stores: Callable[[], SpillStore],
) -> None:
    # Given a member whose transaction wrote a side record and hangs (killed mid-transaction) ...
    name = topic(1)
    store = stores()
    hanging = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"{name}-hanging"}
    )
    hanging.init_transactions(30)
    hanging.begin_transaction()
    client_offsets.spill_references(store, [a_spilled_commit(name, base=5)], hanging)
    store.forget()
    # ... and another member's side record committed after it
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"{name}-tx"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    commit = a_spilled_commit(name, base=100)
    refs = client_offsets.spill_references(store, [commit], producer)
    producer.commit_transaction(30)
    try:
        # When a new owner restores that other member's partition
        found = stores().resolve((name, 0), commit.offset, refs[(name, 0)])
    finally:
        hanging.abort_transaction(30)
    # Then it gets the map, not a replay from the committed offset
    assert found == commit.metadata


def test_a_reference_to_an_older_side_record_of_the_key_still_restores_its_own_map(
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    stores: Callable[[], SpillStore],
) -> None:
    # Given a reference committed, then a newer side record of the same key written by another
    # member (or by this one, for a commit that never landed) ...
    name = topic(1)
    older = a_spilled_commit(name, base=100)
    ref = client_offsets.spill_references(stores(), [older])[(name, 0)]
    newer = a_spilled_commit(name, base=300)
    client_offsets.spill_references(stores(), [newer])

    # Then the committed reference still names its own map (not the key's latest) ...
    assert stores().resolve((name, 0), older.offset, ref) == older.metadata
    # ... and read back with a stray NUL or bytes after it (the fallback reader) too
    assert stores().resolve((name, 0), older.offset, ref + "\x00") == older.metadata
    assert stores().resolve((name, 0), older.offset, ref + "\x00\x17x") == older.metadata
    assert parse_reference(ref + "\x00") == parse_reference(ref)


def test_a_side_topic_deleted_while_running_comes_back_compacted(
    kafka: KafkaBroker,
    topic: TopicFactory,
    stores: Callable[[], SpillStore],
) -> None:
    # Given a store that wrote a side record, whose side topic is then deleted
    name = topic(1)
    store = stores()
    client_offsets.spill_references(store, [a_spilled_commit(name, base=100)])
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.delete_topics([store.topic], operation_timeout=30)[store.topic].result(30)
    wait_until(
        lambda: store.topic not in admin.list_topics(timeout=10).topics,
        timeout=30,
        what="the side topic deleted",
    )

    # When later maps spill (a write may fail while the topic is gone: that commit fails, and
    # the next one writes again)
    def written() -> bool:
        try:
            client_offsets.spill_references(store, [a_spilled_commit(name, base=200)])
        except SpillFailed:
            return False
        return True

    wait_until(written, timeout=60, what="a side record written again")

    # Then the side topic is back, compacted (never auto-created with the broker's defaults,
    # whose retention would delete the maps)
    resource = ConfigResource(ConfigResource.Type.TOPIC, store.topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["cleanup.policy"].value == "compact"
