"""A subscription to a topic that does not exist (a typo) consumes nothing: ``health()`` reports
it after ``health.MISSING_TOPICS_UNHEALTHY_AFTER`` (issue 35, item 8; the bound the module
docstring of kafka/topic_check.py names)."""

from __future__ import annotations

import pytest

from parallel_consumer import health


def test_a_subscription_to_a_topic_that_does_not_exist_makes_health_unhealthy(
    harness, cluster, wait_until, monkeypatch: pytest.MonkeyPatch
):
    # Given a bound of 0.2 s, and a consumer subscribed to a topic the cluster does not have
    monkeypatch.setattr(health, "MISSING_TOPICS_UNHEALTHY_AFTER", 0.2, raising=False)
    cluster.create_topic("orders")
    pc = harness.make(topics=("ordrs",))
    pc.poll(lambda ctx: None)
    try:
        # Then the poller names it, and health() turns unhealthy, naming it
        wait_until(lambda: pc.statistics().poller.missing_topics == ("ordrs",), timeout=10)
        wait_until(lambda: not pc.health().healthy, timeout=3)
        assert any("ordrs" in reason for reason in pc.health().reasons)
    finally:
        pc.close()
