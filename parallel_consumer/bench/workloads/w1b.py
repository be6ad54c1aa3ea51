"""W1b: W1 at high concurrency: a fixed 2.5 ms sleep, 100 threads; and 1,000 at once with an
``async def`` handler (those rows need the asyncio runner and are skipped without it)."""

from __future__ import annotations

from parallel_consumer.bench.model import Row, Work
from parallel_consumer.bench.workloads.base import Scale, Workload
from parallel_consumer.bench.workloads.w1 import KEY_COUNTS, ordering_rows

__all__ = ["WORKLOAD"]


def rows(scale: Scale) -> list[Row]:
    labels = ["PARTITION", *(f"KEY-{k}" for k in KEY_COUNTS), "UNORDERED"]
    records = 10_000
    if scale == "quick":
        labels, records = ["KEY-1000", "UNORDERED"], 2_000
    elif scale == "tiny":
        labels, records = ["UNORDERED"], 200
    return [
        *ordering_rows(
            "W1b", records, labels, concurrency=100, work=Work("sleep", 2.5), label_suffix=" C=100"
        ),
        *ordering_rows(
            "W1b",
            records,
            labels,
            concurrency=1000,
            work=Work("async_sleep", 2.5),
            async_handler=True,
            label_suffix=" C=1000 async",
        ),
    ]


WORKLOAD = Workload("W1b", "W1 at high concurrency (2.5 ms; 100 threads, 1,000 async)", rows)
