"""Run ``poll_and_produce`` handlers on Spark (PySpark): the same handler, ordering, retry policy
and dead-letter records as the engine, for heavy pipelines and backfills. See docs/spark.md.

Needs the ``spark`` extra (``pip install -e '.[spark]' in a clone``); importing this package
does not import pyspark (the core in :mod:`parallel_consumer.spark._core` runs without it).
"""

from __future__ import annotations

from parallel_consumer.spark._core import process as process_records
from parallel_consumer.spark._records import (
    SOURCE_ID,
    InputRecord,
    OutputRow,
    PartitionTally,
    Result,
)
from parallel_consumer.spark.jars import connector_jars
from parallel_consumer.spark.runner import (
    KIND_DEAD_LETTER,
    KIND_OUTPUT,
    KIND_SUMMARY,
    BackfillResult,
    backfill,
    process,
    run_stream,
)
from parallel_consumer.spark.session import local_session

__all__ = [
    "KIND_DEAD_LETTER",
    "KIND_OUTPUT",
    "KIND_SUMMARY",
    "SOURCE_ID",
    "BackfillResult",
    "InputRecord",
    "OutputRow",
    "PartitionTally",
    "Result",
    "backfill",
    "connector_jars",
    "local_session",
    "process",
    "process_records",
    "run_stream",
]
