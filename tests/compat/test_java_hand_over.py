"""A consumer group handed over between this library and the real Java Parallel Consumer, through a
real broker, in both directions (``compat`` marker; needs java, mvn and the ``kafka`` fixture).

Each test processes a topic with one library, leaving a known set of records unfinished (their
handler keeps failing), closes it (which commits the offset and the offset map), and lets the other
library take the group over. "Re-run" counts records the second library processed although the
first had finished them; "lost" counts unfinished records the second one never processed. The
figures are printed (``pytest -s``) so they can be quoted; ``docs/offset-metadata.md`` has them.

The byte layouts are identical (``test_java_compat.py``); what these tests see is the transport:
confluent-kafka passes commit metadata as a C string, see ``docs/offset-metadata.md``. This
library avoids that where it can, reading (``parallel_consumer/kafka/committed_reader.py``) and
committing (``parallel_consumer/kafka/exact_commits.py``) the metadata with its exact length
through librdkafka; each direction also runs with the fallback through confluent-kafka.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from compat_support import java_tools_missing, run_java_consumer
from confluent_kafka import Consumer, TopicPartition

from parallel_consumer import (
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
    Retry,
)
from parallel_consumer.kafka import exact_commits, librdkafka
from parallel_consumer.kafka.committed_reader import CommittedReader
from parallel_consumer.kafka.librdkafka import Unavailable
from parallel_consumer.offsets import (
    OffsetEncoding,
    decode_offset_map,
    plan_commit,
    read_committed_metadata,
)
from parallel_consumer.offsets.spill import parse_reference
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory
from parallel_consumer.work import commit_tracker

pytestmark = [
    pytest.mark.compat,
    pytest.mark.kafka_requires("commit_metadata"),
    pytest.mark.skipif(
        java_tools_missing() is not None,
        reason=f"the Java Parallel Consumer needs java and mvn: {java_tools_missing()}",
    ),
]

RECORDS = 5_000
PARTITIONS = 2
Record = tuple[int, int]  # (partition, offset)


def produce(kafka: KafkaBroker, topic: TopicFactory) -> tuple[str, set[Record]]:
    """A topic of RECORDS records over PARTITIONS partitions, each with its own key."""
    name = topic(PARTITIONS)
    written = produce_records(
        kafka.bootstrap_servers,
        name,
        RECORDS,
        keys=[f"key-{i}" for i in range(RECORDS)],
        partitions=list(range(PARTITIONS)),
    )
    return name, {(r.partition, r.offset) for r in written}


def pick_unfinished(records: set[Record], count: int, seed: int) -> set[Record]:
    return set(random.Random(seed).sample(sorted(records), count))


def wait_until(condition: Callable[[], object], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class PythonConsumer:
    """A ParallelConsumer of this library whose handler records what it processed and never
    finishes the records in ``failing`` (it raises Retry with an hour's delay)."""

    def __init__(
        self, config: dict[str, Any], topic: str, failing: set[Record], **options: Any
    ) -> None:
        self.processed: set[Record] = set()
        self._lock = threading.Lock()
        self._failing = failing
        self.pc = ParallelConsumer(
            config,
            Options(
                ordering=ProcessingOrder.KEY, max_concurrency=8, commit_interval=0.2, **options
            ),
        )
        self.pc.subscribe([topic])
        self.pc.poll(self._handle)

    def _handle(self, ctx: PollContext) -> None:
        record = (ctx.partition, ctx.offset)
        if record in self._failing:
            raise Retry("deliberately unfinished", delay=3600)
        with self._lock:
            self.processed.add(record)

    def close(self, *, drain: bool) -> None:
        self.pc.close(drain=drain, timeout=5.0)


@pytest.fixture
def python_consumers() -> Iterator[list[PythonConsumer]]:
    """Every PythonConsumer a test starts is closed at its end, whatever happened."""
    started: list[PythonConsumer] = []
    yield started
    for consumer in started:
        try:
            consumer.close(drain=False)
        except Exception as exc:  # already closed, or failed: report, do not mask the test
            print(f"closing {consumer.pc!r} at the end of the test: {exc!r}")


def committed_as_confluent_kafka_reads_it(
    config: dict[str, Any], topic: str
) -> dict[int, tuple[int, str | None, str | None]]:
    """partition -> (offset, metadata, error): the commit as confluent-kafka returns it (the
    error when reading ``metadata`` raised, and then what ``read_committed_metadata`` keeps)."""
    consumer = Consumer({k: config[k] for k in ("bootstrap.servers", "group.id")})
    try:
        answer = consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=15
        )
        result = {}
        for tp in answer:
            error = None
            try:
                _ = tp.metadata
            except UnicodeDecodeError as exc:  # stray bytes that are not UTF-8
                error = repr(exc)
            result[tp.partition] = (tp.offset, read_committed_metadata(tp), error)
        return result
    finally:
        consumer.close()


def committed_exactly(config: dict[str, Any], topic: str) -> dict[Any, tuple[int, str | None]]:
    """(topic, partition) -> (offset, metadata): the group's commit read with its exact bytes."""
    reader = CommittedReader(config)
    try:
        stored = reader.read([(topic, p) for p in range(PARTITIONS)], timeout=15)
    finally:
        reader.close()
    assert stored is not None, reader.unavailable
    return stored


def report(direction: str, records: int, unfinished: set[Record], processed: set[Record]) -> None:
    rerun, lost = processed - unfinished, unfinished - processed
    print(
        f"\n{direction}: records {records}, left unfinished {len(unfinished)}, "
        f"processed by the new owner {len(processed)}, re-run {len(rerun)}, lost {len(lost)}"
    )


def python_finishes_all_but_50(
    kafka: KafkaBroker,
    topic: TopicFactory,
    config: dict[str, Any],
    python_consumers: list[PythonConsumer],
    **options: Any,
) -> tuple[str, set[Record], set[Record], dict[int, int]]:
    """A topic of RECORDS records of which this library (with ``options``) finishes all but 50
    and closes, committing each partition's lowest unfinished offset and the map above it.
    Returns the topic, its records, the unfinished ones and the lowest unfinished offset per
    partition."""
    name, records = produce(kafka, topic)
    unfinished = pick_unfinished(records, 50, seed=1)
    first = PythonConsumer(config, name, unfinished, **options)
    python_consumers.append(first)
    wait_until(
        lambda: len(first.processed) == RECORDS - len(unfinished),
        timeout=45,
        what="this library to finish every record but the unfinished ones",
    )
    first.close(drain=False)
    lowest = {p: min(o for q, o in unfinished if q == p) for p in range(PARTITIONS)}
    return name, records, unfinished, lowest


def exact_commits_unavailable() -> str | None:
    """Why this library cannot commit its maps exactly here (then it stores each map with a NUL
    the Java library cannot decode), or None if it can."""
    try:
        librdkafka.load().writing()
        exact_commits._check_client_version()
    except Unavailable as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    "encoding",
    [
        # The encoding this library picks (the smallest; here RunLength compressed) ...
        pytest.param(None, id="chosen"),
        # ... and every encoding the Java library reads, forced
        *(pytest.param(e, id=e.name.lower()) for e in OffsetEncoding if e.decodable),
    ],
)
def test_python_to_java_hand_over_is_exact(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    python_consumers: list[PythonConsumer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    encoding: OffsetEncoding | None,
) -> None:
    if (why := exact_commits_unavailable()) is not None:
        pytest.skip(f"offset maps cannot be committed exactly here: {why}")
    if encoding is not None:
        # (the library's test knob, as Java's OffsetMapCodecManager.forcedCodec)
        monkeypatch.setattr(
            commit_tracker, "plan_commit", functools.partial(plan_commit, force=encoding)
        )
    # Given 5,000 records, of which this library finishes all but 50, and closes, committing
    # each partition's lowest unfinished offset and the map above it, exactly: no NUL after it
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        name, _, unfinished, lowest = python_finishes_all_but_50(
            kafka, topic, consumer_config, python_consumers
        )
    assert not [r for r in caplog.records if "committed exactly" in r.getMessage()]
    stored = committed_exactly(consumer_config, name)
    for (_, partition), (offset, metadata) in stored.items():
        assert offset == lowest[partition]
        assert metadata
        assert not metadata.endswith("\x00")
        decoded = decode_offset_map(offset, metadata, exact=True)
        assert encoding is None or decoded.encoding is encoding
        assert set(decoded.incomplete) == {
            o for p, o in unfinished if p == partition and o <= decoded.highest_seen
        }

    # When the real Java Parallel Consumer takes the group over and runs to the end
    java, log = run_java_consumer(
        kafka.bootstrap_servers, name, consumer_config["group.id"], ordering="KEY"
    )

    # Then it read exactly the map this library committed ...
    assert java["reached"], java
    assert "rror decoding offsets" not in log, log[-2000:]
    for partition, commit in java["committed_before"].items():
        assert commit["metadata"] == stored[(name, int(partition))][1], commit
        assert "error" not in commit["java_decoded"], commit
        assert commit["java_decoded"]["incompletes"] == sorted(
            o for p, o in unfinished if p == int(partition)
        )
        print(f"  partition {partition}: Java reads {len(commit['metadata'])} chars: {commit}")
    # ... and processed exactly the records this library left unfinished: none lost, no
    # finished record run again
    processed = {(p, o) for p, o in java["processed"]}
    label = encoding.name if encoding is not None else "chosen encoding"
    report(f"Python -> Java ({label})", RECORDS, unfinished, processed)
    assert processed == unfinished


def test_python_to_java_hand_over_without_exact_commits_loses_nothing_but_replays(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    python_consumers: list[PythonConsumer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a process where this library cannot commit its maps exactly (it falls back to
    # confluent-kafka's commit, see docs/offset-metadata.md) ...
    monkeypatch.setattr(exact_commits, "CLIENT_VERIFIED_BELOW", (0, 0))
    # ... and 5,000 records, of which this library finishes all but 50, and closes
    name, records, unfinished, lowest = python_finishes_all_but_50(
        kafka, topic, consumer_config, python_consumers
    )
    for partition, (offset, metadata, _) in committed_as_confluent_kafka_reads_it(
        consumer_config, name
    ).items():
        assert offset == lowest[partition]
        assert metadata
        decoded = decode_offset_map(offset, metadata)
        assert set(decoded.incomplete) == {
            o for p, o in unfinished if p == partition and o <= decoded.highest_seen
        }

    # When the real Java Parallel Consumer takes the group over and runs to the end
    java, log = run_java_consumer(
        kafka.bootstrap_servers, name, consumer_config["group.id"], ordering="KEY"
    )

    # Then it processed every unfinished record: nothing is lost
    assert java["reached"], java
    processed = {(p, o) for p, o in java["processed"]}
    report("Python -> Java (fallback: confluent-kafka's commit)", RECORDS, unfinished, processed)
    assert unfinished <= processed
    # ... but it could not read the map: confluent-kafka stored it with a trailing NUL, which
    # Java's Base64 decoder rejects, so Java logged that and replayed everything from the
    # committed offset (re-running the records this library had finished above it).
    for partition, commit in java["committed_before"].items():
        assert commit["metadata_last_chars"][-1] == 0, commit  # the NUL
        assert "error" in commit["java_decoded"], commit
        print(f"  partition {partition}: Java reads {commit['metadata'][-12:]!r}: {commit}")
    print("  Java's log: " + " | ".join(line for line in log.splitlines() if "ecod" in line)[:600])
    replayed_from_committed = {(p, o) for p, o in records if o >= lowest[p]}
    assert processed == replayed_from_committed


def test_python_to_java_hand_over_of_spilled_maps_loses_nothing_but_replays(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    python_consumers: list[PythonConsumer],
) -> None:
    # Given 5,000 records, of which this library finishes all but 50 and closes, with a limit
    # so small that every map spills: each partition's commit is a reference to the side topic
    name, records, unfinished, lowest = python_finishes_all_but_50(
        kafka, topic, consumer_config, python_consumers, max_metadata_bytes=16
    )
    stored = committed_exactly(consumer_config, name)
    for (_, partition), (offset, metadata) in stored.items():
        assert offset == lowest[partition]
        assert metadata is not None
        assert parse_reference(metadata) is not None, metadata

    # When the real Java Parallel Consumer takes the group over and runs to the end
    java, _ = run_java_consumer(
        kafka.bootstrap_servers, name, consumer_config["group.id"], ordering="KEY"
    )

    # Then it read the reference as the commit's metadata and could not decode it as a map ...
    assert java["reached"], java
    for partition, commit in java["committed_before"].items():
        assert commit["metadata"] == stored[(name, int(partition))][1], commit
        assert "error" in commit["java_decoded"], commit
    # ... so it replayed everything from the committed offset: nothing lost, finished records
    # above it run again (as after a map it cannot read; see docs/offset-metadata.md)
    processed = {(p, o) for p, o in java["processed"]}
    report("Python (spilled) -> Java", RECORDS, unfinished, processed)
    assert unfinished <= processed
    assert processed == {(p, o) for p, o in records if o >= lowest[p]}


def exact_reader_unavailable() -> str | None:
    """Why this library cannot read committed metadata exactly here, or None if it can."""
    try:
        librdkafka.load()
    except Unavailable as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    "reader",
    [
        # How this library reads the commit: with its exact length through librdkafka (what
        # the poller does when it can) ...
        pytest.param("exact", id="exact-reader"),
        # ... or, falling back, through confluent-kafka's committed(), which returns the map
        # followed by stray bytes (a C string read past its end)
        pytest.param("fallback", id="fallback"),
    ],
)
@pytest.mark.parametrize(
    ("unfinished_count", "self_delimiting"),
    [
        # 100 holes per 2,500 offsets: Java's smallest map is a BitSet (or a compressed form);
        # both are self-delimiting, so even the fallback cuts the map out of the stray bytes
        # exactly.
        pytest.param(200, True, id="bitset-map"),
        # 25 holes per 2,500: Java writes a plain RunLength map, which has no length header;
        # read with stray bytes after it (the fallback), only its shortest prefix that is
        # itself a written map can be trusted, so records after that prefix run again (none is
        # skipped). Read exactly, it is decoded whole.
        pytest.param(50, False, id="run-length-map"),
    ],
)
def test_java_to_python_hand_over(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    python_consumers: list[PythonConsumer],
    monkeypatch: pytest.MonkeyPatch,
    unfinished_count: int,
    self_delimiting: bool,
    reader: str,
) -> None:
    if reader == "exact" and (why := exact_reader_unavailable()) is not None:
        pytest.skip(f"the exact committed-metadata reader is unavailable: {why}")
    # Given 5,000 records, of which the real Java Parallel Consumer finishes all but some
    name, records = produce(kafka, topic)
    unfinished = pick_unfinished(records, unfinished_count, seed=2)
    java, _ = run_java_consumer(
        kafka.bootstrap_servers,
        name,
        consumer_config["group.id"],
        ordering="KEY",
        failing=unfinished,
        until_succeeded=RECORDS - len(unfinished),
    )
    assert java["reached"], java
    assert {(p, o) for p, o in java["processed"]} == records - unfinished
    java_commits = {int(p): c for p, c in java["committed"].items()}

    # ... and commits maps of the kind this case is about (the Java client reads them exactly)
    expected_incomplete: dict[int, tuple[int, ...]] = {}
    predicted_rerun: set[Record] = set()
    for partition, commit in java_commits.items():
        offset, metadata = commit["offset"], commit["metadata"]
        exactly = decode_offset_map(offset, metadata, exact=True)
        assert list(exactly.incomplete) == commit["java_decoded"]["incompletes"]
        expected_incomplete[partition] = exactly.incomplete
        assert set(exactly.incomplete) == {o for p, o in unfinished if p == partition}
        encoding = exactly.encoding
        assert encoding is not None
        plain_run_length = not encoding.is_bitset and not encoding.compressed
        assert plain_run_length is not self_delimiting, (
            f"Java chose {encoding.name}; adjust the case"
        )
        # What a reader that allows for stray bytes makes of it: the records it cannot count
        # as finished are the ones that will run again
        read_back = decode_offset_map(offset, metadata)
        finished_per_java = set(range(offset, exactly.highest_seen + 1)) - set(exactly.incomplete)
        finished_read_back = set(range(offset, read_back.highest_seen + 1)) - set(
            read_back.incomplete
        )
        assert finished_read_back <= finished_per_java
        predicted_rerun |= {(partition, o) for o in finished_per_java - finished_read_back}
        print(
            f"\n  partition {partition}: Java committed {offset} with {encoding.name}, "
            f"{len(metadata)} chars"
        )

    # ... which confluent-kafka returns followed by stray bytes (whatever follows in memory)
    for partition, (offset, metadata, error) in committed_as_confluent_kafka_reads_it(
        consumer_config, name
    ).items():
        java_metadata = java_commits[partition]["metadata"]
        stray = None if metadata is None else metadata[len(java_metadata) :]
        print(f"  partition {partition}: confluent-kafka returns the map + {stray!r} {error or ''}")
        assert offset == java_commits[partition]["offset"]

    # ... and exactly that map, no NUL, when read with its length through librdkafka
    if reader == "exact":
        exact_reader = CommittedReader(consumer_config)
        try:
            exactly_read = exact_reader.read([(name, p) for p in range(PARTITIONS)], timeout=15)
        finally:
            exact_reader.close()
        assert exactly_read == {
            (name, p): (c["offset"], c["metadata"]) for p, c in java_commits.items()
        }
    else:

        def unavailable() -> librdkafka.Library:
            raise Unavailable("the test takes the fallback path")

        monkeypatch.setattr(librdkafka, "load", unavailable)

    # When this library takes the group over and runs to the end of every partition
    second = PythonConsumer(consumer_config, name, set())
    python_consumers.append(second)
    redelivered = sum(
        sum(1 for p, o in records if p == partition and o >= commit["offset"])
        for partition, commit in java_commits.items()
    )

    def everything_redelivered_is_done() -> bool:
        if second.pc.failure is not None:
            return True
        stats = second.pc.statistics()
        seen = stats.records_skipped + stats.records_registered
        return seen >= redelivered and stats.records_succeeded == stats.records_registered

    wait_until(everything_redelivered_is_done, timeout=45, what="the rest of the topic")
    failure = second.pc.failure
    assert failure is None, failure
    second.close(drain=True)

    # Then it processed every record Java left unfinished (nothing lost) ...
    processed = second.processed
    map_kind = "BitSet or compressed" if self_delimiting else "plain RunLength"
    report(f"Java -> Python ({map_kind} map, {reader} reader)", RECORDS, unfinished, processed)
    assert unfinished <= processed
    if reader == "exact" or self_delimiting:
        # ... and only those: the hand-over is exact
        assert processed == unfinished
    else:
        # ... and, beyond them, exactly the finished records the map cannot vouch for
        assert processed == unfinished | predicted_rerun
        assert predicted_rerun


def java_name(encoding: OffsetEncoding) -> str:
    """``OffsetEncoding.BIT_SET_V2_COMPRESSED`` -> ``BitSetV2Compressed``."""
    return "".join(part.capitalize() for part in encoding.name.split("_"))


# (stress: 8 more Java runs, ~10 s each; the Java -> Python cases above already cover the
# BitSet, compressed and RunLength maps in CI)
@pytest.mark.stress
@pytest.mark.parametrize(
    "encoding", [pytest.param(e, id=e.name.lower()) for e in OffsetEncoding if e.decodable]
)
def test_java_to_python_hand_over_is_exact_in_every_encoding(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    python_consumers: list[PythonConsumer],
    encoding: OffsetEncoding,
) -> None:
    if (why := exact_reader_unavailable()) is not None:
        pytest.skip(f"the exact committed-metadata reader is unavailable: {why}")
    # Given 5,000 records, of which the real Java Parallel Consumer finishes all but 50 and
    # commits its maps in this encoding (the Java library's forcedCodec)
    name, records = produce(kafka, topic)
    unfinished = pick_unfinished(records, 50, seed=5)
    java, _ = run_java_consumer(
        kafka.bootstrap_servers,
        name,
        consumer_config["group.id"],
        ordering="KEY",
        failing=unfinished,
        until_succeeded=RECORDS - len(unfinished),
        force_codec=java_name(encoding),
    )
    assert java["reached"], java
    for partition, commit in java["committed"].items():
        decoded = decode_offset_map(commit["offset"], commit["metadata"], exact=True)
        assert decoded.encoding is encoding, commit
        assert set(decoded.incomplete) == {o for p, o in unfinished if p == int(partition)}

    # When this library takes the group over (reading the maps exactly) and runs to the end
    second = PythonConsumer(consumer_config, name, set())
    python_consumers.append(second)
    redelivered = sum(1 for p, o in records if o >= int(java["committed"][str(p)]["offset"]))

    def everything_redelivered_is_done() -> bool:
        if second.pc.failure is not None:
            return True
        stats = second.pc.statistics()
        seen = stats.records_skipped + stats.records_registered
        return seen >= redelivered and stats.records_succeeded == stats.records_registered

    wait_until(everything_redelivered_is_done, timeout=45, what="the rest of the topic")
    assert second.pc.failure is None, second.pc.failure
    second.close(drain=True)

    # Then it processed exactly the records Java left unfinished: none lost, none run again
    report(f"Java -> Python ({encoding.name})", RECORDS, unfinished, second.processed)
    assert second.processed == unfinished
