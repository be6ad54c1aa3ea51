"""Share groups (KIP-932) on a real broker: several instances share each partition, retries
and dead letters follow the broker's delivery count, and what a share group cannot do is
refused at start (docs/share-groups.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dead_letter_support import read_with_headers
from engine_support import Engines, wait_until
from share_support import share_config

from parallel_consumer import (
    ConfigurationError,
    Options,
    ParallelConsumer,
    PollContext,
    ProducerRecord,
)
from parallel_consumer import dead_letter as dl
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_requires("share_groups")]

SHARE_APP = Path(__file__).resolve().parents[1] / "share_app.py"

#: Small producer batches: a share fetch hands whole batches to one member, so large ones
#: would let the first member take a partition's 2,000 record locks at once.
SMALL_BATCHES = {"batch.num.messages": 100}
#: The first idempotent producer of a fresh broker waits for its transaction coordinator to load.
PRODUCE_TIMEOUT = 120.0


@pytest.fixture
def engines() -> Iterator[Engines]:
    started = Engines()
    yield started
    started.close_all()


def _group() -> str:
    return f"pc-share-{uuid.uuid4().hex[:8]}"


def _share(**options: Any) -> Options:
    return Options(group_protocol="share", ordering="unordered", **options)


def test_four_instances_share_each_partition_and_lose_no_record(
    kafka: KafkaBroker, topic: TopicFactory, engines: Engines
) -> None:
    # Given four instances in one share group on a 2-partition topic, all joined
    source = topic(2)
    config = share_config(kafka.bootstrap_servers, _group())
    seen: Counter[tuple[int, int]] = Counter()
    busy: dict[int, set[int]] = defaultdict(set)
    lock = threading.Lock()

    def handler_of(instance: int) -> Any:
        def handle(ctx: PollContext) -> None:
            time.sleep(0.005)
            with lock:
                seen[(ctx.partition, ctx.offset)] += 1
                busy[ctx.partition].add(instance)

        return handle

    options = _share(max_concurrency=16, fetch_batch_size=200)
    for i in range(4):
        engines.start(config, options, source, handler_of(i))
    time.sleep(4.0)  # (the group's assignment: heartbeats every 0.5 s, assignments every 1 s)
    # When 20,000 records arrive, with a 5 ms handler
    produce_records(
        kafka.bootstrap_servers,
        source,
        20_000,
        partitions=[0, 1],
        producer_config=SMALL_BATCHES,
        timeout=PRODUCE_TIMEOUT,
    )
    # Then every record is processed at least once and none is lost
    wait_until(lambda: len(seen) == 20_000, timeout=60, what="every record processed")
    engines.close_all()
    assert set(seen) == {(p, o) for p in (0, 1) for o in range(10_000)}
    duplicates = sum(seen.values()) - len(seen)
    # (A duplicate is a record whose acknowledgement the broker refused, its lock expired: at
    # least once. None is expected in a run this short; the count says if one happened.)
    assert duplicates <= 0.01 * len(seen), duplicates
    # And the share group, not the partition count, set the parallelism
    assert sorted(busy) == [0, 1]
    assert all(len(instances) > 2 for instances in busy.values()), busy


def test_poison_records_are_dead_lettered_after_exactly_max_retries_plus_one_deliveries(
    kafka: KafkaBroker, topic: TopicFactory, engines: Engines
) -> None:
    # Given 2,000 records: 3 % fail once (transient), 0.5 % always fail (poison)
    source = topic(2)
    config = share_config(kafka.bootstrap_servers, _group())
    records = produce_records(
        kafka.bootstrap_servers,
        source,
        2_000,
        partitions=[0, 1],
        producer_config=SMALL_BATCHES,
        timeout=PRODUCE_TIMEOUT,
    )
    poison = {(r.partition, r.offset) for i, r in enumerate(records) if i % 200 == 7}
    transient = {(r.partition, r.offset) for i, r in enumerate(records) if i % 33 == 5} - poison
    calls: Counter[tuple[int, int]] = Counter()
    attempts: dict[tuple[int, int], list[int]] = defaultdict(list)
    done: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        key = (ctx.partition, ctx.offset)
        with lock:
            calls[key] += 1
            attempts[key].append(ctx.attempts)
        if key in poison or (key in transient and ctx.attempts == 0):
            raise ValueError(f"fails at {key}")
        with lock:
            done.add(key)

    # When two instances with max_retries=2 run them
    options = _share(max_retries=2, retry_delay=0.05, max_concurrency=16)
    for _ in range(2):
        engines.start(config, options, source, handle)
    dlq = dl.default_topic(source)
    wait_until(
        lambda: (
            len(done) == 2_000 - len(poison)
            and len(read_with_headers(kafka.bootstrap_servers, dlq, timeout=5)) >= len(poison)
        ),
        timeout=60,
        what="every good record done and every poison record dead-lettered",
    )
    engines.close_all()
    # Then transient records succeeded on their second delivery
    assert transient <= done
    assert all(attempts[k][:2] == [0, 1] for k in transient), {k: attempts[k] for k in transient}
    # And each poison record ran on exactly max_retries + 1 deliveries, seen as attempts 0, 1, 2
    assert {k: sorted(attempts[k]) for k in poison} == {k: [0, 1, 2] for k in poison}
    letters = read_with_headers(kafka.bootstrap_servers, dlq)
    infos = {}
    for letter in letters:
        info = dl.read_dead_letter(letter.headers)
        assert info is not None
        infos[(info.partition, info.offset)] = (info, dict(letter.headers))
    assert set(infos) == poison
    for info, headers in infos.values():
        assert info.topic == source
        assert info.attempts == 3
        assert info.reason == dl.Reason.RETRIES_EXHAUSTED
        assert info.error_type == "builtins.ValueError"
        assert info.group == config["group.id"]
        assert headers[dl.DELIVERY_COUNT] == b"3"


def test_a_deadline_above_the_acquisition_lock_is_refused_at_start(
    kafka: KafkaBroker, topic: TopicFactory
) -> None:
    source = topic(1)
    config = share_config(kafka.bootstrap_servers, _group())
    pc = ParallelConsumer(config, _share(processing_timeout=45.0))
    pc.subscribe(source)
    with pytest.raises(ConfigurationError, match="acquisition lock"):
        pc.poll(lambda ctx: None)
    pc.close()


def test_more_retries_than_the_broker_delivers_a_record_are_refused_at_start(
    kafka: KafkaBroker, topic: TopicFactory
) -> None:
    source = topic(1)
    config = share_config(kafka.bootstrap_servers, _group(), **{"share.delivery.count.limit": "3"})
    pc = ParallelConsumer(config, _share(max_retries=3))
    pc.subscribe(source)
    with pytest.raises(ConfigurationError, match=r"share\.delivery\.count\.limit"):
        pc.poll(lambda ctx: None)
    pc.close()


def test_a_member_killed_mid_run_loses_nothing_and_its_records_keep_their_delivery_count(
    kafka: KafkaBroker, topic: TopicFactory, engines: Engines
) -> None:
    # Given a member in another process and one here, in one share group
    source = topic(2)
    group = _group()
    config = share_config(kafka.bootstrap_servers, group)
    lines: list[str] = []
    other = subprocess.Popen(
        [sys.executable, str(SHARE_APP), kafka.bootstrap_servers, source, group],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )

    def read() -> None:
        assert other.stdout is not None
        lines.extend(line.strip() for line in other.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    done: dict[tuple[int, int], list[int]] = defaultdict(list)
    lock = threading.Lock()

    def handle(ctx: PollContext) -> None:
        time.sleep(0.02)
        with lock:
            done[(ctx.partition, ctx.offset)].append(ctx.attempts)

    try:
        engines.start(config, _share(max_concurrency=8, max_retries=3), source, handle)
        time.sleep(4.0)  # (both members joined)
        produce_records(
            kafka.bootstrap_servers,
            source,
            1_000,
            partitions=[0, 1],
            producer_config={"batch.num.messages": 50},
            timeout=PRODUCE_TIMEOUT,
        )
        # When the other member is SIGKILLed once it has started 50 calls
        wait_until(
            lambda: sum(line.startswith("start ") for line in list(lines)) >= 50,
            timeout=60,
            what="the other member to start 50 calls",
        )
        other.send_signal(signal.SIGKILL)
        other.wait(10)
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
        reader.join(5)
        assert other.stdout is not None
        other.stdout.close()

    def parsed(kind: str) -> set[tuple[int, int]]:
        return {
            (int(p), int(o))
            for k, p, o, _ in (line.split() for line in lines if line.startswith(kind + " "))
        }

    finished_there = parsed("done")
    cut_off = parsed("start") - finished_there
    # Then every record is finished by one member or the other: none is lost
    wait_until(
        lambda: len(set(done) | finished_there) == 1_000,
        timeout=60,
        what="every record finished after the kill",
    )
    engines.close_all()
    # And the calls the kill cut off ran again here, counted as a further delivery
    assert cut_off, "the kill cut off no call"
    assert cut_off <= set(done)
    assert all(max(done[key]) >= 1 for key in cut_off), {k: done[k] for k in cut_off}


def _fails_first_delivery_of_every_fiftieth(ctx: PollContext) -> None:
    """Module level: the process runner pickles it."""
    if ctx.offset % 50 == 3 and ctx.attempts == 0:
        raise ValueError(f"first delivery of {ctx.offset}")


def test_the_process_runner_sees_the_delivery_count_as_attempts(
    kafka: KafkaBroker, topic: TopicFactory, engines: Engines
) -> None:
    # Given 200 records, every fiftieth failing on its first delivery only
    source = topic(2)
    config = share_config(kafka.bootstrap_servers, _group())
    produce_records(
        kafka.bootstrap_servers, source, 200, partitions=[0, 1], timeout=PRODUCE_TIMEOUT
    )
    # When worker processes run them on a share group
    options = _share(runner="process", processes=2, max_retries=2, retry_delay=0.05)
    pc = engines.start(config, options, source, _fails_first_delivery_of_every_fiftieth)
    # Then each fails once and succeeds on its redelivery (attempts 1 in the worker)
    wait_until(lambda: pc.statistics().records_succeeded == 200, timeout=60, what="all done")
    stats = pc.statistics()
    assert (stats.records_failed, stats.retries_exhausted) == (len(range(3, 100, 50)) * 2, 0)


def test_poll_and_produce_in_batches_writes_every_output_on_a_share_group(
    kafka: KafkaBroker, topic: TopicFactory
) -> None:
    source, output = topic(2), topic(1)
    config = share_config(kafka.bootstrap_servers, _group())
    produce_records(
        kafka.bootstrap_servers, source, 300, partitions=[0, 1], timeout=PRODUCE_TIMEOUT
    )
    pc = ParallelConsumer(config, _share(batch_size=10, max_retries=2))

    def handle(ctx: PollContext) -> list[ProducerRecord]:
        return [ProducerRecord(output, r.value, key=r.key) for r in ctx.records]

    try:
        pc.subscribe(source)
        pc.poll_and_produce(handle)
        wait_until(lambda: pc.statistics().records_succeeded == 300, timeout=60, what="all done")
        assert pc.statistics().outputs_acknowledged == 300
    finally:
        pc.close()
    values = sorted(r.value for r in read_with_headers(kafka.bootstrap_servers, output))
    assert values == sorted(f"value-{i}".encode() for i in range(300))
