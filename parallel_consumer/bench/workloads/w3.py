"""W3: pyrallel-consumer's published sample: 2,000 records on 4 partitions, 100 round-robin
keys, a 5 ms sleep, KEY order, 100 at once. Reported also on a start-inclusive clock (start-up
plus wall), the way that sample measures."""

from __future__ import annotations

from parallel_consumer.bench.model import DataSet, Row, Work
from parallel_consumer.bench.workloads.base import Scale, Workload

__all__ = ["WORKLOAD"]


def rows(scale: Scale) -> list[Row]:
    records = {"full": 2_000, "quick": 2_000, "tiny": 200}[scale]
    return [
        Row(
            workload="W3",
            label="KEY-100 C=100",
            data=DataSet(records=records, partitions=4, keys=100, key_mode="round_robin"),
            ordering="KEY",
            concurrency=100,
            work=Work("sleep", 5),
            commit_interval=0.1,
        )
    ]


WORKLOAD = Workload("W3", "pyrallel-consumer's sample (5 ms, 100 keys, 4 partitions)", rows)
