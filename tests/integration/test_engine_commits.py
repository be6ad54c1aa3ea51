"""What the engine commits, and what a restart makes of it, on a real broker.

Restarts replay exactly the unfinished records; a poison record holds back only its key;
transaction markers, offset resets and undecodable metadata do not stop commits reaching the end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from engine_support import (
    Engines,
    Recorder,
    commit_directly,
    committed,
    committed_in_engine,
    end_offsets,
    wait_until,
)

from parallel_consumer import Options, PollContext, ProcessingOrder
from parallel_consumer.offsets import decode_offset_map, encode_offset_map
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka


@pytest.fixture
def engines() -> Iterator[Engines]:
    started = Engines()
    yield started
    started.close_all()


def recording(recorder: Recorder) -> Any:
    def handle(ctx: PollContext) -> None:
        with recorder.call(ctx):
            pass

    return handle


@pytest.mark.kafka_requires("commit_metadata")
def test_restart_after_out_of_order_completion_reprocesses_exactly_the_unfinished(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given 600 records in each of 2 partitions, and an UNORDERED consumer whose handler never
    # finishes offsets 3, 17, 42 and 500 of partition 0
    blocked = {3, 17, 42, 500}
    per_partition = 600
    name = topic(2)
    produce_records(kafka.bootstrap_servers, name, 2 * per_partition, partitions=[0, 1])
    gate = engines.gate()
    first = Recorder()

    def block_some(ctx: PollContext) -> None:
        with first.call(ctx):
            if ctx.partition == 0 and ctx.offset in blocked:
                gate.wait()

    options = Options(ordering=ProcessingOrder.UNORDERED, commit_interval=0.2)
    pc = engines.start(consumer_config, options, name, block_some)

    # When everything else has succeeded and that state was committed
    def all_but_blocked_committed() -> bool:
        stats = pc.statistics()
        finished = stats.records_succeeded == 2 * per_partition - len(blocked)
        return finished and committed_in_engine(stats, {0: min(blocked), 1: per_partition})

    wait_until(all_but_blocked_committed, timeout=30, what="a commit of all but the blocked")
    # ... and the consumer is closed without waiting for the blocked records
    pc.close(drain=False, timeout=0.5)
    gate.set()

    # Then the group's commit holds the lowest unfinished offset and a map of the others
    stored = committed(consumer_config, name, [0, 1])
    assert stored[1] == (per_partition, "")
    offset, metadata = stored[0]
    assert offset == min(blocked)
    decoded = decode_offset_map(offset, metadata)
    assert set(decoded.incomplete) == blocked
    assert decoded.highest_seen == per_partition - 1

    # When a second consumer of the same group starts
    second = Recorder()
    pc2 = engines.start(consumer_config, options, name, recording(second))
    redelivered = per_partition - min(blocked)  # partition 0 is read again from offset 3

    def all_redelivered_accounted() -> bool:
        stats = pc2.statistics()
        return stats.records_skipped + stats.records_registered >= redelivered

    wait_until(all_redelivered_accounted, timeout=30, what=f"{redelivered} records redelivered")
    wait_until(lambda: len(second.seen) >= len(blocked), timeout=10, what="the blocked records")
    pc2.close()

    # Then it processed exactly the blocked records, skipping every finished one
    assert second.seen == {(0, o) for o in blocked}
    assert second.duplicates == 0
    stats = pc2.statistics()
    assert stats.records_registered == len(blocked)
    assert stats.records_skipped == redelivered - len(blocked)
    assert committed(consumer_config, name, [0, 1]) == {
        0: (per_partition, ""),
        1: (per_partition, ""),
    }


@pytest.mark.kafka_requires("commit_metadata")  # it decodes the committed offset map
def test_poison_record_blocks_only_its_key(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given 200 records over keys k0..k9 (record i has key k<i % 10>) in one partition, and a
    # KEY-ordered handler that always fails on offset 53 (key k3)
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 200, keys=[f"k{i}" for i in range(10)])
    poison = 53
    later_of_key = set(range(poison + 10, 200, 10))
    recorder = Recorder(ProcessingOrder.KEY)

    def handle(ctx: PollContext) -> None:
        with recorder.call(ctx):
            if ctx.offset == poison:
                raise RuntimeError("poison")

    pc = engines.start(
        consumer_config,
        Options(ordering=ProcessingOrder.KEY, commit_interval=0.2, retry_delay=0.05),
        name,
        handle,
    )

    # When every other key's records succeeded, the poison record failed repeatedly, and the
    # state was committed
    expected_done = 200 - 1 - len(later_of_key)

    def settled() -> bool:
        stats = pc.statistics()
        return (
            stats.records_succeeded == expected_done
            and stats.records_failed >= 5
            and committed_in_engine(stats, {0: poison})
        )

    wait_until(settled, timeout=30, what="the other keys done and the poison record retried")
    pc.close(drain=False, timeout=1.0)

    # Then the poison key's later records never ran; every other record ran once
    assert recorder.offsets() == set(range(200)) - later_of_key
    assert all(c.offset == poison for c in recorder.calls if c.attempts > 0)
    assert recorder.overlaps == []
    assert recorder.out_of_order() == []
    # And the committed offset stays at the poison record, the map naming its key's records
    offset, metadata = committed(consumer_config, name, [0])[0]
    assert offset == poison
    assert set(decode_offset_map(offset, metadata).incomplete) == {poison} | later_of_key


def produce_transactions(bootstrap_servers: str, topic: str) -> int:
    """Write partition 0 of ``topic`` in three transactions: 10 committed records, 5 aborted,
    10 committed; return the partition's end (28).

    Offsets: 0-9 data, 10 commit marker, 11-15 aborted, 16 abort marker, 17-26 data, 27 commit
    marker. A ``read_committed`` consumer sees 0-9 and 17-26: the rest are gaps.
    """
    producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    for count, outcome in ((10, "commit"), (5, "abort"), (10, "commit")):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, key=b"k%d" % i, value=outcome.encode(), partition=0)
        producer.flush(30)
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    end = end_offsets(bootstrap_servers, topic, [0])[0]
    assert end == 28
    return end


VISIBLE_IN_TRANSACTIONS = set(range(10)) | set(range(17, 27))


@pytest.mark.kafka_requires("transactions")
def test_commits_reach_the_end_across_transaction_markers_and_aborted_records(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given a compacted partition written by transactions, so its offsets have gaps (commit and
    # abort markers, aborted records); compaction itself does not run within a test
    name = topic(1, config={"cleanup.policy": "compact"})
    end = produce_transactions(kafka.bootstrap_servers, name)
    recorder = Recorder()

    # When a consumer processes the partition and is closed
    pc = engines.start(consumer_config, Options(commit_interval=0.2), name, recording(recorder))
    wait_until(lambda: len(recorder.seen) == 20, timeout=30, what="the 20 committed records")
    pc.close()

    # Then it processed only the committed records and committed the partition's end (past the
    # final transaction marker, so the group's lag is 0)
    assert recorder.offsets() == VISIBLE_IN_TRANSACTIONS
    assert committed(consumer_config, name, [0]) == {0: (end, "")}


@pytest.mark.kafka_requires("transactions", "commit_metadata")
def test_restart_across_transaction_gaps_reprocesses_only_the_unfinished(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given the transactional partition above and a consumer that finished every visible record
    # but offset 5, committed that, and was closed
    name = topic(1)
    produce_transactions(kafka.bootstrap_servers, name)
    gate = engines.gate()

    def hold_5(ctx: PollContext) -> None:
        if ctx.offset == 5:
            gate.wait()

    options = Options(ordering=ProcessingOrder.UNORDERED, commit_interval=0.2)
    pc = engines.start(consumer_config, options, name, hold_5)

    def committed_all_but_5() -> bool:
        stats = pc.statistics()
        return stats.records_succeeded == 19 and committed_in_engine(stats, {0: 5})

    wait_until(committed_all_but_5, timeout=30, what="a commit of all but offset 5")
    pc.close(drain=False, timeout=0.5)
    gate.set()
    offset, metadata = committed(consumer_config, name, [0])[0]
    decoded = decode_offset_map(offset, metadata)
    assert (offset, decoded.incomplete, decoded.highest_seen) == (5, (5,), 26)

    # When a second consumer of the group starts
    recorder = Recorder()
    pc2 = engines.start(consumer_config, options, name, recording(recorder))

    def redelivered() -> int:
        stats = pc2.statistics()
        return stats.records_skipped + stats.records_registered

    visible_from_5 = len([o for o in VISIBLE_IN_TRANSACTIONS if o >= 5])
    wait_until(lambda: redelivered() >= visible_from_5, timeout=30, what="offsets 5-26 polled")
    wait_until(lambda: recorder.seen, timeout=10, what="offset 5 processed")
    pc2.close()

    # Then only offset 5 ran again; the finished records on both sides of the gaps were skipped
    assert recorder.seen == {(0, 5)}
    assert pc2.statistics().records_skipped == visible_from_5 - 1
    # (that the commit then reaches the partition's end is the test above)
    assert committed(consumer_config, name, [0])[0][0] >= 27


@pytest.mark.kafka_requires("accurate_high_watermark")  # the reset relies on the log end
def test_committed_offset_beyond_the_end_is_reset_to_earliest(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given 50 records and a group offset of 1000 (beyond the end), auto.offset.reset=earliest
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 50)
    commit_directly(consumer_config, name, {0: (1000, "")})
    assert consumer_config["auto.offset.reset"] == "earliest"
    recorder = Recorder()

    # When a consumer of that group starts
    pc = engines.start(consumer_config, Options(commit_interval=0.2), name, recording(recorder))
    wait_until(lambda: len(recorder.seen) == 50, timeout=30, what="50 records")
    pc.close()

    # Then it processes from the earliest offset and commits the end
    assert recorder.offsets() == set(range(50))
    assert committed(consumer_config, name, [0]) == {0: (50, "")}


@pytest.mark.kafka_requires("commit_metadata")
def test_committed_offset_below_the_log_start_keeps_the_map_above_it(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given 50 records whose first 20 were deleted, and a group commit at offset 5 with a map
    # saying 5, 7 and 30 are unfinished and everything else up to 35 is done
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 50)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    deleted = admin.delete_records([TopicPartition(name, 0, 20)], request_timeout=15)
    for future in deleted.values():
        future.result(15)
    offset_map = encode_offset_map(5, 35, [5, 7, 30])
    assert offset_map is not None
    commit_directly(consumer_config, name, {0: (5, offset_map.metadata)})
    recorder = Recorder()

    # When a consumer of that group starts (the broker resets it to the log start, 20)
    pc = engines.start(consumer_config, Options(commit_interval=0.2), name, recording(recorder))
    wait_until(lambda: len(recorder.seen) >= 15, timeout=30, what="15 records")

    def polled() -> int:
        stats = pc.statistics()
        return stats.records_skipped + stats.records_registered

    wait_until(lambda: polled() >= 30, timeout=10, what="offsets 20-49 polled")
    pc.close()

    # Then the map still counts above the log start: only 30 and the records after 35 run
    assert recorder.offsets() == {30} | set(range(36, 50))
    stats = pc.statistics()
    assert stats.records_skipped == 15  # 20..35 except 30
    assert committed(consumer_config, name, [0]) == {0: (50, "")}


@pytest.mark.kafka_requires("commit_metadata")
def test_undecodable_metadata_is_logged_and_replayed_from_the_committed_offset(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given 30 records and a group commit at offset 10 with metadata that is not an offset map
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 30)
    commit_directly(consumer_config, name, {0: (10, "!!notbase64")})
    recorder = Recorder()

    # When a consumer of that group starts
    with caplog.at_level(logging.ERROR, logger="parallel_consumer"):
        pc = engines.start(consumer_config, Options(commit_interval=0.2), name, recording(recorder))
        wait_until(lambda: len(recorder.seen) == 20, timeout=30, what="offsets 10-29")
        pc.close()

    # Then it logged an error naming the partition, replayed from offset 10 and committed the end
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(f"{name}[0]" in message and "offset 10" in message for message in errors), errors
    assert pc.failure is None
    assert recorder.offsets() == set(range(10, 30))
    assert committed(consumer_config, name, [0]) == {0: (30, "")}


def test_user_rebalance_callbacks_see_the_assignment_and_the_revoke_on_close(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any], engines: Engines
) -> None:
    # Given a consumer whose user rebalance callbacks record what they see
    name = topic(2)
    produce_records(kafka.bootstrap_servers, name, 10, partitions=[0, 1])
    assigned: list[int] = []
    revoked: list[int] = []
    done = threading.Event()
    recorder = Recorder()

    def handle(ctx: PollContext) -> None:
        with recorder.call(ctx):
            if len(recorder.seen) == 10:
                done.set()

    # When it processes everything and is closed
    pc = engines.start(
        consumer_config,
        Options(commit_interval=0.2),
        name,
        handle,
        on_assign=lambda _c, parts: assigned.extend(p.partition for p in parts),
        on_revoke=lambda _c, parts: revoked.extend(p.partition for p in parts),
    )
    assert done.wait(30)
    pc.close()

    # Then both partitions were assigned, then revoked on close, and committed
    assert sorted(assigned) == [0, 1]
    assert sorted(revoked) == [0, 1]
    assert committed(consumer_config, name, [0, 1]) == {0: (5, ""), 1: (5, "")}
