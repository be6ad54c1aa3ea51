"""parallel_consumer: process Kafka records with far more concurrency than partitions.

The public API is what ``__all__`` lists; everything else is private and may change.
"""

from __future__ import annotations

from parallel_consumer.consumer import ParallelConsumer
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.errors import (
    ConfigurationError,
    DeadlineExceeded,
    InternalError,
    ParallelConsumerError,
    PartitionStalled,
    ProduceError,
    Retry,
)
from parallel_consumer.health import HealthReport, PartitionHealth, PartitionStall
from parallel_consumer.hooks import Hooks, NoHooks, StallReport
from parallel_consumer.options import (
    CommitMode,
    InvalidMetadataPolicy,
    Options,
    ProcessingOrder,
    RunnerKind,
    StallPolicy,
)
from parallel_consumer.produce import ProduceResult, ProducerRecord
from parallel_consumer.status import Lifecycle, PartitionSnapshot, PollerStatistics, Statistics

__all__ = [
    "CommitMode",
    "ConfigurationError",
    "DeadlineExceeded",
    "HealthReport",
    "Hooks",
    "InternalError",
    "InvalidMetadataPolicy",
    "Lifecycle",
    "NoHooks",
    "Options",
    "ParallelConsumer",
    "ParallelConsumerError",
    "PartitionHealth",
    "PartitionSnapshot",
    "PartitionStall",
    "PartitionStalled",
    "PollContext",
    "PollerStatistics",
    "ProcessingOrder",
    "ProduceError",
    "ProduceResult",
    "ProducerRecord",
    "RecordContext",
    "Retry",
    "RunnerKind",
    "StallPolicy",
    "StallReport",
    "Statistics",
]
