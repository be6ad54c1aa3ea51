"""A poison record no longer throttles its partition: the offset map that grows behind it spills
to the side topic, and a SIGKILLed consumer's successor runs only what was left unfinished.

In KEY order one record fails for ever (retried every 50 ms) while thousands of later records of
its key wait behind it, at random offsets among many others: the map of those holes cannot fit
4 KB in any encoding. The other records must all finish (a throttled partition would stop), the
commit must reference the side record with exactly the unfinished offsets, ``pc offsets`` must
decode it, and after a SIGKILL the next consumer must call nothing but the poison record.
The 1,000,000-record version is marked ``stress``.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from engine_support import commit_directly, committed, end_offsets, wait_until

from parallel_consumer import CommitMode, Options, ParallelConsumer, PollContext
from parallel_consumer.cli.main import main
from parallel_consumer.kafka.spill_store import SpillStore
from parallel_consumer.offsets import decode_offset_map
from parallel_consumer.offsets.spill import (
    SpillReference,
    default_spill_topic,
    format_reference,
    parse_reference,
    side_key,
    side_value,
)
from parallel_consumer.testing import create_topic, produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_requires("commit_metadata")]

WORKER = Path(__file__).resolve().parent.parent / "spill_worker.py"
POISON = 100


def _keys(records: int, later: int, seed: int) -> tuple[list[str], set[int]]:
    """Keys of ``records`` records: the poison record's key at POISON and at ``later`` random
    offsets after it, 500 other keys everywhere else. Returns the keys and those offsets."""
    rnd = random.Random(seed)
    keys = [f"k{rnd.randrange(500)}" for _ in range(records)]
    held = {POISON, *rnd.sample(range(POISON + 1, records), later)}
    for offset in held:
        keys[offset] = "poison"
    return keys, held


def _lines(log: Path, kind: bytes) -> list[int]:
    if not log.exists():
        return []
    return [int(line.split()[1]) for line in log.read_bytes().splitlines() if line[:1] == kind]


def _start(bootstrap: str, topic: str, group: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log.with_suffix(".stderr"), "wb") as stderr:  # the child keeps its own copy
        return subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                f"--bootstrap={bootstrap}",
                f"--topic={topic}",
                f"--group={group}",
                f"--poison={POISON}",
                f"--log={log}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
            start_new_session=True,
        )


def _kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)


def _count_records(bootstrap: str, topic: str) -> int:
    """Records (not transaction markers) in partition 0 of ``topic``, read committed."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "pc-side-reader-unused",
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    count = 0
    try:
        consumer.assign([KafkaTopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                break  # (the end of the partition)
            count += 1
    finally:
        consumer.close()
    return count


def _committed_map(config: dict[str, Any], topic: str) -> tuple[int, str, set[int], int] | None:
    """(committed offset, metadata, unfinished offsets, highest seen) read as a new owner would:
    a reference resolved through the side topic. None while there is none (or the group
    coordinator is not ready to say)."""
    try:
        offset, metadata = committed(config, topic, [0])[0]
    except KafkaException:
        return None
    if offset < 0 or parse_reference(metadata) is None:
        return None
    store = SpillStore(
        config,
        group=config["group.id"],
        topic=default_spill_topic(config["group.id"]),
        producer_factory=Producer,
        consumer_factory=Consumer,
        admin_factory=AdminClient,
    )
    try:
        found = store.resolve((topic, 0), offset, metadata)
    finally:
        store.close()
    assert found is not None
    decoded = decode_offset_map(offset, found, exact=True)
    return offset, metadata, set(decoded.incomplete), decoded.highest_seen


def _run(
    kafka: KafkaBroker,
    topic: TopicFactory,
    config: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    *,
    records: int,
    later: int,
) -> None:
    # Given one partition of records, the poison record's key at POISON and at `later` random
    # offsets after it, and a KEY-order consumer whose handler fails the poison record for ever
    name = topic(1)
    keys, held = _keys(records, later, seed=records)
    produce_records(kafka.bootstrap_servers, name, records, keys=keys, partitions=[0])
    group = config["group.id"]
    first_log = tmp_path / "first.log"
    first = _start(kafka.bootstrap_servers, name, group, first_log)
    try:
        # When it runs: every other record finishes (the partition is never throttled) ...
        others = records - len(held)
        wait_until(
            lambda: len(_lines(first_log, b"H")) >= others,
            timeout=60 + records / 1000,
            what=f"{others} records finished beside the poison record",
        )

        # ... and its commit references a spilled map of exactly the records left unfinished
        def exact_commit() -> bool:
            found = _committed_map(config, name)
            return found is not None and found[2] == held and found[3] == records - 1

        wait_until(exact_commit, timeout=30, what="a commit of the spilled map of every hole")
        # When it is SIGKILLed
    finally:
        _kill(first)
    stderr = first_log.with_suffix(".stderr").read_text()
    assert "TOO_LARGE" not in stderr
    assert "only records below offset" not in stderr
    assert set(_lines(first_log, b"H")) == set(range(records)) - held
    found = _committed_map(config, name)
    assert found is not None
    offset, reference, _, _ = found
    assert offset == POISON
    assert len(reference) < 300

    # Then `pc offsets` decodes the spilled map and says where it lives
    code = main(["offsets", f"--bootstrap={kafka.bootstrap_servers}", f"--group={group}", "--json"])
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert code == 0
    assert row["committed_offset"] == POISON
    assert row["incomplete_count"] == len(held)
    assert row["spilled_to"].startswith(f"{default_spill_topic(group)}[0]@")
    # (confluent-kafka stores a NUL after every metadata string it commits: one more byte)
    assert len(reference) <= row["metadata_bytes"] <= len(reference) + 1
    assert row["map_bytes"] > 4096

    # When a new consumer of the group starts
    second_log = tmp_path / "second.log"
    second = _start(kafka.bootstrap_servers, name, group, second_log)
    try:
        wait_until(
            lambda: _lines(second_log, b"C").count(POISON) >= 5,
            timeout=60,
            what="the poison record retried by the new consumer",
        )
        time.sleep(1.0)  # room for anything else it would (wrongly) run
    finally:
        _kill(second)
    # Then it called the poison record and nothing else: no finished record ran again
    assert set(_lines(second_log, b"C")) == {POISON}
    assert "replaying everything" not in second_log.with_suffix(".stderr").read_text()


@pytest.mark.parametrize(
    ("records", "later"),
    [
        pytest.param(50_000, 7_000, marks=pytest.mark.timeout(240), id="50k"),
        pytest.param(
            1_000_000, 5_000, marks=[pytest.mark.stress, pytest.mark.timeout(1800)], id="1M"
        ),
    ],
)
def test_a_poison_record_with_thousands_of_holes_behind_it_spills_and_restarts_exactly(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    records: int,
    later: int,
) -> None:
    _run(kafka, topic, consumer_config, capsys, tmp_path, records=records, later=later)


@pytest.mark.parametrize("case", ["deleted", "stale"])
def test_a_reference_whose_map_cannot_be_had_replays_from_the_committed_offset(
    kafka: KafkaBroker,
    topic: TopicFactory,
    consumer_config: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
    case: str,
) -> None:
    # Given a group whose commit at offset 5 references a side record that is gone (the side
    # topic was never there) or is another version of the map (its checksum differs)
    name = topic(1)
    produce_records(kafka.bootstrap_servers, name, 20, partitions=[0])
    group = consumer_config["group.id"]
    side = default_spill_topic(group)
    side_offset = 0
    if case == "stale":
        # a record of the right key, but not the map the reference was written for
        create_topic(kafka.bootstrap_servers, side, partitions=1)
        produce_records(
            kafka.bootstrap_servers,
            side,
            1,
            keys=[side_key(group, name, 0)],
            values=[side_value(5, "bGw=")],
        )
    reference = format_reference(SpillReference(side, 0, side_offset, 0x1234ABCD))
    commit_directly(consumer_config, name, {0: (5, reference)})
    seen: list[int] = []

    # When a consumer of the group starts
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        pc = ParallelConsumer(dict(consumer_config), Options(commit_interval=0.2))
        try:
            pc.subscribe(name)
            pc.poll(lambda ctx: seen.append(ctx.offset))
            wait_until(lambda: len(seen) >= 15, timeout=30, what="the records from offset 5")
        finally:
            pc.close()

    # Then it replays everything from the committed offset (duplicates, never a loss), and a
    # WARNING names the partition
    assert sorted(seen) == list(range(5, 20))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{name}[0]" in w and "replaying everything from that offset" in w for w in warnings)


@pytest.mark.kafka_requires("transactions")
def test_in_the_transactional_mode_the_side_record_commits_with_the_transaction(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any]
) -> None:
    # Given 2,000 records, the poison record's key at POISON and at 300 later offsets, and a
    # transactional consumer whose maps spill from 64 bytes on (a small limit: a small test)
    name = topic(1)
    records = 2_000
    keys, held = _keys(records, 300, seed=7)
    produce_records(kafka.bootstrap_servers, name, records, keys=keys, partitions=[0])
    group = consumer_config["group.id"]
    options = Options(
        ordering="key",
        commit_mode=CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER,
        retry_delay=0.05,
        max_metadata_bytes=64,
        stall_threshold=None,
    )

    def start(calls: list[int]) -> ParallelConsumer:
        def handle(ctx: PollContext) -> None:
            calls.append(ctx.offset)
            if ctx.offset == POISON:
                raise RuntimeError("poison")

        pc = ParallelConsumer(
            dict(consumer_config), options, producer_config={"transactional.id": f"{group}-tx"}
        )
        pc.subscribe(name)
        pc.poll_and_produce(handle)
        return pc

    # When it has finished everything but the poison key's records
    first: list[int] = []
    pc = start(first)
    try:

        def exact_commit() -> bool:
            found = _committed_map(consumer_config, name)
            return found is not None and found[2] == held and found[3] == records - 1

        wait_until(exact_commit, timeout=60, what="a commit of the spilled map of every hole")
    finally:
        pc.close(drain=False, timeout=2)

    # Then the side records were written in transactions (their markers take offsets too) and
    # the map read committed is exact (checked above)
    side = default_spill_topic(group)
    written = _count_records(kafka.bootstrap_servers, side)
    assert written > 0
    assert end_offsets(kafka.bootstrap_servers, side, [0])[0] > written

    # When a new consumer of the group starts
    second: list[int] = []
    pc2 = start(second)
    try:
        wait_until(lambda: second.count(POISON) >= 5, timeout=60, what="the poison record again")
        time.sleep(1.0)
    finally:
        pc2.close(drain=False, timeout=2)
    # Then it ran the poison record and nothing else
    assert set(second) == {POISON}


def test_a_partition_whose_map_fits_again_leaves_a_tombstone_in_the_side_topic(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any]
) -> None:
    # Given a consumer whose maps spill from 64 bytes on, and a record that fails until released
    name = topic(1)
    keys, held = _keys(1_000, 100, seed=3)
    produce_records(kafka.bootstrap_servers, name, 1_000, keys=keys, partitions=[0])
    group = consumer_config["group.id"]
    release = threading.Event()
    seen: set[int] = set()

    def handle(ctx: PollContext) -> None:
        if ctx.offset == POISON and not release.is_set():
            raise RuntimeError("poison, for now")
        seen.add(ctx.offset)

    options = Options(ordering="key", retry_delay=0.05, commit_interval=0.2, max_metadata_bytes=64)
    pc = ParallelConsumer(dict(consumer_config), options)
    try:
        pc.subscribe(name)
        pc.poll(handle)
        # When its map has spilled ...
        wait_until(
            lambda: (
                (found := _committed_map(consumer_config, name)) is not None and found[2] == held
            ),
            timeout=60,
            what="a spilled map of the held records",
        )
        # ... and the record then succeeds, so that everything finishes
        release.set()
        wait_until(
            lambda: (
                _committed_map(consumer_config, name) is None
                and committed(consumer_config, name, [0])[0] == (1_000, "")
            ),
            timeout=60,
            what="everything committed without a map",
        )
    finally:
        pc.close()
    # Then the partition's key ends with a tombstone: compaction leaves nothing of its maps
    last = _last_record(kafka.bootstrap_servers, default_spill_topic(group))
    assert last == (side_key(group, name, 0), None)
    assert seen == set(range(1_000))


def _last_record(bootstrap: str, topic: str) -> tuple[bytes | None, bytes | None]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "pc-side-reader-unused",
            "enable.partition.eof": True,
        }
    )
    last: tuple[bytes | None, bytes | None] = (None, b"")
    try:
        consumer.assign([KafkaTopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                break  # (the end of the partition)
            last = (message.key(), message.value())
    finally:
        consumer.close()
    return last
