"""Typed messages that cross threads. Frozen: once posted, nobody changes them."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from parallel_consumer.work.item import TopicPartition, WorkItem

__all__ = [
    "Assignment",
    "Commit",
    "CommitResult",
    "Control",
    "ControllerEvent",
    "PartitionsAssigned",
    "PartitionsLost",
    "PartitionsRevoked",
    "PollerCommand",
    "PollerFailed",
    "PositionsReached",
    "RecordsPolled",
    "Release",
    "SetPaused",
    "StopPoller",
    "WorkDone",
]


# -- poller -> controller ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordsPolled:
    """One ``consume()`` result, grouped by partition, stamped with each partition's epoch."""

    batches: dict[TopicPartition, tuple[int, list[Any]]]  # tp -> (epoch, messages)
    count: int


@dataclass(frozen=True, slots=True)
class PositionsReached:
    """The client's fetch positions: every offset below one was either delivered in an earlier
    ``RecordsPolled`` or does not exist as a record (transaction markers, aborted records,
    compaction gaps). Lets a partition commit past a trailing transaction marker."""

    positions: tuple[tuple[TopicPartition, int, int], ...]  # (tp, epoch, offset)


@dataclass(frozen=True, slots=True)
class Assignment:
    """A newly assigned partition and what the group committed for it."""

    tp: TopicPartition
    epoch: int
    committed_offset: int | None
    metadata: str | None


@dataclass(frozen=True, slots=True)
class PartitionsAssigned:
    assignments: tuple[Assignment, ...]


@dataclass(frozen=True, slots=True)
class PartitionsRevoked:
    """Partitions are being taken away; ``reply`` gets the final commit offsets for them."""

    tps: tuple[TopicPartition, ...]
    reply: Future[list[tuple[TopicPartition, int, str]]] = field(compare=False)


@dataclass(frozen=True, slots=True)
class PartitionsLost:
    """Partitions were lost without a chance to commit (session timeout, fencing)."""

    tps: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class CommitResult:
    """The broker's answer to a commit: per partition (tp, offset, metadata, error or None)."""

    results: tuple[tuple[TopicPartition, int, str | None, str | None], ...]


@dataclass(frozen=True, slots=True)
class PollerFailed:
    error: BaseException


# -- runner -> controller ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkDone:
    """A handler call ended. ``error`` is None on success."""

    items: Sequence[WorkItem]
    error: BaseException | None
    finished_at: float  # clock.monotonic() when the call ended


# -- user thread -> controller ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Control:
    """A request from the facade: ``pause``, ``resume``, ``close``, ``statistics``."""

    action: str
    reply: Future[Any] = field(compare=False)
    drain: bool = True
    #: For ``close``: how long buffered (drain) or in-flight work may take before giving up.
    timeout: float | None = None


ControllerEvent = (
    RecordsPolled
    | PartitionsAssigned
    | PartitionsRevoked
    | PartitionsLost
    | PositionsReached
    | CommitResult
    | PollerFailed
    | WorkDone
    | Control
)


# -- controller -> poller ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit these offsets: (tp, offset, metadata). ``sync`` blocks the poller until answered."""

    offsets: tuple[tuple[TopicPartition, int, str], ...]
    sync: bool


@dataclass(frozen=True, slots=True)
class SetPaused:
    """The partitions the controller wants paused (the poller may pause more for its credit)."""

    tps: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class Release:
    """``count`` records the poller handed over have left the engine: that much credit returns."""

    count: int


@dataclass(frozen=True, slots=True)
class StopPoller:
    """Close the Kafka client and end the poller thread."""


PollerCommand = Commit | SetPaused | Release | StopPoller
