"""The share poller driven by hand (its thread not started) over fake ShareConsumer clients,
through any interleaving of polls, acknowledgements, returned credit and time: a client is
never polled with records of its last poll unacknowledged, each acquired record is acknowledged
exactly once and by the client that acquired it, the engine never holds more than the credit,
and every record reaches the engine or is released (kafka/share/poller.py)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any
from unittest import mock

from confluent_kafka import AcknowledgeType
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_consumer._events import Acknowledge, RecordsPolled, Release
from parallel_consumer.kafka.share import poller as poller_module
from parallel_consumer.kafka.share.poller import SharePoller


class Record:
    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Client:
    """A ShareConsumer that refuses what the real one refuses: a poll with records of the last
    one unacknowledged, an acknowledgement of a record it does not hold."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.acquired: set[tuple[int, int]] = set()
        self.polls = 0

    def set_acknowledgement_commit_callback(self, callback: Any) -> None:
        pass

    def subscribe(self, topics: list[str]) -> None:
        pass

    def poll(self, timeout: float) -> list[Record]:
        assert not self.acquired, f"polled with {sorted(self.acquired)} unacknowledged"
        self.polls += 1
        size = self.world.sizes.pop(0) if self.world.sizes else 0
        records = []
        for _ in range(size):
            partition = next(self.world.partitions)
            offset = self.world.next_offset[partition]
            self.world.next_offset[partition] += 1
            records.append(Record(partition, offset))
            self.acquired.add((partition, offset))
            self.world.acquisitions[(partition, offset)] += 1
        return records

    def _ack(self, partition: int, offset: int, kind: Any) -> None:
        key = (partition, offset)
        assert key in self.acquired, f"{key} acknowledged by a client that does not hold it"
        self.acquired.discard(key)
        self.world.acks.setdefault(key, []).append(kind)

    def acknowledge(self, message: Record, kind: Any) -> None:
        self._ack(message.partition(), message.offset(), kind)

    def acknowledge_offset(self, topic: str, partition: int, offset: int, kind: Any) -> None:
        self._ack(partition, offset, kind)

    def commit_sync(self, timeout: float = 60) -> dict[Any, Any]:
        return {}

    def close(self) -> None:
        pass


class World:
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.partitions = itertools.cycle([0, 1, 1])
        self.next_offset = {0: 0, 1: 0}
        self.acquisitions: Counter[tuple[int, int]] = Counter()
        self.acks: dict[tuple[int, int], list[Any]] = {}


STEPS = st.lists(
    st.one_of(
        st.just(("poll", 0)),
        st.tuples(st.just("finish"), st.integers(1, 30)),
        st.tuples(st.just("wait"), st.sampled_from([0.5, 2.0, 6.0])),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), max_size=20),
    limit=st.integers(4, 30),
    clients=st.integers(1, 4),
    steps=STEPS,
    accept=st.lists(st.booleans(), min_size=1, max_size=30),
)
def test_every_acquired_record_is_acknowledged_once_by_its_client(
    sizes: list[int], limit: int, clients: int, steps: list[Any], accept: list[bool]
) -> None:
    world = World(sizes)
    world.acks = {}
    clock = Clock()
    events: list[Any] = []
    made: list[Client] = []

    def factory(config: dict[str, Any]) -> Client:
        made.append(Client(world))
        return made[-1]

    with mock.patch.object(poller_module, "time", clock):
        poller = SharePoller(
            factory,
            {"bootstrap.servers": "x:1", "group.id": "g"},
            post=events.append,
            limit=limit,
            fetch_batch=2,
            clients=clients,
        )
        engine: list[tuple[tuple[str, int], int]] = []  # records the engine holds
        handed: Counter[tuple[int, int]] = Counter()
        decide = itertools.cycle(accept)

        def take_events() -> None:
            for event in events:
                if isinstance(event, RecordsPolled):
                    for tp, (_, messages) in event.batches.items():
                        for m in messages:
                            engine.append((tp, m.offset()))
                            handed[(tp[1], m.offset())] += 1
            events.clear()
            assert len(engine) <= limit, (len(engine), limit)

        def finish(count: int) -> None:
            done, engine[:] = engine[:count], engine[count:]
            if done:
                poller._run_command(
                    Acknowledge(tuple((tp, offset, next(decide)) for tp, offset in done))
                )
                poller._run_command(Release(len(done)))

        for step, value in steps:
            if step == "poll":
                poller._poll_once()
            elif step == "finish":
                finish(value)
            else:
                clock.now += value
            poller._flush_acknowledgements()
            take_events()
        # Then, with the engine finishing everything and time passing, all ends acknowledged
        for _ in range(200):
            finish(len(engine))
            clock.now += 1.0
            poller._poll_once()
            take_events()
            if not engine and not poller._surplus and world.sizes == []:
                break
        finish(len(engine))
    for key, count in world.acquisitions.items():
        assert len(world.acks.get(key, [])) == count, (key, world.acks.get(key))
        released = world.acks[key].count(AcknowledgeType.RELEASE)
        # a record never handed to the engine was released (as surplus), never accepted
        if not handed[key]:
            assert released == count, (key, world.acks[key])
    assert all(not c.acquired for c in made)
