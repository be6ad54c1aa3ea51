"""W7: share groups (KIP-932, docs/share-groups.md): UNORDERED, a 5 ms sleep, 64 at once, on 2
partitions: this library on a share group (``pc-share``) beside the raw ``share`` loop and
``pc`` on a consumer group with the same partitions."""

from __future__ import annotations

from parallel_consumer.bench.model import DataSet, Row, Work
from parallel_consumer.bench.workloads.base import Scale, Workload

__all__ = ["WORKLOAD"]


def rows(scale: Scale) -> list[Row]:
    records = {"full": 20_000, "quick": 5_000, "tiny": 500}[scale]
    return [
        Row(
            workload="W7",
            label="UNORDERED C=64",
            data=DataSet(records=records, partitions=2, keys=1_000),
            ordering="UNORDERED",
            concurrency=64,
            work=Work("sleep", 5),
            commit_interval=0.1,
        )
    ]


WORKLOAD = Workload("W7", "share groups (5 ms, UNORDERED, 64 at once, 2 partitions)", rows)
