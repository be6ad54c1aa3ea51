"""W5: CPU-bound handlers (the fraud-model scenario): 20,000 records, ~1 ms of pure-Python CPU
per record, KEY order with 1,000 keys; the thread runner against the process runner (one process
per core). The process row needs ``Options(runner="process", processes=N)``."""

from __future__ import annotations

import os

from parallel_consumer.bench.model import DataSet, Row, Work
from parallel_consumer.bench.workloads.base import Scale, Workload

__all__ = ["WORKLOAD"]


def rows(scale: Scale) -> list[Row]:
    records = {"full": 20_000, "quick": 2_000, "tiny": 200}[scale]
    data = DataSet(records=records, partitions=4, keys=1_000)
    cores = os.cpu_count() or 1
    common = {"data": data, "ordering": "KEY", "work": Work("cpu", 1.0), "commit_interval": 0.5}
    return [
        Row(workload="W5", label="KEY threads C=16", concurrency=16, **common),  # type: ignore[arg-type]
        Row(
            workload="W5",
            label=f"KEY process x{cores}",
            concurrency=cores,
            runner={"runner": "process", "processes": cores},
            **common,  # type: ignore[arg-type]
        ),
    ]


WORKLOAD = Workload("W5", "CPU-bound handlers: threads against processes", rows)
