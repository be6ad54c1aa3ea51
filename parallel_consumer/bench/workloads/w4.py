"""W4: the Java library's very-large-volume test: 1,000,000 records with unique keys on 1
partition, KEY order, ``poll_and_produce`` of every record to an output topic, no sleep;
periodic consumer commits and the transactional mode. Needs ``poll_and_produce``."""

from __future__ import annotations

from parallel_consumer.bench import features
from parallel_consumer.bench.model import DataSet, Row, Work
from parallel_consumer.bench.workloads.base import Scale, Workload

__all__ = ["WORKLOAD"]


def rows(scale: Scale) -> list[Row]:
    records = {"full": 1_000_000, "quick": 50_000, "tiny": 500}[scale]
    data = DataSet(records=records, partitions=1, keys=records, key_mode="unique")
    return [
        Row(
            workload="W4",
            label=f"KEY produce {mode or 'async commits'}",
            data=data,
            ordering="KEY",
            concurrency=1000,
            work=Work("noop"),
            commit_interval=1.0,
            produce=mode,
        )
        for mode in ("", "PERIODIC_TRANSACTIONAL_PRODUCER")
    ]


WORKLOAD = Workload(
    "W4",
    "very large volume with poll_and_produce (unique keys, no sleep)",
    rows,
    requires=features.poll_and_produce_missing,
)
