"""Where the Kafka client's log lines and errors go (kafka/client_log.py), on a fake clock."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from parallel_consumer.kafka.client_log import PROBE_EVERY, REPEAT_AFTER, ClientLog


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _client_log() -> tuple[ClientLog, _Clock]:
    clock = _Clock()
    return ClientLog("pc-1 consumer", "127.0.0.1:1", clock=clock), clock


def _levels(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int]]:
    return [(r.name, r.levelno) for r in caplog.records]


def test_the_client_gets_this_logger_and_error_callback_and_keeps_a_users_logger():
    routed, _ = _client_log()
    users_logger = logging.getLogger("mine")

    assert routed.configure({"group.id": "g"})["logger"] is routed
    config = routed.configure({"group.id": "g", "logger": users_logger})
    assert config["logger"] is users_logger
    assert config["error_cb"] == routed.error


def test_failed_connections_and_chatter_go_to_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="parallel_consumer")
    routed, _ = _client_log()

    for _ in range(50):
        routed.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "Connect failed")
        routed.error(KafkaError(KafkaError._TRANSPORT, "Connect to 127.0.0.1:1 failed"))
    routed.log(logging.INFO, "%s [%s] %s", "CONFWARN", "rdkafka#consumer-1", "info line")

    assert {level for _, level in _levels(caplog)} == {logging.DEBUG}
    assert {name for name, _ in _levels(caplog)} == {"parallel_consumer.librdkafka"}


def test_a_repeated_client_warning_is_logged_at_its_level_once_a_while(caplog):
    caplog.set_level(logging.DEBUG, logger="parallel_consumer")
    routed, clock = _client_log()

    for _ in range(3):
        routed.log(logging.WARNING, "%s [%s] %s", "SESSTMOUT", "rdkafka#consumer-1", "late")
        routed.error(KafkaError(KafkaError._TIMED_OUT, "request timed out"))
    clock.now += REPEAT_AFTER
    routed.log(logging.WARNING, "%s [%s] %s", "SESSTMOUT", "rdkafka#consumer-1", "late")

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.name for r in warnings] == [
        "parallel_consumer.librdkafka",
        "parallel_consumer",
        "parallel_consumer.librdkafka",
    ]


def test_all_brokers_down_is_said_once_and_its_end_once(caplog):
    caplog.set_level(logging.DEBUG, logger="parallel_consumer")
    routed, clock = _client_log()

    for _ in range(3):
        routed.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert routed.down_since == 100.0
    clock.now += 7.0
    routed.reachable()
    routed.reachable()

    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert [level for level, _ in said] == [logging.WARNING, logging.INFO]
    assert "127.0.0.1:1" in said[0][1]
    assert "after 7.0s" in said[1][1]
    assert routed.down_since is None


class _Client:
    def __init__(self) -> None:
        self.up = False
        self.asked: list[str | None] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        self.asked.append(topic)
        if not self.up:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return object()


def test_while_all_brokers_are_down_a_probe_asks_for_metadata_now_and_then():
    routed, clock = _client_log()
    client = _Client()

    routed.probe(client, "t")
    assert client.asked == [], "nothing to probe while a broker answers"
    routed.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    routed.probe(client, "t")
    assert client.asked == [], "not before PROBE_EVERY"
    clock.now += PROBE_EVERY
    routed.probe(client, "t")
    routed.probe(client, "t")
    assert client.asked == ["t"]
    assert routed.down_since is not None

    client.up = True
    clock.now += PROBE_EVERY
    routed.probe(client, "t")
    assert routed.down_since is None


def test_a_users_error_callback_still_gets_every_error():
    got: list[int] = []
    routed, _ = _client_log()
    config = routed.configure({"error_cb": lambda error: got.append(error.code())})

    config["error_cb"](KafkaError(KafkaError._ALL_BROKERS_DOWN))
    config["error_cb"](KafkaError(KafkaError._TRANSPORT))

    assert got == [KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT]
