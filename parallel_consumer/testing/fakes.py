"""In-memory test doubles: a fake Kafka cluster and a consumer with confluent-kafka's interface.

For fast unit tests of the engine and of user handlers; integration tests use :class:`LocalKafka`.
The fake consumer implements only what ParallelConsumer uses (subscribe with rebalance
callbacks, consume, commit with the ``on_commit`` callback, committed, pause, resume,
list_topics, close) and hands out real ``confluent_kafka.Message`` objects. Group membership is
explicit: the first ``consume()`` assigns every partition of the subscribed topics, and
:meth:`FakeConsumer.rebalance` revokes or assigns partitions on the next ``consume()``.
:meth:`FakeCluster.brokers_down` takes every broker away (the consumer reports
``_ALL_BROKERS_DOWN`` to its ``error_cb`` once) until :meth:`FakeCluster.brokers_up`.

The clients live in ``_fake_consumer.py`` and ``_fake_producer.py``, the cluster's data in
``_fake_topics.py``; import them from here.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Message as Message

from parallel_consumer.testing._fake_consumer import FakeConsumer
from parallel_consumer.testing._fake_producer import FakeAdmin, FakeProducer
from parallel_consumer.testing._fake_topics import FakeTopics

__all__ = ["FakeAdmin", "FakeCluster", "FakeConsumer", "FakeProducer"]


class FakeCluster(FakeTopics):
    """Topics (lists of records per partition), committed offsets per group and whether the
    brokers are reachable (see :class:`FakeTopics`), and the fake clients over them. Thread-safe."""

    def admin(self, config: dict[str, Any]) -> FakeAdmin:
        """An admin client for ``ParallelConsumer(admin_factory=...)``."""
        return FakeAdmin(self)

    def producer(self, config: dict[str, Any]) -> FakeProducer:
        """A producer writing to this cluster (for ``ParallelConsumer(producer_factory=...)``)."""
        return FakeProducer(self, config)

    def consumer(self, config: dict[str, Any]) -> FakeConsumer:
        """A consumer factory: ``ParallelConsumer(config, consumer_factory=cluster.consumer)``."""
        return FakeConsumer(self, config)
