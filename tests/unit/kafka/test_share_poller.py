"""The share poller with fake ShareConsumer clients: which client is polled, what is released
at once, where each acknowledgement goes, and a broker without share groups."""

from __future__ import annotations

import queue
import time
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, KafkaError, KafkaException

from parallel_consumer import ConfigurationError
from parallel_consumer._events import (
    Acknowledge,
    PartitionsAssigned,
    PollerFailed,
    RecordsPolled,
    Release,
    SetPaused,
    StopPoller,
)
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


class FakeShareConsumer:
    """Hands out the batches queued in ``polls`` and records the acknowledgements."""

    def __init__(self, config: dict[str, Any]) -> None:
        if "enable.auto.commit" in config:
            raise KafkaException("`enable.auto.commit` is not applicable for share consumer")
        self.config = config
        self.polls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.acks: list[tuple[int, int, Any]] = []
        self.polled = 0
        self.closed = False
        #: The acknowledgements made so far, at each commit_sync.
        self.committed: list[list[tuple[int, int, Any]]] = []

    def set_acknowledgement_commit_callback(self, callback: Any) -> None:
        self.callback = callback

    def subscribe(self, topics: list[str]) -> None:
        self.topics = topics

    def poll(self, timeout: float) -> list[Any]:
        self.polled += 1
        try:
            batch = self.polls.get_nowait()
        except queue.Empty:
            return []
        if isinstance(batch, BaseException):
            raise batch
        return batch  # type: ignore[no-any-return]

    def acknowledge(self, message: Any, ack_type: Any) -> None:
        self.acks.append((message.partition(), message.offset(), ack_type))

    def acknowledge_offset(self, topic: str, partition: int, offset: int, ack_type: Any) -> None:
        self.acks.append((partition, offset, ack_type))

    def commit_sync(self, timeout: float = 60) -> dict[Any, Any]:
        self.committed.append(list(self.acks))
        return {}

    def close(self) -> None:
        self.closed = True


def _poller(limit: int = 1000, clients: int = 2) -> tuple[SharePoller, list[Any], list[Any]]:
    made: list[FakeShareConsumer] = []
    events: list[Any] = []

    def factory(config: dict[str, Any]) -> FakeShareConsumer:
        client = FakeShareConsumer(config)
        made.append(client)
        return client

    poller = SharePoller(
        factory,
        {"bootstrap.servers": "x:1", "group.id": "g", "enable.auto.commit": False},
        post=events.append,
        limit=limit,
        fetch_batch=10,
        clients=clients,
    )
    poller.subscribe(["t"])
    return poller, made, events


def _wait(condition: Any) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_consumer_group_settings_are_dropped_and_acknowledgements_are_explicit() -> None:
    _, made, _ = _poller()
    assert all("enable.auto.commit" not in c.config for c in made)
    assert all(c.config["share.acknowledgement.mode"] == "explicit" for c in made)


def test_records_are_handed_over_and_each_acknowledgement_goes_to_the_client_that_holds_it() -> (
    None
):
    poller, (first, second), events = _poller()
    first.polls.put([Record(0, 1), Record(0, 2)])
    second.polls.put([Record(1, 7)])
    poller.start()
    try:
        _wait(lambda: sum(isinstance(e, RecordsPolled) for e in events) == 2)
        [assigned] = [e for e in events if isinstance(e, PartitionsAssigned)][:1]
        assert assigned.assignments[0].shared
        polled = first.polled
        time.sleep(0.05)
        assert first.polled == polled  # it has records out: not polled again
        poller.send(Acknowledge(((("t", 0), 1, True), (("t", 1), 7, False))))
        poller.send(Release(2))
        _wait(lambda: len(first.acks) == 1 and len(second.acks) == 1)
        assert first.acks == [(0, 1, AcknowledgeType.ACCEPT)]
        assert second.acks == [(1, 7, AcknowledgeType.RELEASE)]
        poller.send(Acknowledge(((("t", 0), 2, True),)))
        _wait(lambda: first.polled > polled)  # all of its records acknowledged: polled again
    finally:
        poller.send(StopPoller())
        assert poller.join(5)
    assert first.closed
    assert second.closed


def test_records_beyond_the_credit_wait_for_it_and_are_not_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a poll of 5 records with credit for 3 (the broker hands out whole batches)
    monkeypatch.setattr(poller_module, "SURPLUS_HOLD", 60.0)
    poller, (client,), events = _poller(limit=3, clients=1)
    client.polls.put([Record(0, o) for o in range(5)])
    client.polls.put([Record(0, 9)])
    poller.start()
    try:
        _wait(lambda: any(isinstance(e, RecordsPolled) for e in events))
        assert poller.statistics().held == 3
        # When the engine finishes the first 3
        poller.send(Acknowledge(tuple((("t", 0), o, True) for o in range(3))))
        poller.send(Release(3))
        # Then the other 2 follow, unreleased (a release raises their delivery count, which is
        # their attempt count), and the client polls again only once they are acknowledged
        _wait(lambda: sum(isinstance(e, RecordsPolled) for e in events) == 2)
        polls = [e for e in events if isinstance(e, RecordsPolled)]
        assert [[m.offset() for m in p.batches[("t", 0)][1]] for p in polls] == [[0, 1, 2], [3, 4]]
        assert [kind for _, _, kind in client.acks] == [AcknowledgeType.ACCEPT] * 3
        polled = client.polled
        time.sleep(0.05)
        assert client.polled == polled
    finally:
        poller.send(StopPoller())
        assert poller.join(5)


def test_records_beyond_the_credit_are_released_once_they_waited_the_surplus_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(poller_module, "SURPLUS_HOLD", 0.05)
    poller, (client,), events = _poller(limit=3, clients=1)
    client.polls.put([Record(0, o) for o in range(5)])
    poller.start()
    try:
        _wait(lambda: any(isinstance(e, RecordsPolled) for e in events))
        [polled] = [e for e in events if isinstance(e, RecordsPolled)]
        assert [m.offset() for m in polled.batches[("t", 0)][1]] == [0, 1, 2]
        _wait(lambda: len(client.acks) == 2)
        assert client.acks == [(0, 3, AcknowledgeType.RELEASE), (0, 4, AcknowledgeType.RELEASE)]
        assert poller.statistics().held == 3
        assert poller.released_surplus == 2
    finally:
        poller.send(StopPoller())
        assert poller.join(5)


def test_records_beyond_the_credit_are_released_on_close() -> None:
    poller, (client,), events = _poller(limit=3, clients=1)
    client.polls.put([Record(0, o) for o in range(5)])
    poller.start()
    _wait(lambda: any(isinstance(e, RecordsPolled) for e in events))
    poller.send(StopPoller())
    assert poller.join(5)
    assert client.acks == [(0, 3, AcknowledgeType.RELEASE), (0, 4, AcknowledgeType.RELEASE)]
    assert client.closed


def test_a_broker_without_share_groups_fails_with_an_error_that_says_so() -> None:
    poller, (client,), events = _poller(clients=1)
    refused = KafkaError(KafkaError.UNSUPPORTED_VERSION, "ShareGroupHeartbeat fatal error", True)
    client.polls.put(KafkaException(refused))
    poller.start()
    assert poller.join(5)
    [failed] = [e for e in events if isinstance(e, PollerFailed)]
    assert isinstance(failed.error, ConfigurationError)
    assert "the broker has no share groups" in str(failed.error)


def test_rebalance_callbacks_are_refused() -> None:
    poller, _, _ = _poller()
    with pytest.raises(ConfigurationError, match="no partition assignment"):
        poller.subscribe(["t"], on_assign=lambda c, p: None)
    poller.close_unstarted()


def test_acknowledgements_go_to_the_broker_while_polling_is_paused() -> None:
    # Given a client whose one record the engine accepts while every partition is paused
    poller, (client,), events = _poller(clients=1)
    client.polls.put([Record(0, 1)])
    poller.start()
    try:
        _wait(lambda: any(isinstance(e, RecordsPolled) for e in events))
        poller.send(SetPaused(frozenset({("t", 0)})))
        poller.send(Acknowledge(((("t", 0), 1, True),)))
        # Then the acceptance is sent without a poll (one would carry it, but none comes while
        # paused; past the record's lock the broker would hand it to another member again)
        _wait(lambda: client.committed == [[(0, 1, AcknowledgeType.ACCEPT)]])
        polled = client.polled
        time.sleep(0.05)
        assert client.polled == polled
    finally:
        poller.send(StopPoller())
        assert poller.join(5)


def test_acknowledgements_of_a_poll_with_a_slow_record_go_to_the_broker_before_it_ends() -> None:
    # Given a client that polled two records, one finished and one still running
    poller, (client,), events = _poller(clients=1)
    client.polls.put([Record(0, 1), Record(0, 2)])
    poller.start()
    try:
        _wait(lambda: any(isinstance(e, RecordsPolled) for e in events))
        poller.send(Acknowledge(((("t", 0), 1, True),)))
        # Then the finished one's acceptance is sent while the other still runs
        _wait(lambda: client.committed == [[(0, 1, AcknowledgeType.ACCEPT)]])
    finally:
        poller.send(StopPoller())
        assert poller.join(5)


def test_released_surplus_goes_to_the_broker_while_the_client_still_has_records_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a poll of 5 records with credit for 3, the engine still busy with its 3
    monkeypatch.setattr(poller_module, "SURPLUS_HOLD", 0.05)
    monkeypatch.setattr(poller_module, "ACK_FLUSH_AFTER", 0.05)
    poller, (client,), _ = _poller(limit=3, clients=1)
    client.polls.put([Record(0, o) for o in range(5)])
    poller.start()
    try:
        # Then the 2 released once they waited are sent to the broker, for other members,
        # without waiting for the client's next poll (which waits for the other 3)
        released = [(0, 3, AcknowledgeType.RELEASE), (0, 4, AcknowledgeType.RELEASE)]
        _wait(lambda: client.committed == [released])
    finally:
        poller.send(StopPoller())
        assert poller.join(5)
