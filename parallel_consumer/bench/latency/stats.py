"""From what a run saw to latencies, percentiles, CDFs and the keep-up verdict: pure functions.

A run yields three maps keyed by ``(partition, offset)``: when the record was produced (its
produce time, which the record carries), when its handler returned, and when a commit covering
it was acknowledged. A commit of offset ``n`` on a partition covers every offset below ``n``.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "LATENCY_GROWTH_LIMIT",
    "Verdict",
    "cdf_points",
    "commit_times",
    "latencies",
    "percentile",
    "percentiles",
    "verdict",
]

Key = tuple[int, int]

#: The percentiles reported (docs/benchmarks.md).
REPORTED = (50.0, 99.0, 99.9)
#: A contestant keeps up unless the median latency of the records produced in the last quarter of
#: the producing exceeds that of the second quarter (the first is the warm-up) by more than this
#: many seconds (a backlog that grows makes latency grow with it, a long but steady delay does
#: not), or records are left unhandled when the run ends (some seconds after the producer
#: stopped).
LATENCY_GROWTH_LIMIT = 0.25


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``ordered`` (sorted ascending): the smallest
    value with at least ``q`` % of the values at or below it. NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0-100")
    if not ordered:
        return math.nan
    # (rounded first: 99.9 % of 10,000 is 9,990, not 9,990.000000000002)
    rank = max(1, math.ceil(round(q / 100 * len(ordered), 9)))
    return ordered[rank - 1]


def percentiles(values: Iterable[float], qs: Sequence[float] = REPORTED) -> dict[str, float]:
    """``{"p50": ..., "p99": ..., "p99.9": ...}`` of ``values`` (seconds)."""
    ordered = sorted(values)
    return {f"p{q:g}": percentile(ordered, q) for q in qs}


def cdf_points(values: Iterable[float], points: int = 200) -> list[tuple[float, float]]:
    """``(value, fraction at or below it)`` pairs for a CDF chart, about ``points`` of them:
    evenly spaced up to the median, then ever closer towards the tail (a tenth of the remaining
    fraction at a time) so that p99.9 and the maximum are drawn from real samples."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return []
    ranks: set[int] = {n}
    half = points // 2
    for i in range(1, half + 1):
        ranks.add(max(1, math.ceil(n * 0.5 * i / half)))
    remaining = 0.5
    while remaining * n >= 1:
        for i in range(1, 10):
            ranks.add(min(n, math.ceil(n * (1 - remaining + remaining * i / 10))))
        remaining /= 10
    return [(ordered[r - 1], r / n) for r in sorted(ranks)]


def commit_times(
    commits: Iterable[tuple[float, int, int]], records: Iterable[Key]
) -> dict[Key, float]:
    """When each record's offset was first covered by an acknowledged commit: ``commits`` are
    ``(time, partition, committed offset)``; a record never covered is left out."""
    by_partition: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for t, partition, offset in sorted(commits):
        by_partition[partition].append((t, offset))
    # Per partition, the highest offset committed so far, at each acknowledgement in time order:
    # non-decreasing, so the first acknowledgement covering an offset is a bisection away.
    reach: dict[int, tuple[list[float], list[int]]] = {}
    for partition, acks in by_partition.items():
        times, highest, top = [], [], -1
        for t, offset in acks:
            top = max(top, offset)
            times.append(t)
            highest.append(top)
        reach[partition] = (times, highest)
    out = {}
    for partition, offset in records:
        if partition not in reach:
            continue
        times, highest = reach[partition]
        i = bisect.bisect_right(highest, offset)
        if i < len(times):
            out[(partition, offset)] = times[i]
    return out


def latencies(produced: Mapping[Key, float], reached: Mapping[Key, float]) -> list[float]:
    """Seconds from produce to ``reached`` for each produced record that reached it."""
    return [reached[k] - t for k, t in produced.items() if k in reached]


@dataclass(frozen=True)
class Verdict:
    """Whether a contestant sustained the rate; its backlog (records produced and not yet
    handled) when the producer stopped; how much its latency grew over the producing."""

    keeps_up: bool
    backlog_at_end: int
    latency_growth: float
    unfinished: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median(values: Sequence[float]) -> float:
    return percentile(sorted(values), 50)


def verdict(produced: Mapping[Key, float], done: Mapping[Key, float]) -> Verdict:
    """Judge a run from its produce and handler-done times (records outside ``produced``, such
    as the primers, are ignored): see :data:`LATENCY_GROWTH_LIMIT`."""
    if not produced:
        return Verdict(True, 0, 0.0, 0, "nothing produced")
    by_time = sorted(produced.items(), key=lambda item: item[1])
    start, end = by_time[0][1], by_time[-1][1]
    quarter = (end - start) / 4

    def latency_between(low: float, high: float) -> float:
        got = [done[k] - t for k, t in by_time if low <= t <= high and k in done]
        return _median(got) if got else math.nan

    growth = latency_between(end - quarter, end) - latency_between(
        start + quarter, start + 2 * quarter
    )
    handled_by_end = sum(1 for k, t in by_time if k in done and done[k] <= end)
    at_end = len(by_time) - handled_by_end
    unfinished = sum(1 for k, _ in by_time if k not in done)
    if unfinished:
        reason = f"{unfinished} records still unhandled when the run ended"
    elif growth > LATENCY_GROWTH_LIMIT:
        reason = f"latency grew by {growth * 1000:.0f} ms over the producing"
    else:
        return Verdict(True, at_end, growth, 0, "sustained")
    return Verdict(False, at_end, growth, unfinished, reason)
