"""Subscriptions that match no topic of the cluster: named once, cleared when the topic
appears, and asked about only while something is missing."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaException

from parallel_consumer.kafka.topic_check import CHECK_EVERY, MissingTopics


def test_a_misspelled_topic_is_named_once_and_cleared_when_it_appears(caplog) -> None:
    missing = MissingTopics(["orders", "ordres"])
    with caplog.at_level(logging.INFO, logger="parallel_consumer"):
        missing.observe(["orders", "payments"], now=0.0)
        missing.observe(["orders", "payments"], now=CHECK_EVERY)
        # Then one WARNING names it; something else matches, so "since" stays unset
        assert missing.missing == ("ordres",)
        assert missing.since is None
        assert caplog.text.count("'ordres' does not exist") == 1
        missing.observe(["orders", "ordres"], now=2 * CHECK_EVERY)
    assert missing.missing == ()
    assert "'ordres' exists now" in caplog.text
    # And once everything matches, the cluster is not asked again
    assert not missing.due(1e9)


def test_a_subscription_that_matches_nothing_counts_from_the_first_check() -> None:
    missing = MissingTopics(["ordres", "^pay.*"])
    missing.observe(["orders"], now=3.0)
    assert missing.missing == ("ordres", "^pay.*")
    assert missing.since == 3.0
    missing.observe(["orders"], now=8.0)
    assert missing.since == 3.0  # (still counting from the first time)
    missing.observe(["orders", "payments"], now=13.0)
    assert missing.missing == ("ordres",)
    assert missing.since is None


def test_the_check_asks_the_client_only_when_due_and_survives_an_outage() -> None:
    calls: list[float] = []

    class Client:
        down = True

        def list_topics(self, timeout: float) -> Any:
            calls.append(timeout)
            if self.down:
                raise KafkaException("all brokers down")
            return SimpleNamespace(topics={"orders": None})

    client = Client()
    missing = MissingTopics(["orders"])
    missing.check(client, now=0.0)
    missing.check(client, now=1.0)  # not due yet
    assert len(calls) == 1
    client.down = False
    missing.check(client, now=CHECK_EVERY)
    assert missing.missing == ()
    missing.check(client, now=10 * CHECK_EVERY)
    assert len(calls) == 2
