"""Record-level log messages name the record: ``topic[partition]@offset``."""

from __future__ import annotations

import logging

import pytest

from parallel_consumer import Options, RecordContext
from parallel_consumer.retry import retry_delay
from parallel_consumer.testing.fakes import Message


@pytest.mark.parametrize(
    "provider", [lambda record: 1 / 0, lambda record: -5.0], ids=["raises", "negative"]
)
def test_a_broken_retry_delay_provider_is_logged_with_the_record(provider, caplog):
    record = RecordContext(Message(topic="orders", partition=3, offset=41), attempts=1)
    options = Options(retry_delay=2.0, retry_delay_provider=provider)
    with caplog.at_level(logging.WARNING, logger="parallel_consumer"):
        assert retry_delay(options, ValueError("x"), record) == 2.0
    assert "orders[3]@41" in caplog.text


def test_a_handler_raising_system_exit_is_logged_with_its_record(caplog):
    import queue

    from parallel_consumer._clock import SystemClock
    from parallel_consumer.context import PollContext
    from parallel_consumer.runners.threads import ThreadRunner

    def handler(ctx: PollContext) -> None:
        raise SystemExit(3)

    events: queue.SimpleQueue[object] = queue.SimpleQueue()
    runner = ThreadRunner(1, SystemClock(), name="logs")
    runner.start(handler, events.put)
    try:
        with caplog.at_level(logging.ERROR, logger="parallel_consumer"):
            message = Message(topic="orders", partition=2, offset=7)
            runner.submit(1, PollContext([RecordContext(message)]))
            events.get(timeout=10)
    finally:
        assert runner.stop(5.0)
    assert "orders[2]@7" in caplog.text
