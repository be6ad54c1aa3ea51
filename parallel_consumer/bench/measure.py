"""Turn an observation into figures on the docs/benchmarks.md clock, and check it: pure functions.

The clock runs from the first record handed to the handler to the moment the broker acknowledged
the commit of the last offset of every partition; start-up (group join, first fetch) is reported
apart. The ideal of a row is computed from the service times the handler measured, so the
overshoot of the sleep primitive counts as work, not as framework overhead (docs/benchmarks.md):

* UNORDERED: ``S / C``
* KEY: ``max(max_key S_key, S / min(C, keys))``
* PARTITION: ``max(max_partition S_p, S / min(C, partitions))``

with ``S`` the summed service time and ``C`` the concurrency; ``c = (wall - ideal) / N``.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from parallel_consumer.bench.model import Observation, Ordering, Row

__all__ = [
    "Measurement",
    "Summary",
    "ideal_time",
    "lane_of",
    "measure",
    "order_kept",
    "summarise",
]

LogEntry = tuple[int, Any, int, float]


@dataclass(frozen=True)
class Measurement:
    """One run of one contestant on one row."""

    records: int
    wall: float
    startup: float
    ideal: float
    duplicates: int
    missing: int
    order_ok: bool
    service_total: float
    #: What the contestant reported beside the log (Observation.extra: this library's
    #: statistics, a peer's version or clock), kept in the result file.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.wall / self.ideal if self.ideal > 0 else float("nan")

    @property
    def records_per_s(self) -> float:
        return self.records / self.wall if self.wall > 0 else float("inf")

    @property
    def c_us(self) -> float:
        """Per-record framework cost: what the wall has above the ideal, per record (µs)."""
        return max(0.0, (self.wall - self.ideal) / self.records * 1e6) if self.records else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "ratio": self.ratio,
            "records_per_s": self.records_per_s,
            "c_us": self.c_us,
        }


def lane_of(partition: int, key: Any, offset: int, ordering: Ordering) -> object:
    """What a record may not run concurrently with: its key, its partition, or nothing."""
    if ordering == "KEY":
        return (partition, key)
    if ordering == "PARTITION":
        return partition
    return (partition, offset)


def lanes(log: Iterable[LogEntry], ordering: Ordering) -> dict[object, list[LogEntry]]:
    """The log split by what may not run concurrently: key, partition, or each record alone."""
    out: dict[object, list[LogEntry]] = defaultdict(list)
    for entry in log:
        partition, key, offset, _ = entry
        out[lane_of(partition, key, offset, ordering)].append(entry)
    return out


def ideal_time(log: Sequence[LogEntry], ordering: Ordering, concurrency: int) -> float:
    """The shortest wall any engine could reach with these measured service times."""
    if not log:
        return 0.0
    total = sum(entry[3] for entry in log)
    if ordering == "UNORDERED":
        return total / concurrency
    per_lane = [sum(e[3] for e in entries) for entries in lanes(log, ordering).values()]
    return max(max(per_lane), total / min(concurrency, len(per_lane)))


def cpu_ideal(row: Row, records: int) -> float:
    """CPU-bound rows: the work spread over the cores (``N·cpu/cores``). Measured
    service times would not do: under the GIL a thread's record takes longer than its work."""
    usable = min(row.concurrency, os.cpu_count() or 1)
    return records * row.work.ms / 1000 / usable


def order_kept(log: Sequence[LogEntry], ordering: Ordering) -> bool:
    """Each lane (key, or partition) finished its offsets in increasing order. A lane runs one
    record at a time, so the order of the log is the order of processing. Replays of a record
    (duplicates) are ignored: only first completions count."""
    if ordering == "UNORDERED":
        return True
    for entries in lanes(log, ordering).values():
        seen: set[int] = set()
        last = -1
        for _, _, offset, _ in entries:
            if offset in seen:
                continue
            seen.add(offset)
            if offset < last:
                return False
            last = offset
    return True


def measure(row: Row, observation: Observation, ends: Mapping[int, int]) -> Measurement:
    """Figures and checks of one run; ``ends`` is each partition's end offset (data from 0)."""
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for partition, _, offset, _ in observation.log:
        counts[(partition, offset)] += 1
    expected = sum(ends.values())
    missing = sum(
        1 for partition, end in ends.items() for o in range(end) if (partition, o) not in counts
    )
    return Measurement(
        records=expected,
        wall=observation.finished - observation.first_call,
        startup=observation.first_call - observation.started,
        ideal=cpu_ideal(row, expected)
        if row.work.kind == "cpu"
        else ideal_time(observation.log, row.ordering, row.concurrency * row.instances),
        duplicates=sum(c - 1 for c in counts.values()),
        missing=missing,
        order_ok=order_kept(observation.log, row.ordering),
        service_total=sum(entry[3] for entry in observation.log),
        extra=dict(observation.extra),
    )


@dataclass(frozen=True)
class Summary:
    """The median of a contestant's runs of a row (what the table shows)."""

    row: str
    contestant: str
    wall: float
    startup: float
    ideal: float
    records_per_s: float
    c_us: float
    duplicates: int
    missing: int
    order_ok: bool
    runs: tuple[Measurement, ...]

    @property
    def ratio(self) -> float:
        return self.wall / self.ideal if self.ideal > 0 else float("nan")

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.order_ok

    def as_dict(self) -> dict[str, Any]:
        return {
            "row": self.row,
            "contestant": self.contestant,
            "wall": self.wall,
            "startup": self.startup,
            "ideal": self.ideal,
            "ratio": self.ratio,
            "records_per_s": self.records_per_s,
            "c_us": self.c_us,
            "duplicates": self.duplicates,
            "missing": self.missing,
            "order_ok": self.order_ok,
            "runs": [m.as_dict() for m in self.runs],
        }


def summarise(row: str, contestant: str, runs: Sequence[Measurement]) -> Summary:
    """Medians over runs; duplicates and missing records are summed, order must hold in all."""
    wall = statistics.median(m.wall for m in runs)
    ideal = statistics.median(m.ideal for m in runs)
    records = runs[0].records
    return Summary(
        row=row,
        contestant=contestant,
        wall=wall,
        startup=statistics.median(m.startup for m in runs),
        ideal=ideal,
        records_per_s=records / wall if wall > 0 else float("inf"),
        c_us=max(0.0, (wall - ideal) / records * 1e6) if records else 0.0,
        duplicates=sum(m.duplicates for m in runs),
        missing=sum(m.missing for m in runs),
        order_ok=all(m.order_ok for m in runs),
        runs=tuple(runs),
    )
