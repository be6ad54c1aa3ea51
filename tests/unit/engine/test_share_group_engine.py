"""A whole ParallelConsumer on a share group over fake ShareConsumer clients: which
acknowledgement each outcome ends in, and when (after the dead letter or the outputs are
acknowledged, never for a call past its deadline), a close with records held for a retry, and
health()/statistics() (docs/share-groups.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType

from parallel_consumer import Lifecycle, Options, ParallelConsumer, PollContext, ProducerRecord
from parallel_consumer.testing import FakeCluster
from parallel_consumer.testing._fake_producer import FakeAdmin

TOPIC = "in"
ACCEPT, RELEASE = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE


class Record:
    """A share consumer's record."""

    def __init__(self, offset: int, delivery_count: int = 1) -> None:
        self._offset, self._count = offset, delivery_count

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k%d" % self._offset

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)

    def delivery_count(self) -> int:
        return self._count


class Broker:
    """Hands each record out once (the first client to poll takes them all) and keeps every
    acknowledgement: (offset, type), in the order made."""

    def __init__(self, records: list[Record]) -> None:
        self.pending = list(records)
        self.acks: list[tuple[int, Any]] = []
        self.closed = 0
        self.lock = threading.Lock()

    def client(self, config: dict[str, Any]) -> ShareClient:
        return ShareClient(self)

    def acks_of(self, offset: int) -> list[Any]:
        with self.lock:
            return [kind for o, kind in self.acks if o == offset]


class ShareClient:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def set_acknowledgement_commit_callback(self, callback: Any) -> None:
        pass

    def subscribe(self, topics: list[str]) -> None:
        pass

    def poll(self, timeout: float) -> list[Record]:
        with self.broker.lock:
            records, self.broker.pending = self.broker.pending, []
        return records

    def acknowledge(self, message: Record, kind: Any) -> None:
        with self.broker.lock:
            self.broker.acks.append((message.offset(), kind))

    def acknowledge_offset(self, topic: str, partition: int, offset: int, kind: Any) -> None:
        with self.broker.lock:
            self.broker.acks.append((offset, kind))

    def commit_sync(self, timeout: float = 60) -> dict[Any, Any]:
        return {}

    def close(self) -> None:
        with self.broker.lock:
            self.broker.closed += 1


class ShareAdmin(FakeAdmin):
    """Also describes the share group's configuration."""

    def describe_configs(self, resources: list[Any], **_: Any) -> dict[Any, Future[Any]]:
        class Entry:
            def __init__(self, value: str) -> None:
                self.value = value

        configs = {
            "share.record.lock.duration.ms": Entry("30000"),
            "share.delivery.count.limit": Entry("5"),
            "share.auto.offset.reset": Entry("earliest"),
        }
        future: Future[Any] = Future()
        future.set_result(configs)
        return {resources[0]: future}


@pytest.fixture
def cluster() -> FakeCluster:
    cluster = FakeCluster()
    cluster.create_topic(TOPIC, 1)
    cluster.create_topic(f"{TOPIC}.DLQ", 1)
    cluster.create_topic("out", 1)
    return cluster


@pytest.fixture
def started(cluster: FakeCluster) -> Iterator[Callable[..., tuple[ParallelConsumer, Broker]]]:
    made: list[ParallelConsumer] = []

    def start(
        records: list[Record], options: Options, producer: Any = None
    ) -> tuple[ParallelConsumer, Broker]:
        broker = Broker(records)
        pc = ParallelConsumer(
            {"bootstrap.servers": "fake:9092", "group.id": "g"},
            options,
            consumer_factory=broker.client,
            producer_factory=producer or cluster.producer,
            admin_factory=lambda config: ShareAdmin(cluster),
        )
        made.append(pc)
        pc.subscribe(TOPIC)
        return pc, broker

    yield start
    for pc in made:
        pc.close(timeout=5)


def _share(**options: Any) -> Options:
    return Options(group_protocol="share", ordering="unordered", **options)


def _wait(condition: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_call_past_its_deadline_is_released_and_its_late_success_is_not_accepted(
    started: Callable[..., tuple[ParallelConsumer, Broker]],
) -> None:
    finished = threading.Event()

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 1:
            time.sleep(0.6)
            finished.set()

    pc, broker = started(
        [Record(0), Record(1)], _share(processing_timeout=0.2, max_retries=3, retry_delay=0.05)
    )
    pc.poll(handle)
    _wait(lambda: broker.acks_of(1))
    assert finished.wait(5)
    time.sleep(0.2)  # (the late success reaches the engine)
    assert broker.acks_of(1) == [RELEASE]
    assert broker.acks_of(0) == [ACCEPT]


def test_a_record_waiting_for_its_retry_is_not_accepted_on_close_and_close_does_not_hang(
    started: Callable[..., tuple[ParallelConsumer, Broker]],
) -> None:
    def handle(ctx: PollContext) -> None:
        if ctx.offset == 1:
            raise ValueError("transient")

    pc, broker = started([Record(0), Record(1)], _share(max_retries=3, retry_delay=3.0))
    pc.poll(handle)
    _wait(lambda: pc.statistics().records_failed == 1 and broker.acks_of(0))
    began = time.monotonic()
    pc.close(timeout=1.0, drain=False)
    assert time.monotonic() - began < 5
    # Released explicitly, or left to the clients' close (which releases what they hold)
    assert broker.acks_of(1) in ([], [RELEASE])
    assert broker.closed == 4


def test_a_dead_lettered_record_is_accepted_only_once_its_letter_is_acknowledged(
    cluster: FakeCluster, started: Callable[..., tuple[ParallelConsumer, Broker]]
) -> None:
    producers: list[Any] = []

    def producer(config: dict[str, Any]) -> Any:
        made = cluster.producer(config)
        made.hold.set()  # (delivery reports wait)
        producers.append(made)
        return made

    def handle(ctx: PollContext) -> None:
        raise ValueError("poison")

    pc, broker = started([Record(0, delivery_count=3)], _share(max_retries=2), producer)
    pc.poll(handle)
    _wait(lambda: producers and producers[0].produced)
    time.sleep(0.2)
    assert broker.acks_of(0) == []  # the letter is written, not acknowledged yet
    producers[0].hold.clear()
    _wait(lambda: broker.acks_of(0))
    assert broker.acks_of(0) == [ACCEPT]


def test_outputs_are_acknowledged_before_their_record_is_accepted(
    cluster: FakeCluster, started: Callable[..., tuple[ParallelConsumer, Broker]]
) -> None:
    producers: list[Any] = []

    def producer(config: dict[str, Any]) -> Any:
        made = cluster.producer(config)
        made.hold.set()
        producers.append(made)
        return made

    def handle(ctx: PollContext) -> list[ProducerRecord]:
        return [ProducerRecord("out", ctx.value)]

    pc, broker = started([Record(0)], _share(), producer)
    pc.poll_and_produce(handle)
    _wait(lambda: producers and producers[0].produced)
    time.sleep(0.2)
    assert broker.acks_of(0) == []
    producers[0].hold.clear()
    _wait(lambda: broker.acks_of(0))
    assert broker.acks_of(0) == [ACCEPT]


def test_health_and_statistics_describe_a_share_group(
    started: Callable[..., tuple[ParallelConsumer, Broker]],
) -> None:
    pc, broker = started([Record(o) for o in range(10)], _share())
    pc.poll(lambda ctx: None)
    _wait(lambda: len(broker.acks) == 10)
    stats = pc.statistics()
    assert stats.records_succeeded == 10
    assert stats.lifecycle is Lifecycle.RUNNING
    report = pc.health()
    assert report.healthy, report


def test_a_pause_releases_the_records_not_started_and_the_call_running_finishes(
    started: Callable[..., tuple[ParallelConsumer, Broker]],
) -> None:
    # Given record 5 waiting for its retry, one worker busy with one of records 0-4 and the
    # other four waiting for it (in their lane or queued in the runner)
    go = threading.Event()
    running: list[int] = []

    def handle(ctx: PollContext) -> None:
        if ctx.offset == 5:
            raise ValueError("transient")
        if not running:
            running.append(ctx.offset)
            go.wait(5)

    pc, broker = started([Record(5)], _share(max_concurrency=1, max_retries=3, retry_delay=3.0))
    pc.poll(handle)
    _wait(lambda: pc.statistics().records_failed == 1)
    with broker.lock:
        broker.pending = [Record(o) for o in range(5)]
    _wait(lambda: running and pc.statistics().waiting + pc.statistics().in_flight == 5)
    # When the instance is paused (longer, say, than the records' acquisition lock)
    pc.pause()
    # Then the records not started go back to the broker at once, for other members
    [busy] = running
    others = [o for o in range(6) if o != busy]
    _wait(lambda: all(broker.acks_of(o) == [RELEASE] for o in others))
    # And the call running finishes and is accepted
    go.set()
    _wait(lambda: broker.acks_of(busy) == [ACCEPT])
    assert pc.statistics().records_succeeded == 1
    # And once resumed, the instance takes records again
    pc.resume()
    with broker.lock:
        broker.pending = [Record(o) for o in range(6, 9)]
    _wait(lambda: all(broker.acks_of(o) == [ACCEPT] for o in range(6, 9)))
