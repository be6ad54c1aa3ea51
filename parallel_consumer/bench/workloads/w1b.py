"""W1b: W1 at high concurrency: a fixed 2.5 ms sleep, 100 threads; and 1,000 at once with an
``async def`` handler (those rows need the asyncio runner and are skipped without it), on
asyncio's own loop and, for the issue's two rows, on uvloop (``Options.loop_factory``; skipped
without uvloop)."""

from __future__ import annotations

import dataclasses

from parallel_consumer.bench.model import Row, Work
from parallel_consumer.bench.workloads.base import Scale, Workload
from parallel_consumer.bench.workloads.w1 import KEY_COUNTS, ordering_rows

__all__ = ["WORKLOAD"]

#: The async rows also run on uvloop (the issue's goal is for these two).
UVLOOP_LABELS = ("KEY-10000", "UNORDERED")


def rows(scale: Scale) -> list[Row]:
    labels = ["PARTITION", *(f"KEY-{k}" for k in KEY_COUNTS), "UNORDERED"]
    records = 10_000
    if scale == "quick":
        labels, records = ["KEY-1000", "UNORDERED"], 2_000
    elif scale == "tiny":
        labels, records = ["UNORDERED"], 200
    on_asyncio = ordering_rows(
        "W1b",
        records,
        labels,
        concurrency=1000,
        work=Work("async_sleep", 2.5),
        async_handler=True,
        label_suffix=" C=1000 async",
    )
    on_uvloop = [
        dataclasses.replace(row, label=row.label + " uvloop", runner={"loop_factory": "uvloop"})
        for row in on_asyncio
        if row.label.split(" ")[0] in UVLOOP_LABELS
    ]
    return [
        *ordering_rows(
            "W1b", records, labels, concurrency=100, work=Work("sleep", 2.5), label_suffix=" C=100"
        ),
        *on_asyncio,
        *on_uvloop,
    ]


WORKLOAD = Workload("W1b", "W1 at high concurrency (2.5 ms; 100 threads, 1,000 async)", rows)
