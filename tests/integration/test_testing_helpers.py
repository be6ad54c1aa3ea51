"""The blocking helpers of ``parallel_consumer.testing`` against the real broker."""

from __future__ import annotations

import uuid

import pytest

from parallel_consumer.testing import LocalKafkaError, create_topic, produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker

pytestmark = pytest.mark.timeout(120)


def test_create_topic_with_exist_ok_uses_an_existing_topic_as_it_is(kafka: KafkaBroker) -> None:
    # Given a topic with two partitions and a record in it
    name = f"exist-ok-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, name, partitions=2)
    produce_records(kafka.bootstrap_servers, name, 1, partitions=[1])
    # When it is created again
    # Then without exist_ok that is an error that names the way out
    with pytest.raises(LocalKafkaError, match="exist_ok=True"):
        create_topic(kafka.bootstrap_servers, name, partitions=2)
    # And with exist_ok the topic is returned, records and all
    assert create_topic(kafka.bootstrap_servers, name, partitions=2, exist_ok=True) == name
    # And another partition count is still an error
    with pytest.raises(LocalKafkaError, match="exists with 2 partition"):
        create_topic(kafka.bootstrap_servers, name, partitions=3, exist_ok=True)
