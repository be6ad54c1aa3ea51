"""W6: async I/O fan-out: 20,000 records, an ``async def`` handler awaiting 50 ms
(``asyncio.sleep``), UNORDERED and KEY with 10,000 keys, 5,000 at once. Needs the asyncio
runner; ideal ``N·t/C``. Each row also runs on uvloop (``Options.loop_factory``; skipped
without uvloop)."""

from __future__ import annotations

from parallel_consumer.bench import features
from parallel_consumer.bench.model import DataSet, Ordering, Row, Work
from parallel_consumer.bench.workloads.base import Scale, Workload

__all__ = ["WORKLOAD"]


def rows(scale: Scale) -> list[Row]:
    records = {"full": 20_000, "quick": 5_000, "tiny": 200}[scale]
    data = DataSet(records=records, partitions=8, keys=10_000)
    configs: list[tuple[str, Ordering]] = [("UNORDERED", "UNORDERED"), ("KEY-10000", "KEY")]
    return [
        Row(
            workload="W6",
            label=f"{label} C=5000{suffix}",
            data=data,
            ordering=ordering,
            concurrency=5000,
            work=Work("async_sleep", 50),
            commit_interval=0.5,
            async_handler=True,
            runner=runner,
        )
        for suffix, runner in (("", {}), (" uvloop", {"loop_factory": "uvloop"}))
        for label, ordering in configs
    ]


WORKLOAD = Workload(
    "W6",
    "async I/O fan-out (50 ms await, 5,000 at once)",
    rows,
    requires=features.async_handlers_missing,
)
