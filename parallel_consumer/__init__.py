"""parallel_consumer: process Kafka records with far more concurrency than partitions.

The public API is what ``__all__`` lists; everything else is private and may change.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from parallel_consumer._aio import AsyncParallelConsumer
from parallel_consumer.consumer import ParallelConsumer
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.errors import (
    ConfigurationError,
    DeadLetter,
    DeadlineExceeded,
    InternalError,
    InvalidOutput,
    ParallelConsumerError,
    PartitionStalled,
    ProduceError,
    RetriesExhausted,
    Retry,
    SerializationError,
    Skip,
)
from parallel_consumer.health import HealthReport, PartitionHealth, PartitionStall
from parallel_consumer.hooks import Hooks, NoHooks, StallReport
from parallel_consumer.options import (
    CommitMode,
    GroupProtocol,
    InvalidMetadataPolicy,
    OnExhausted,
    Options,
    ProcessingOrder,
    RunnerKind,
    StallPolicy,
)
from parallel_consumer.produce import ProduceResult, ProducerRecord
from parallel_consumer.retry import exponential_backoff
from parallel_consumer.status import (
    Lifecycle,
    PartitionSnapshot,
    PartitionTotals,
    PollerStatistics,
    Statistics,
)

try:
    #: The installed distribution's version (``pip install`` reads it from pyproject.toml).
    __version__ = _version("parallel-consumer")
except _PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AsyncParallelConsumer",
    "CommitMode",
    "ConfigurationError",
    "DeadLetter",
    "DeadlineExceeded",
    "GroupProtocol",
    "HealthReport",
    "Hooks",
    "InternalError",
    "InvalidMetadataPolicy",
    "InvalidOutput",
    "Lifecycle",
    "NoHooks",
    "OnExhausted",
    "Options",
    "ParallelConsumer",
    "ParallelConsumerError",
    "PartitionHealth",
    "PartitionSnapshot",
    "PartitionStall",
    "PartitionStalled",
    "PartitionTotals",
    "PollContext",
    "PollerStatistics",
    "ProcessingOrder",
    "ProduceError",
    "ProduceResult",
    "ProducerRecord",
    "RecordContext",
    "RetriesExhausted",
    "Retry",
    "RunnerKind",
    "SerializationError",
    "Skip",
    "StallPolicy",
    "StallReport",
    "Statistics",
    "exponential_backoff",
]
