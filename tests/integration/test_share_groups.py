"""Share groups (KIP-932) on a real broker: several instances share each partition, retries
and dead letters follow the broker's delivery count, and what a share group cannot do is
refused at start (docs/share-groups.md)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from dead_letter_support import read_with_headers
from engine_support import Engines, wait_until
from share_support import share_config

from parallel_consumer import ConfigurationError, Options, ParallelConsumer, PollContext
from parallel_consumer import dead_letter as dl
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_requires("share_groups")]

#: Small producer batches: a share fetch hands whole batches to one member, so large ones
#: would let the first member take a partition's 2,000 record locks at once.
SMALL_BATCHES = {"batch.num.messages": 100}


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
        kafka.bootstrap_servers, source, 20_000, partitions=[0, 1], producer_config=SMALL_BATCHES
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
        kafka.bootstrap_servers, source, 2_000, partitions=[0, 1], producer_config=SMALL_BATCHES
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
