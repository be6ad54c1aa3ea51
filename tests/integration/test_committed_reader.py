"""The exact committed-metadata reader (``kafka/committed_reader.py``) against a real broker.

confluent-kafka's ``committed()`` returns metadata as a C string (up to the first NUL, past the
end of what was committed when no NUL was stored); the reader returns ``metadata_size`` bytes,
exactly what the broker holds. Maps are committed two ways here: with confluent-kafka (which
stores the string and its NUL) and, as the Java client does, without a NUL, through librdkafka's
``rd_kafka_commit`` with an exact length.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from engine_support import Engines, Recorder, commit_directly, committed, wait_until

from parallel_consumer import Options, PollContext
from parallel_consumer.kafka import librdkafka
from parallel_consumer.kafka.committed_reader import CommittedReader
from parallel_consumer.kafka.librdkafka import Unavailable
from parallel_consumer.offsets import OffsetEncoding, decode_offset_map, encode_offset_map
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_requires("commit_metadata")]


@pytest.fixture
def reader(consumer_config: dict[str, Any]) -> Iterator[CommittedReader]:
    exact = CommittedReader(consumer_config)
    yield exact
    exact.close()


@pytest.fixture
def engines() -> Iterator[Engines]:
    started = Engines()
    yield started
    started.close_all()


def commit_without_nul(
    config: Mapping[str, Any], topic: str, offsets: Mapping[int, tuple[int, bytes]]
) -> None:
    """Commit partition -> (offset, metadata) with exactly these metadata bytes, as the Java
    client commits them (confluent-kafka cannot: it always appends a NUL)."""
    lib = librdkafka.load()
    commit = lib.cdll.rd_kafka_commit
    commit.argtypes = [ctypes.c_void_p, librdkafka.ListPointer, ctypes.c_int]
    commit.restype = ctypes.c_int
    writer = CommittedReader(config)
    plist = lib.list_new(len(offsets))
    buffers = []
    try:
        rk = writer._handle(lib)
        for partition, (offset, metadata) in offsets.items():
            element = lib.list_add(plist, topic.encode(), partition).contents
            element.offset = offset
            buffer = ctypes.create_string_buffer(metadata, len(metadata))
            buffers.append(buffer)
            element.metadata = ctypes.cast(buffer, ctypes.c_void_p)
            element.metadata_size = len(metadata)
        error = commit(rk, plist, 0)  # synchronous
        assert error == 0, lib.error(error)
    finally:
        for i in range(plist.contents.cnt):  # ours, not librdkafka's to free
            plist.contents.elems[i].metadata = None
            plist.contents.elems[i].metadata_size = 0
        lib.list_destroy(plist)
        writer.close()


def test_the_reader_returns_what_confluent_kafka_committed_byte_for_byte(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    reader: CommittedReader,
) -> None:
    # Given commits made with confluent-kafka: a map on partition 0, an offset without metadata
    # on partition 1, nothing on partition 2
    name = topic(3)
    commit_directly(consumer_config, name, {0: (100, "bAAGNgA="), 1: (7, "")})

    # When the reader reads them
    started = time.perf_counter()
    answer = reader.read([(name, 0), (name, 1), (name, 2)], timeout=15)
    first = time.perf_counter()
    again = reader.read([(name, 0), (name, 1), (name, 2)], timeout=15)
    second = time.perf_counter()
    print(
        f"\ncreating the handle and the first read: {1000 * (first - started):.1f} ms, "
        f"a read on the same handle: {1000 * (second - first):.1f} ms"
    )

    # Then it returns the stored bytes: the map and the NUL confluent-kafka stored after it, and
    # for "" the lone NUL; nothing for the partition without a commit
    assert answer == {(name, 0): (100, "bAAGNgA=\x00"), (name, 1): (7, "\x00")}
    assert again == answer
    # ... where confluent-kafka reads up to that NUL
    assert committed(consumer_config, name, [0, 1]) == {0: (100, "bAAGNgA="), 1: (7, "")}
    # ... and the exact bytes decode to what was committed
    decoded = decode_offset_map(100, "bAAGNgA=\x00", exact=True)
    assert (decoded.incomplete, decoded.highest_seen) == ((100, 103), 105)


def test_an_offset_committed_with_no_metadata_reads_as_none(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    reader: CommittedReader,
) -> None:
    name = topic(1)
    commit_without_nul(consumer_config, name, {0: (42, b"")})

    assert reader.read([(name, 0)], timeout=15) == {(name, 0): (42, None)}


def test_a_map_committed_without_a_nul_is_read_exactly(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    reader: CommittedReader,
) -> None:
    # Given a plain RunLength map committed as the Java client commits it, without a NUL; its
    # first 4 runs are a map of their own, so read with stray bytes after it, it is cut there
    written = encode_offset_map(3, 599, [3, 17, 42, 500], force=OffsetEncoding.RUN_LENGTH)
    assert written is not None
    assert decode_offset_map(3, written.metadata).incomplete == (3, 17)
    name = topic(1)
    commit_without_nul(consumer_config, name, {0: (3, written.metadata.encode("ascii"))})

    # When the reader reads it
    answer = reader.read([(name, 0)], timeout=15)

    # Then it is exactly the map, which decodes whole
    assert answer == {(name, 0): (3, written.metadata)}
    decoded = decode_offset_map(3, written.metadata, exact=True)
    assert (decoded.incomplete, decoded.highest_seen) == ((3, 17, 42, 500), 599)


@pytest.mark.parametrize("exact_reader", [True, False], ids=["exact-reader", "fallback"])
def test_a_consumer_restores_a_java_style_run_length_map(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    engines: Engines,
    monkeypatch: pytest.MonkeyPatch,
    exact_reader: bool,
) -> None:
    # Given 600 records and a group commit at offset 3, without a NUL, of a plain RunLength map
    # saying 3, 17, 42 and 500 are unfinished and everything else up to 599 is done
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 600)
    written = encode_offset_map(3, 599, [3, 17, 42, 500], force=OffsetEncoding.RUN_LENGTH)
    assert written is not None
    commit_without_nul(consumer_config, name, {0: (3, written.metadata.encode("ascii"))})
    if not exact_reader:
        # ... and, in the fallback case, no librdkafka the reader can use

        def unavailable() -> librdkafka.Library:
            raise Unavailable("no librdkafka in this test")

        monkeypatch.setattr(librdkafka, "load", unavailable)
    recorder = Recorder()

    def handle(ctx: PollContext) -> None:
        with recorder.call(ctx):
            pass

    # When a consumer of that group starts and everything from offset 3 on was polled
    pc = engines.start(consumer_config, Options(commit_interval=0.2), name, handle)

    def all_polled() -> bool:
        stats = pc.statistics()
        return stats.records_skipped + stats.records_registered >= 597

    wait_until(all_polled, timeout=30, what="offsets 3-599 polled", show=pc.statistics)
    wait_until(
        lambda: pc.statistics().records_succeeded == pc.statistics().records_registered,
        timeout=10,
        what="every registered record finished",
    )
    pc.close()

    # Then with the exact reader it runs exactly the unfinished records; falling back to
    # confluent-kafka's C string, it cuts the map after its first 4 runs and also runs the
    # finished records after them (none it was told is unfinished is skipped either way)
    if exact_reader:
        assert recorder.offsets() == {3, 17, 42, 500}
    else:
        prefix = decode_offset_map(3, written.metadata)
        assert prefix.incomplete == (3, 17)
        assert recorder.offsets() == {3, 17} | set(range(prefix.highest_seen + 1, 600))
    assert pc.failure is None
    assert committed(consumer_config, name, [0]) == {0: (600, "")}
