"""parallel_consumer: process Kafka records with far more concurrency than partitions."""

from __future__ import annotations

from parallel_consumer.errors import ConfigurationError, InternalError, ParallelConsumerError, Retry

__all__ = [
    "ConfigurationError",
    "InternalError",
    "ParallelConsumerError",
    "Retry",
]
