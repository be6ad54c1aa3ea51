"""Every broker down, on the fakes: one WARNING, ``health()`` unhealthy after the bound, one INFO
and healthy again once a broker answers."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest

from parallel_consumer import ParallelConsumer, PollContext
from parallel_consumer import health as health_module
from parallel_consumer.kafka import client_log as client_log_module
from parallel_consumer.testing.fakes import FakeCluster


def _wait_until(condition: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def _messages(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == level and r.name.startswith("parallel_consumer") and text in r.getMessage()
    ]


def test_all_brokers_down_is_logged_once_and_makes_health_unhealthy_until_one_answers(
    monkeypatch, caplog
):
    # (the bound and the probe interval scaled down from 15 s and 1 s)
    monkeypatch.setattr(health_module, "BROKERS_DOWN_UNHEALTHY_AFTER", 0.3)
    monkeypatch.setattr(client_log_module, "PROBE_EVERY", 0.05)
    caplog.set_level(logging.INFO, logger="parallel_consumer")
    # Given a consumer that processed a record
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    cluster.produce("t", b"0")
    seen: list[int] = []
    pc = ParallelConsumer(
        {"bootstrap.servers": "fake:9092", "group.id": "g"}, consumer_factory=cluster.consumer
    )
    pc.subscribe(["t"])

    def handle(ctx: PollContext) -> None:
        seen.append(ctx.offset)

    pc.poll(handle)
    try:
        _wait_until(lambda: seen == [0], "the first record")
        assert pc.health().healthy
        assert pc.statistics().poller.brokers_down_for is None

        # When every broker goes down for longer than the bound
        cluster.brokers_down()
        _wait_until(lambda: not pc.health().healthy, "an unhealthy report")

        # Then health() says why, the statistics say since when, and one WARNING was logged
        report = pc.health()
        assert report.brokers_down_for is not None
        assert report.brokers_down_for >= 0.3
        assert any("every Kafka broker down" in reason for reason in report.reasons)
        assert (pc.statistics().poller.brokers_down_for or 0.0) >= 0.3
        _wait_until(
            lambda: (pc.statistics().poller.brokers_down_for or 0.0) > 0.6,
            "more turns of the poller while down",
        )
        assert len(_messages(caplog, logging.WARNING, "every Kafka broker is down")) == 1

        # When a broker answers again
        cluster.brokers_up()
        _wait_until(lambda: pc.health().healthy, "a healthy report")

        # Then one INFO says so, and records flow again
        assert len(_messages(caplog, logging.INFO, "a broker answers again")) == 1
        assert pc.statistics().poller.brokers_down_for is None
        cluster.produce("t", b"1")
        _wait_until(lambda: seen == [0, 1], "the next record")
    finally:
        pc.close()
    assert len(_messages(caplog, logging.WARNING, "every Kafka broker is down")) == 1


def test_a_short_outage_never_makes_health_unhealthy(monkeypatch):
    monkeypatch.setattr(client_log_module, "PROBE_EVERY", 0.05)
    cluster = FakeCluster()
    cluster.create_topic("t", 1)
    pc = ParallelConsumer(
        {"bootstrap.servers": "fake:9092", "group.id": "g"}, consumer_factory=cluster.consumer
    )
    pc.subscribe(["t"])
    pc.poll(lambda ctx: None)
    try:
        cluster.brokers_down()
        _wait_until(lambda: pc.statistics().poller.brokers_down_for is not None, "the outage")
        assert pc.health().healthy, "within BROKERS_DOWN_UNHEALTHY_AFTER"
        cluster.brokers_up()
        _wait_until(lambda: pc.statistics().poller.brokers_down_for is None, "its end")
        assert pc.health().healthy
    finally:
        pc.close()
