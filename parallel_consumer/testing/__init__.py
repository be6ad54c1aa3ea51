"""Tools for testing code built on parallel_consumer: a real local broker and record helpers.

``LocalKafka`` starts a single-node Kafka broker; ``produce_records``, ``read_topic`` and
``create_topic`` talk to any broker by address. The pytest fixtures live in
``parallel_consumer.testing.pytest_plugin`` (loaded automatically by pytest). See
docs/local-kafka.md and docs/testing.md.
"""

from __future__ import annotations

from parallel_consumer.testing.local_kafka import (
    Capabilities,
    LocalKafka,
    LocalKafkaError,
    running_instances,
)
from parallel_consumer.testing.records import (
    TopicRecord,
    create_topic,
    produce_records,
    read_topic,
)

__all__ = [
    "Capabilities",
    "LocalKafka",
    "LocalKafkaError",
    "TopicRecord",
    "create_topic",
    "produce_records",
    "read_topic",
    "running_instances",
]
