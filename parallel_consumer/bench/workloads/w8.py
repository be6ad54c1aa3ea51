"""W8: share groups (KIP-932, docs/share-groups.md): UNORDERED, a 5 ms sleep, 64 at once. On 2
partitions: this library on a share group (``pc-share``) beside the raw ``share`` loop and
``pc`` on a consumer group with the same partitions. On 1 partition, one member and then two
members of one share group: the scale-out past the partition count."""

from __future__ import annotations

from parallel_consumer.bench.model import DataSet, Row, Work
from parallel_consumer.bench.workloads.base import Scale, Workload

__all__ = ["WORKLOAD"]


def rows(scale: Scale) -> list[Row]:
    records = {"full": 20_000, "quick": 5_000, "tiny": 500}[scale]
    return [
        Row(
            workload="W8",
            label=label,
            data=DataSet(records=records * scale_up, partitions=partitions, keys=1_000),
            ordering="UNORDERED",
            concurrency=64,
            work=Work("sleep", 5),
            commit_interval=0.1,
            instances=instances,
        )
        # (Twice the records on 1 partition: a second member joins a second or so after the
        # first starts, which a short row would mostly measure.)
        for label, partitions, instances, scale_up in (
            ("UNORDERED C=64", 2, 1, 1),
            ("1 partition x1", 1, 1, 2),
            ("1 partition x2", 1, 2, 2),
        )
    ]


WORKLOAD = Workload(
    "W8", "share groups (5 ms, UNORDERED, 64 at once; 2 members on 1 partition)", rows
)
