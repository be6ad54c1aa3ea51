"""W1: the Java library's published ordering table (its README, "Illustrative Performance
Example"): 10,000 records on 1 partition, a 0-4 ms sleep per record, 16 threads, KEY with 1 to
10,000 keys, PARTITION and UNORDERED with 20 keys."""

from __future__ import annotations

from parallel_consumer.bench.model import DataSet, Ordering, Row, Work
from parallel_consumer.bench.workloads.base import Scale, Workload

__all__ = ["JAVA_PUBLISHED", "WORKLOAD", "ordering_rows"]

#: The Java library's published W1 figures (seconds), measured elsewhere on other hardware.
JAVA_PUBLISHED = {
    "PARTITION": 22.2,
    "KEY-1": 26.7,
    "KEY-2": 13.6,
    "KEY-5": 5.9,
    "KEY-10": 3.3,
    "KEY-20": 2.24,
    "KEY-50": 2.20,
    "KEY-100": 2.18,
    "KEY-1000": 2.06,
    "KEY-10000": 2.13,
    "UNORDERED": 2.83,
}
KEY_COUNTS = (1, 2, 5, 10, 20, 50, 100, 1000, 10000)


def ordering_rows(
    workload: str,
    records: int,
    labels: list[str],
    *,
    concurrency: int,
    work: Work,
    async_handler: bool = False,
    label_suffix: str = "",
) -> list[Row]:
    """Rows named like the Java table: ``PARTITION``, ``KEY-<k>``, ``UNORDERED`` (20 keys)."""
    rows = []
    for label in labels:
        ordering: Ordering
        if label.startswith("KEY-"):
            ordering, keys = "KEY", int(label.removeprefix("KEY-"))
        else:
            ordering, keys = label, 20  # type: ignore[assignment]
        rows.append(
            Row(
                workload=workload,
                label=label + label_suffix,
                data=DataSet(records=records, partitions=1, keys=min(keys, records)),
                ordering=ordering,
                concurrency=concurrency,
                work=work,
                commit_interval=0.1,
                # The published figures are for 10,000 records: beside smaller runs they mislead.
                java_published=JAVA_PUBLISHED.get(label)
                if workload == "W1" and records == 10_000
                else None,
                async_handler=async_handler,
            )
        )
    return rows


def rows(scale: Scale) -> list[Row]:
    labels = ["PARTITION", *(f"KEY-{k}" for k in KEY_COUNTS), "UNORDERED"]
    records = 10_000
    if scale == "quick":
        labels, records = ["KEY-10", "KEY-1000", "UNORDERED"], 2_000
    elif scale == "tiny":
        labels, records = ["KEY-10", "UNORDERED"], 200
    return ordering_rows("W1", records, labels, concurrency=16, work=Work("sleep_random", 4))


WORKLOAD = Workload("W1", "the Java library's ordering table (0-4 ms sleep, 16 threads)", rows)
