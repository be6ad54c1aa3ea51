"""Offset maps committed byte for byte (``kafka/exact_commits.py``) against a real broker.

confluent-kafka stores every map with a NUL after it; committed through librdkafka on the group
member's own handle with an exact ``metadata_size``, the broker holds exactly the encoded map.
Read back here with the exact reader (``kafka/committed_reader.py``), which returns the stored
bytes, a trailing NUL included.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from engine_support import wait_until

from parallel_consumer import (
    CommitMode,
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    Retry,
)
from parallel_consumer.kafka import client_offsets, librdkafka
from parallel_consumer.kafka.committed_reader import CommittedReader
from parallel_consumer.kafka.exact_commits import ExactCommits
from parallel_consumer.offsets import OffsetEncoding, decode_offset_map, encode_offset_map
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory
from parallel_consumer.work.commit_tracker import OffsetCommit

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_requires("commit_metadata")]

ENCODINGS = [e for e in OffsetEncoding if e.decodable]
FALLBACK_WARNING = "offset maps cannot be committed exactly"


def read_exactly(config: dict[str, Any], topic: str, partitions: int) -> dict[int, Any]:
    reader = CommittedReader(config)
    try:
        answer = reader.read([(topic, p) for p in range(partitions)], timeout=15)
    finally:
        reader.close()
    assert answer is not None, reader.unavailable
    return {p: value for (_, p), value in answer.items()}


def maps(topic: str, seed: int) -> dict[int, OffsetCommit]:
    """One map per partition, partition i in ENCODINGS[i], of random holes."""
    rng = random.Random(seed)
    commits = {}
    for partition, encoding in enumerate(ENCODINGS):
        base = rng.randrange(0, 1000)
        high = base + rng.randrange(200, 3000)
        holes = [base, *rng.sample(range(base + 1, high), rng.randrange(1, 60))]
        encoded = encode_offset_map(base, high, holes, force=encoding)
        assert encoded is not None
        assert encoded.encoding is encoding
        commits[partition] = OffsetCommit((topic, partition), 0, base, encoded.metadata)
    return commits


@pytest.fixture
def member(consumer_config: dict[str, Any]) -> Iterator[Callable[..., Consumer]]:
    """A plain group member, assigned every partition of its topic."""
    started: list[Consumer] = []

    def join(topic: str, partitions: int, **extra: Any) -> Consumer:
        consumer = Consumer({**consumer_config, **extra})
        started.append(consumer)
        consumer.subscribe([topic])
        wait_until(
            lambda: (
                consumer.consume(timeout=0.1) is not None
                and len(consumer.assignment()) == partitions
            ),
            timeout=30,
            what="the assignment",
        )
        return consumer

    yield join
    for consumer in started:
        consumer.close()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_maps_of_every_encoding_are_stored_byte_for_byte(
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    member: Callable[..., Consumer],
    asynchronous: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a group member (with an on_commit callback, as the poller's) and one map per encoding
    name = topic(len(ENCODINGS))
    answers: list[tuple[Any, list[Any]]] = []
    consumer = member(name, len(ENCODINGS), on_commit=lambda e, p: answers.append((e, p)))
    commits = maps(name, seed=len(name))
    exact = ExactCommits(consumer)

    # When they are committed through its own handle
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        assert exact.ready(), exact.unavailable
        stored = exact.commit(list(commits.values()), asynchronous=asynchronous)

    # Then the broker answered every partition without error, synchronously or through the
    # consumer's on_commit callback (served by consume(), as for confluent-kafka's commits)
    if asynchronous:
        assert stored is None
        wait_until(
            lambda: consumer.consume(timeout=0.05) is not None and answers,
            timeout=15,
            what="on_commit",
        )
        error, partitions = answers[0]
        assert error is None
        assert {(p.partition, p.offset, p.error) for p in partitions} == {
            (p, c.offset, None) for p, c in commits.items()
        }
    else:
        assert stored is not None
        assert {(s.partition, s.offset, s.error) for s in stored} == {
            (p, c.offset, None) for p, c in commits.items()
        }
        assert not answers  # (no echo: the answer went to the caller only)
    # ... and stores exactly each map: no trailing NUL, byte for byte
    assert read_exactly(consumer_config, name, len(ENCODINGS)) == {
        p: (c.offset, c.metadata) for p, c in commits.items()
    }
    assert not [r for r in caplog.records if FALLBACK_WARNING in r.getMessage()]


def test_an_offset_without_a_map_is_committed_without_metadata(
    topic: TopicFactory, consumer_config: dict[str, Any], member: Callable[..., Consumer]
) -> None:
    name = topic(1)
    exact = ExactCommits(member(name, 1))
    assert exact.ready(), exact.unavailable

    exact.commit([OffsetCommit((name, 0), 0, 42, "")], asynchronous=False)

    assert read_exactly(consumer_config, name, 1) == {0: (42, None)}


@pytest.mark.kafka_requires("transactions")
def test_maps_sent_to_a_transaction_are_stored_byte_for_byte(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    member: Callable[..., Consumer],
) -> None:
    # Given a group member, a transactional producer with an open transaction, and one map per
    # encoding
    name = topic(len(ENCODINGS))
    consumer = member(name, len(ENCODINGS))
    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "transactional.id": f"{consumer_config['group.id']}-tx",
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    commits = maps(name, seed=7)
    exact = ExactCommits(consumer)

    # When they are sent to the transaction exactly and it commits
    assert exact.send_offsets_to_transaction(producer, list(commits.values()), 30)
    producer.commit_transaction(30)

    # Then the broker stores exactly each map
    assert read_exactly(consumer_config, name, len(ENCODINGS)) == {
        p: (c.offset, c.metadata) for p, c in commits.items()
    }
    assert exact.unavailable is None


class Finishing:
    """A ParallelConsumer that finishes every record but ``failing`` (retried after an hour)."""

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        failing: set[tuple[int, int]],
        mode: CommitMode,
    ) -> None:
        self.done: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._failing = failing
        transactional = mode is CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER
        self.pc = ParallelConsumer(
            config,
            Options(
                ordering=ProcessingOrder.UNORDERED,
                max_concurrency=8,
                commit_interval=0.2,
                commit_mode=mode,
            ),
            producer_config={"transactional.id": f"{config['group.id']}-tx"}
            if transactional
            else None,
        )
        self.pc.subscribe([topic])
        if transactional:
            self.pc.poll_and_produce(self._produce)
        else:
            self.pc.poll(self._handle)

    def _handle(self, ctx: PollContext) -> None:
        record = (ctx.partition, ctx.offset)
        if record in self._failing:
            raise Retry("deliberately unfinished", delay=3600)
        with self._lock:
            self.done.add(record)

    def _produce(self, ctx: PollContext) -> list[Any]:
        self._handle(ctx)
        return []


def finish_all_but(
    kafka: KafkaBroker,
    config: dict[str, Any],
    name: str,
    count: int,
    unfinished: int,
    mode: CommitMode,
    seed: int,
) -> set[tuple[int, int]]:
    """Produce ``count`` records over 2 partitions of ``name``, run a consumer that finishes all
    but ``unfinished`` random ones of them, and close it (its final commit holds each
    partition's map); returns the unfinished records."""
    written = produce_records(kafka.bootstrap_servers, name, count, partitions=[0, 1])
    records = {(r.partition, r.offset) for r in written}
    failing = set(random.Random(seed).sample(sorted(records), unfinished))
    consumer = Finishing(config, name, failing, mode)
    try:
        wait_until(
            lambda: len(consumer.done) == len(records) - len(failing),
            timeout=45,
            what="every record but the failing ones",
        )
    finally:
        consumer.pc.close(drain=False, timeout=10)
    return failing


def check_maps(stored: dict[int, Any], failing: set[tuple[int, int]]) -> None:
    """Each partition's stored map says exactly which of its records were left unfinished."""
    for partition, (offset, metadata) in stored.items():
        decoded = decode_offset_map(offset, metadata, exact=True)
        unfinished = {o for p, o in failing if p == partition}
        assert offset == min(unfinished)
        assert set(decoded.incomplete) == {o for o in unfinished if o <= decoded.highest_seen}


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(CommitMode.PERIODIC_CONSUMER_ASYNC, id="async"),
        pytest.param(CommitMode.PERIODIC_CONSUMER_SYNC, id="sync"),
        pytest.param(
            CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
            id="transactional",
            marks=pytest.mark.kafka_requires("transactions"),
        ),
    ],
)
def test_a_consumer_commits_its_maps_without_a_nul(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    mode: CommitMode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given 2,000 records of which a consumer finishes all but 20, and closes
    name = topic(2)
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        failing = finish_all_but(kafka, consumer_config, name, 2000, 20, mode, seed=3)

    # Then the broker holds each map without a NUL, and it says exactly what was unfinished
    stored = read_exactly(consumer_config, name, 2)
    for metadata in (metadata for _, metadata in stored.values()):
        assert metadata, stored
        assert not metadata.endswith("\x00"), stored
    check_maps(stored, failing)
    assert not [r for r in caplog.records if FALLBACK_WARNING in r.getMessage()]


def test_a_handle_that_fails_a_check_falls_back_with_one_warning_and_commits_still_work(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a handle whose member id is not the consumer's (as if read from the wrong place)
    monkeypatch.setattr(librdkafka, "member_id", lambda lib, rk: "somebody-else")
    name = topic(2)

    # When a consumer commits many times and closes
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        failing = finish_all_but(
            kafka, consumer_config, name, 1000, 10, CommitMode.PERIODIC_CONSUMER_ASYNC, seed=4
        )

    # Then it said so once, at WARNING, naming the check ...
    said = [r for r in caplog.records if FALLBACK_WARNING in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].levelno == logging.WARNING
    assert "member id" in said[0].getMessage()
    # ... and committed through confluent-kafka as before: each map with its NUL
    stored = read_exactly(consumer_config, name, 2)
    assert all(metadata.endswith("\x00") for _, metadata in stored.values()), stored
    check_maps(stored, failing)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_map_over_the_brokers_limit_fails_its_partition_as_through_confluent_kafka(
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    member: Callable[..., Consumer],
    asynchronous: bool,
) -> None:
    # Given a member and a commit whose map on partition 1 exceeds offset.metadata.max.bytes
    name = topic(2)
    answers: list[tuple[Any, list[Any]]] = []
    consumer = member(name, 2, on_commit=lambda e, p: answers.append((e, p)))
    commits = [
        OffsetCommit((name, 0), 0, 5, "bAAGNgA="),
        OffsetCommit((name, 1), 0, 9, "A" * 5000),
    ]
    exact = ExactCommits(consumer)
    assert exact.ready(), exact.unavailable

    def errors_of(commit: Callable[[], Any]) -> tuple[Any, dict[int, Any]]:
        """The error the commit raised or its answer's, and the error per partition."""
        answers.clear()
        try:
            stored = commit()
        except KafkaException as exc:
            return exc.args[0].code(), {}
        if not asynchronous:
            return None, {s.partition: s.error and s.error.code() for s in stored}
        wait_until(
            lambda: consumer.consume(timeout=0.05) is not None and answers,
            timeout=15,
            what="on_commit",
        )
        error, partitions = answers[0]
        return error and error.code(), {p.partition: p.error and p.error.code() for p in partitions}

    # When it is committed through confluent-kafka, and exactly
    through_confluent = errors_of(
        lambda: consumer.commit(
            offsets=[client_offsets.kafka_offset(c) for c in commits], asynchronous=asynchronous
        )
    )
    exactly = errors_of(lambda: exact.commit(commits, asynchronous=asynchronous))

    # Then the answers are the same (the broker's error for the partition whose map is too
    # large: raised when synchronous, as confluent-kafka raises it), and one the commit flow
    # counts as permanent
    assert exactly == through_confluent
    too_large = KafkaError.OFFSET_METADATA_TOO_LARGE
    assert exactly[0] == too_large if not asynchronous else exactly[1][1] == too_large
    assert client_offsets.answer(commits[1], KafkaError(too_large)).permanent
