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
    "BACKLOG_GROWTH_SECONDS",
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
#: A contestant keeps up unless its backlog grows by more than this many seconds of records
#: between the first and the last quarter of the producing, or records are left unhandled when
#: the run ends (some seconds after the producer stopped).
BACKLOG_GROWTH_SECONDS = 0.25
#: ... and never less than this many records (a few handler calls' worth of noise).
BACKLOG_GROWTH_MIN = 50


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``ordered`` (sorted ascending): the smallest
    value with at least ``q`` % of the values at or below it. NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0-100")
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
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
    """Whether a contestant sustained the rate, and its backlog (records produced and not yet
    handled) at the end of the producing."""

    keeps_up: bool
    backlog_at_end: int
    backlog_growth: float
    unfinished: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _backlog(produced: Sequence[float], done: Sequence[float], at: float) -> int:
    return bisect.bisect_right(produced, at) - bisect.bisect_right(done, at)


def verdict(
    produced: Mapping[Key, float],
    done: Mapping[Key, float],
    rate: float,
    samples: int = 20,
) -> Verdict:
    """Judge a run from its produce and handler-done times (records outside ``produced``, such
    as the primers, are ignored): the backlog is sampled over the producing; it must not grow
    by more than :data:`BACKLOG_GROWTH_SECONDS` of records from the first quarter to the last,
    and every record must have been handled by the end of the run."""
    if not produced:
        return Verdict(True, 0, 0.0, 0, "nothing produced")
    sent = sorted(produced.values())
    handled = sorted(t for k, t in done.items() if k in produced)
    start, end = sent[0], sent[-1]
    times = (
        [start + (end - start) * i / (samples - 1) for i in range(samples)]
        if samples > 1
        else [end]
    )
    backlog = [_backlog(sent, handled, t) for t in times]
    quarter = max(1, samples // 4)
    growth = sum(backlog[-quarter:]) / quarter - sum(backlog[:quarter]) / quarter
    unfinished = len(sent) - len(handled)
    limit = max(BACKLOG_GROWTH_MIN, BACKLOG_GROWTH_SECONDS * rate)
    at_end = _backlog(sent, handled, end)
    if unfinished:
        reason = f"{unfinished} records still unhandled when the run ended"
    elif growth > limit:
        reason = f"backlog grew by {growth:.0f} records over the producing (limit {limit:.0f})"
    else:
        return Verdict(True, at_end, growth, 0, "sustained")
    return Verdict(False, at_end, growth, unfinished, reason)
