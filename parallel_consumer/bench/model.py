"""What a benchmark row is and what a contestant observes: plain data shared by every module.

A *workload* (``workloads/``) is a list of :class:`Row` s; a *contestant* (``contestants/``) runs
one row on a topic and returns an :class:`Observation`; ``measure`` turns the observation into
figures on the docs/benchmarks.md clock. Times are epoch seconds (``time.time()``) so that a
contestant in another process (the Java harness) reports on the same clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["DataSet", "Observation", "Ordering", "Row", "Skip", "Work"]

Ordering = Literal["KEY", "PARTITION", "UNORDERED"]
WorkKind = Literal["noop", "sleep_random", "sleep", "cpu", "async_sleep"]
KeyMode = Literal["random", "round_robin", "unique"]


class Skip(Exception):
    """A contestant or workload cannot run here; the message says why, in one line."""


@dataclass(frozen=True)
class Work:
    """What the handler does per record.

    ``sleep_random``: ``time.sleep(random.randrange(int(ms) + 1) / 1000)`` (W1: 0-4 ms);
    ``sleep``/``async_sleep``: ``ms`` milliseconds; ``cpu``: ``ms`` of pure-Python arithmetic;
    ``noop``: nothing.
    """

    kind: WorkKind
    ms: float = 0.0

    def describe(self) -> str:
        if self.kind == "noop":
            return "no-op"
        if self.kind == "sleep_random":
            return f"sleep 0-{self.ms:g} ms"
        return f"{self.kind.replace('_', ' ')} {self.ms:g} ms"


@dataclass(frozen=True)
class DataSet:
    """The records of a topic; rows with equal data sets share one topic (and one produce)."""

    records: int
    partitions: int
    keys: int
    key_mode: KeyMode = "random"
    value_size: int = 10
    seed: int = 7

    def key_list(self) -> list[bytes]:
        import random

        if self.key_mode == "unique":
            return [b"key-%d" % i for i in range(self.records)]
        if self.key_mode == "round_robin":
            return [b"key-%d" % (i % self.keys) for i in range(self.records)]
        rng = random.Random(self.seed)
        return [b"key-%d" % rng.randrange(self.keys) for _ in range(self.records)]


@dataclass(frozen=True)
class Row:
    """One line of a workload's table: the data, the ordering, the concurrency and the work."""

    workload: str
    label: str
    data: DataSet
    ordering: Ordering
    concurrency: int
    work: Work
    batch_size: int = 1
    commit_interval: float = 0.1
    #: The Java library's published figure for this row (W1), seconds.
    java_published: float | None = None
    #: Rows whose handler must be ``async def`` (our asyncio runner).
    async_handler: bool = False
    #: Runner options for ``Options`` (W5: ``{"runner": "process", "processes": 2}``).
    runner: dict[str, Any] = field(default_factory=dict)
    #: W4: the handler returns a ProducerRecord per record for an output topic
    #: (``poll_and_produce``); the value is the commit mode's name, or "" for the default.
    produce: str | None = None
    #: Members of one group, each with ``concurrency`` (share-group rows: more members than
    #: partitions; only contestants in ``contestants.MANY_INSTANCES`` run them).
    instances: int = 1

    @property
    def name(self) -> str:
        return f"{self.workload} {self.label}"


@dataclass
class Observation:
    """What one contestant saw in one run, on the epoch clock.

    ``log`` has one entry per handler call per record, in the order the calls finished:
    ``(partition, key, offset, service seconds)``; for batches the call's time is shared out.
    """

    started: float
    first_call: float
    finished: float
    log: list[tuple[int, Any, int, float]]
    #: Anything contestant-specific worth keeping in the JSON (commit counts, versions ...).
    extra: dict[str, Any] = field(default_factory=dict)
