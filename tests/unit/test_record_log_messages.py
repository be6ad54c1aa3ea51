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
