"""The exact committed-metadata reader (``kafka/committed_reader.py``) without a broker: which
librdkafka it accepts, the configuration it passes on, and how it falls back.

Its reads against a real broker are in ``tests/integration/test_committed_reader.py``.
"""

from __future__ import annotations

import ctypes
import logging

import confluent_kafka
import pytest

from parallel_consumer.kafka import librdkafka
from parallel_consumer.kafka.committed_reader import CommittedReader, librdkafka_settings
from parallel_consumer.kafka.librdkafka import Unavailable


@pytest.fixture
def fresh_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test loads the library itself, and leaves the process-wide cache as it found it."""
    monkeypatch.setattr(librdkafka, "_loaded", None)


def first_candidate() -> str:
    return next(librdkafka.candidates())


def test_confluent_kafkas_librdkafka_is_found_and_passes_the_layout_probe(
    fresh_loader: None,
) -> None:
    # confluent-kafka's extension module: dlsym on it finds the librdkafka it links
    lib = librdkafka.load()

    assert lib.version == confluent_kafka.libversion()[1]
    assert librdkafka.VERIFIED_FROM <= lib.version < librdkafka.VERIFIED_BELOW
    assert ctypes.sizeof(librdkafka.Partition) == 8 * ctypes.sizeof(ctypes.c_void_p)


def test_a_librdkafka_version_outside_the_verified_range_is_refused(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a verified range that ends below the installed version
    installed = confluent_kafka.libversion()[1]
    monkeypatch.setattr(librdkafka, "VERIFIED_BELOW", installed & ~0xFFFF)

    # When the library is loaded, Then it is refused, saying which version
    with pytest.raises(Unavailable, match="outside the versions") as refused:
        librdkafka.load()
    assert confluent_kafka.libversion()[0].split("-")[0] in str(refused.value)


class _ShiftedPartition(ctypes.Structure):
    """rd_kafka_topic_partition_t as a header without ``opaque`` would have it."""

    _fields_ = (
        ("topic", ctypes.c_char_p),
        ("partition", ctypes.c_int32),
        ("offset", ctypes.c_int64),
        ("metadata", ctypes.c_void_p),
        ("metadata_size", ctypes.c_size_t),
        ("err", ctypes.c_int),
        ("_private", ctypes.c_void_p),
    )


class _ShiftedList(ctypes.Structure):
    _fields_ = (
        ("cnt", ctypes.c_int),
        ("size", ctypes.c_int),
        ("elems", ctypes.POINTER(_ShiftedPartition)),
    )


def test_a_library_whose_struct_layout_differs_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given structures that do not match the loaded library's
    monkeypatch.setattr(librdkafka, "Partition", _ShiftedPartition)
    monkeypatch.setattr(librdkafka, "PartitionPointer", ctypes.POINTER(_ShiftedPartition))
    monkeypatch.setattr(librdkafka, "ListPointer", ctypes.POINTER(_ShiftedList))

    # When the library is probed, Then it is refused for its layout
    with pytest.raises(Unavailable, match="element size"):
        librdkafka.Library(ctypes.CDLL(first_candidate()))


def test_when_the_library_cannot_be_loaded_read_answers_none_and_logs_why_once(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given no loadable librdkafka
    monkeypatch.setattr(librdkafka, "candidates", lambda: iter(["/nonexistent/librdkafka.so"]))
    reader = CommittedReader({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"})

    # When it is asked twice
    with caplog.at_level(logging.INFO, logger="parallel_consumer"):
        first = reader.read([("t", 0)], timeout=1)
        second = reader.read([("t", 1)], timeout=1)
    reader.close()

    # Then it answers None (the caller falls back), says why once, and stops trying
    assert first is None
    assert second is None
    assert reader.unavailable is not None
    assert "/nonexistent/librdkafka.so" in reader.unavailable
    said = [r for r in caplog.records if "exact committed metadata unavailable" in r.getMessage()]
    assert len(said) == 1
    assert said[0].levelno == logging.INFO


def test_a_configuration_with_an_oauth_callback_is_not_reproduced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # OAUTHBEARER tokens come from a Python callback the reader's handle could not call
    reader = CommittedReader(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "oauth_cb": lambda _: ("t", 0)}
    )

    with caplog.at_level(logging.INFO, logger="parallel_consumer"):
        assert reader.read([("t", 0)], timeout=1) is None
    reader.close()

    assert reader.unavailable is not None
    assert "oauth_cb" in reader.unavailable


def test_an_unreachable_broker_fails_one_read_not_the_reader(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a reader for a broker nobody listens to
    reader = CommittedReader({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"})
    try:
        # When a read times out
        with caplog.at_level(logging.INFO, logger="parallel_consumer"):
            answer = reader.read([("t", 0)], timeout=0.3)

        # Then that read answers None and says why, but the next assignment may try again
        assert answer is None
        assert reader.unavailable is None
        assert any("rd_kafka_committed" in r.getMessage() for r in caplog.records)
    finally:
        reader.close()
    reader.close()  # idempotent


def test_settings_are_passed_on_as_confluent_kafka_passes_them() -> None:
    settings = librdkafka_settings(
        {
            "bootstrap.servers": "b:9092",
            "group.id": "g",
            "enable.auto.commit": True,
            "session.timeout.ms": 6000,
            "on_commit": print,
            "error_cb": print,
            "logger": logging.getLogger("x"),
            "stats_cb": print,
            "statistics.interval.ms": 1000,
            "group.instance.id": "member-1",
            "default.topic.config": {"auto.offset.reset": "earliest"},
            "debug": "cgrp",
        }
    )

    assert settings == {
        "debug": "cgrp",  # first, as confluent-kafka sets it
        "bootstrap.servers": "b:9092",
        "group.id": "g",
        # the reader's handle never commits and has nobody to give statistics to
        "enable.auto.commit": "false",
        "session.timeout.ms": "6000",
        "statistics.interval.ms": "0",
        "auto.offset.reset": "earliest",
    }
