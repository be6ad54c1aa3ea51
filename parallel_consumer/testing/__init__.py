"""Tools for testing code built on parallel_consumer: fakes, a real local broker, record helpers.

``FakeCluster``/``FakeConsumer`` and ``FakeClock`` run a ParallelConsumer in memory with time
under the test's control (``ParallelConsumer(config, consumer_factory=cluster.consumer,
clock=clock)``).

``LocalKafka`` starts a single-node Kafka broker; ``produce_records``, ``read_topic`` and
``create_topic`` talk to any broker by address. The pytest fixtures live in
``parallel_consumer.testing.pytest_plugin`` (loaded automatically by pytest). See
docs/local-kafka.md and docs/testing.md.
"""

from __future__ import annotations

from parallel_consumer.testing.clock import FakeClock
from parallel_consumer.testing.fakes import FakeCluster, FakeConsumer
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
    "FakeClock",
    "FakeCluster",
    "FakeConsumer",
    "LocalKafka",
    "LocalKafkaError",
    "TopicRecord",
    "create_topic",
    "produce_records",
    "read_topic",
    "running_instances",
]
