"""parallel_consumer: process Kafka records with far more concurrency than partitions.

The public API is what ``__all__`` lists; everything else is private and may change.
"""

from __future__ import annotations

from parallel_consumer.consumer import ParallelConsumer
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.errors import ConfigurationError, InternalError, ParallelConsumerError, Retry
from parallel_consumer.options import CommitMode, InvalidMetadataPolicy, Options, ProcessingOrder
from parallel_consumer.status import Lifecycle, PartitionSnapshot, Statistics

__all__ = [
    "CommitMode",
    "ConfigurationError",
    "InternalError",
    "InvalidMetadataPolicy",
    "Lifecycle",
    "Options",
    "ParallelConsumer",
    "ParallelConsumerError",
    "PartitionSnapshot",
    "PollContext",
    "ProcessingOrder",
    "RecordContext",
    "Retry",
    "Statistics",
]
