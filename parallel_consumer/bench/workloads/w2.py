"""W2: raw per-record overhead: 200,000 records of 100 bytes on 8 partitions with 10,000 keys and
a no-op handler, KEY and UNORDERED, one record per call and batches of 100."""

from __future__ import annotations

from parallel_consumer.bench.model import DataSet, Ordering, Row, Work
from parallel_consumer.bench.workloads.base import Scale, Workload

__all__ = ["WORKLOAD"]


def rows(scale: Scale) -> list[Row]:
    records = {"full": 200_000, "quick": 20_000, "tiny": 500}[scale]
    data = DataSet(records=records, partitions=8, keys=10_000, value_size=100, seed=11)
    configs: list[tuple[Ordering, int]] = [("KEY", 1), ("UNORDERED", 1)]
    if scale == "full":
        configs += [("KEY", 100), ("UNORDERED", 100)]
    return [
        Row(
            workload="W2",
            label=ordering if batch == 1 else f"{ordering} batch=100",
            data=data,
            ordering=ordering,
            concurrency=16,
            work=Work("noop"),
            batch_size=batch,
            commit_interval=0.5,
        )
        for ordering, batch in configs
    ]


WORKLOAD = Workload("W2", "per-record overhead (no-op handler, 8 partitions)", rows)
