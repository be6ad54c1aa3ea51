"""The checks before an exact commit (``kafka/exact_commits.py``, ``kafka/librdkafka.py``), without
a broker: the handle read out of a confluent-kafka client, and the fallback (one WARNING, then
confluent-kafka's commits) whenever a check fails. The commits themselves, and a failed check
with a broker, are in ``tests/integration/test_exact_commits.py``.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from parallel_consumer.kafka import exact_commits, librdkafka
from parallel_consumer.kafka.exact_commits import ExactCommits
from parallel_consumer.kafka.librdkafka import RD_KAFKA_CONSUMER, RD_KAFKA_PRODUCER, Unavailable

NOWHERE = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}
FALLBACK_WARNING = "offset maps cannot be committed exactly"


@pytest.fixture
def consumer() -> Iterator[Consumer]:
    client = Consumer(NOWHERE)
    yield client
    client.close()


@pytest.fixture
def fresh_library() -> librdkafka.Library:
    """A library of this test's own (checks patched on it stay out of the process-wide one)."""
    return librdkafka.Library(ctypes.CDLL(next(librdkafka.candidates())))


class MemberConsumer(Consumer):  # type: ignore[misc]
    """A consumer that says it is in the group under ``member`` (its handle knows nothing)."""

    member = "member-from-python"

    def memberid(self) -> str:
        return self.member


def fallback_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if FALLBACK_WARNING in r.getMessage()]


def test_the_handle_read_from_a_consumer_is_its_own(
    consumer: Consumer, fresh_library: librdkafka.Library
) -> None:
    rk = librdkafka.client_handle(consumer, fresh_library, RD_KAFKA_CONSUMER)

    writing = fresh_library.writing()
    assert writing.opaque(rk) == id(consumer)
    assert writing.type(rk) == RD_KAFKA_CONSUMER
    assert librdkafka.member_id(fresh_library, rk) is None  # not in a group yet
    assert consumer.memberid() is None


def test_a_producer_handle_is_read_as_a_producer_and_never_as_a_consumer(
    fresh_library: librdkafka.Library,
) -> None:
    producer = Producer({"bootstrap.servers": "127.0.0.1:1"})

    rk = librdkafka.client_handle(producer, fresh_library, RD_KAFKA_PRODUCER)
    assert fresh_library.writing().type(rk) == RD_KAFKA_PRODUCER
    with pytest.raises(Unavailable, match="not a confluent_kafka Consumer"):
        librdkafka.client_handle(producer, fresh_library, RD_KAFKA_CONSUMER)
    producer.flush(0)


def test_anything_but_a_confluent_kafka_client_is_refused(
    fresh_library: librdkafka.Library,
) -> None:
    class LooksLikeOne:
        def memberid(self) -> str:
            return "m"

    with pytest.raises(Unavailable, match="not a confluent_kafka Consumer"):
        librdkafka.client_handle(LooksLikeOne(), fresh_library, RD_KAFKA_CONSUMER)


def test_a_closed_consumer_has_no_handle(fresh_library: librdkafka.Library) -> None:
    client = Consumer(NOWHERE)
    client.close()

    with pytest.raises(librdkafka.ClientClosed):
        librdkafka.client_handle(client, fresh_library, RD_KAFKA_CONSUMER)
    exact = ExactCommits(client)
    assert not exact.ready()
    assert exact.unavailable is None  # (confluent-kafka's commit then raises, as before)


def test_a_handle_that_does_not_point_back_to_its_client_is_refused(
    consumer: Consumer, fresh_library: librdkafka.Library
) -> None:
    # Given a handle whose opaque is not the client object (the pointer was read elsewhere)
    fresh_library.writing().opaque = lambda rk: 0

    with pytest.raises(Unavailable, match="does not point back"):
        librdkafka.client_handle(consumer, fresh_library, RD_KAFKA_CONSUMER)


def test_a_handle_of_the_wrong_type_is_refused(
    consumer: Consumer, fresh_library: librdkafka.Library
) -> None:
    fresh_library.writing().type = lambda rk: RD_KAFKA_PRODUCER

    with pytest.raises(Unavailable, match="has type 0, expected 1"):
        librdkafka.client_handle(consumer, fresh_library, RD_KAFKA_CONSUMER)


def test_a_library_that_does_not_copy_metadata_exactly_is_refused(
    fresh_library: librdkafka.Library, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given metadata that ends up one byte longer in the list than it was given (as
    # confluent-kafka's strlen + 1 would)
    real = librdkafka.set_metadata

    def with_nul(writing: Any, element: Any, metadata: bytes) -> None:
        real(writing, element, metadata + b"\x00")

    monkeypatch.setattr(librdkafka, "set_metadata", with_nul)

    with pytest.raises(Unavailable, match="does not copy commit metadata"):
        fresh_library.writing()
    with pytest.raises(Unavailable):  # and for good
        fresh_library.writing()


def test_a_member_id_mismatch_falls_back_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a consumer whose member id is not its handle's
    client = MemberConsumer(NOWHERE)
    try:
        exact = ExactCommits(client, name="orders")

        # When commits ask for the exact path again and again
        with caplog.at_level(logging.INFO, logger="parallel_consumer"):
            answers = [exact.ready() for _ in range(5)]
    finally:
        client.close()

    # Then it is refused each time, said once at WARNING, naming both ids
    assert answers == [False] * 5
    said = fallback_warnings(caplog)
    assert len(said) == 1
    assert said[0].levelno == logging.WARNING
    assert "member-from-python" in said[0].getMessage()
    assert "orders" in said[0].getMessage()
    assert exact.unavailable is not None


def test_a_library_that_fails_its_checks_falls_back_with_one_warning(
    consumer: Consumer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a librdkafka whose struct layout is not the expected one
    monkeypatch.setattr(librdkafka, "_loaded", Unavailable("element size differ"))
    exact = ExactCommits(consumer)

    with caplog.at_level(logging.INFO, logger="parallel_consumer"):
        assert not exact.ready()
        assert not exact.ready()
        assert not exact.send_offsets_to_transaction(object(), [], 1.0)

    said = fallback_warnings(caplog)
    assert len(said) == 1
    assert "element size differ" in said[0].getMessage()


def test_a_confluent_kafka_version_outside_the_checked_ones_falls_back(
    consumer: Consumer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(exact_commits, "CLIENT_VERIFIED_BELOW", (2, 0))
    exact = ExactCommits(consumer)

    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        assert not exact.ready()

    assert len(fallback_warnings(caplog)) == 1
    assert exact.unavailable is not None
    assert "outside the versions" in exact.unavailable


def test_the_group_metadata_of_a_transaction_is_destroyed_when_its_offsets_cannot_be_listed(
    consumer: Consumer, fresh_library: librdkafka.Library, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given exact commits on the consumer's handle (its checks passed) and a producer
    exact = ExactCommits(consumer)
    rk = librdkafka.client_handle(consumer, fresh_library, RD_KAFKA_CONSUMER)
    exact._lib, exact._rk = fresh_library, rk
    monkeypatch.setattr(exact, "_handle", lambda: rk)
    writing = fresh_library.writing()
    destroyed: list[Any] = []
    destroy = writing.group_metadata_destroy

    def counted(group: Any) -> None:
        destroyed.append(group)
        destroy(group)

    monkeypatch.setattr(writing, "group_metadata_destroy", counted)

    def no_list(lib: Any, commits: Any) -> Any:
        raise MemoryError("rd_kafka_topic_partition_list_new returned NULL")

    monkeypatch.setattr(exact_commits, "_offsets", no_list)
    producer = Producer({"bootstrap.servers": NOWHERE["bootstrap.servers"]})
    # When the list of offsets cannot be made
    with pytest.raises(MemoryError):
        exact.send_offsets_to_transaction(producer, [], 1.0)
    # Then the consumer's group metadata taken for it is destroyed all the same
    assert len(destroyed) == 1
    producer.flush(0)
