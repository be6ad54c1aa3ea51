"""What the open-loop producer sends, and when: pure functions of the workload's parameters.

Open loop: the send times are fixed in advance (record ``i`` at ``i / rate`` seconds), whatever
the consumer does, so a slow consumer builds a backlog instead of slowing the producer down
(a closed loop would hide exactly the latency this workload measures).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass

__all__ = ["LoadSpec", "RateSchedule", "partition_of", "plan_keys", "zipf_keys"]


@dataclass(frozen=True)
class LoadSpec:
    """L1's parameters (docs/benchmarks.md)."""

    partitions: int = 4
    keys: int = 1000
    #: Zipf exponent: key ``k`` (from 0) is chosen with weight ``1 / (k + 1) ** zipf_s``.
    zipf_s: float = 1.0
    concurrency: int = 32
    work_ms: float = 5.0
    commit_interval: float = 0.1
    #: Seconds of producing per run.
    duration: float = 10.0
    #: Records pre-produced for the capacity run (``pc`` on a backlog).
    capacity_records: int = 6000
    seed: int = 39


def zipf_keys(keys: int, s: float, count: int, seed: int) -> list[int]:
    """``count`` key indices in ``[0, keys)``, index ``k`` with probability proportional to
    ``1 / (k + 1) ** s`` (``s = 0``: uniform); the same seed gives the same keys."""
    if keys < 1:
        raise ValueError("keys must be 1 or more")
    if count < 0:
        raise ValueError("count must not be negative")
    cumulative = list(itertools.accumulate(1.0 / (k + 1) ** s for k in range(keys)))
    total = cumulative[-1]
    rng = random.Random(seed)
    last = keys - 1
    return [min(bisect.bisect_right(cumulative, rng.random() * total), last) for _ in range(count)]


def partition_of(key: int, partitions: int) -> int:
    """A key's partition: every record of a key goes to one partition, as a keyed producer's
    would (explicit, so that the plan knows each partition's end offset in advance)."""
    return key % partitions


def plan_keys(spec: LoadSpec, count: int) -> list[tuple[int, int]]:
    """``(key index, partition)`` of each record of a run, in send order."""
    return [
        (k, partition_of(k, spec.partitions))
        for k in zipf_keys(spec.keys, spec.zipf_s, count, spec.seed)
    ]


class RateSchedule:
    """Record ``i`` is due at ``start + i / rate``; :meth:`due` says how many are due by a
    time, so a producer that woke late sends every overdue record at once (open loop)."""

    def __init__(self, rate: float, duration: float, start: float) -> None:
        if rate <= 0 or not math.isfinite(rate):
            raise ValueError(f"rate must be a positive number, not {rate!r}")
        if duration < 0:
            raise ValueError("duration must not be negative")
        self.rate = rate
        self.start = start
        self.count = math.floor(rate * duration)

    def send_time(self, index: int) -> float:
        return self.start + index / self.rate

    def due(self, now: float) -> int:
        """How many records are due at ``now`` (never more than :attr:`count`)."""
        if now < self.start:
            return 0
        return min(self.count, math.floor((now - self.start) * self.rate) + 1)

    def wait(self, sent: int, now: float) -> float:
        """Seconds until the record after the first ``sent`` is due (0 when overdue)."""
        if sent >= self.count:
            return 0.0
        return max(0.0, self.send_time(sent) - now)
