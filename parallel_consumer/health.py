"""``pc.health()``: a structured, frozen report of whether the consumer makes progress.

Built on the controller thread from its parts (like ``statistics()``), so it is consistent and
cheap: one pass over the assigned partitions and the calls in flight. See docs/health.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from parallel_consumer.status import Lifecycle

__all__ = ["HealthReport", "PartitionHealth", "PartitionStall"]


@dataclass(frozen=True, slots=True)
class PartitionStall:
    """Passed to ``Hooks.on_partition_stall``: a partition held by one record for too long."""

    topic: str
    partition: int
    #: The partition's lowest unfinished offset: the record holding it.
    offset: int
    #: The partition's committed offset (None: nothing committed yet by this group).
    committed_offset: int | None
    #: Seconds the record has held the partition without the committed offset moving.
    stalled_for: float
    #: What the engine does about it: ``"warn"``, ``"dead_letter"`` or ``"stop"``.
    action: str


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    """The progress of one assigned partition."""

    topic: str
    partition: int
    #: The last committed offset the broker acknowledged (None: none yet).
    committed_offset: int | None
    #: The lowest offset not finished yet (None: every record received is finished).
    oldest_incomplete_offset: int | None
    #: Seconds ``oldest_incomplete_offset`` has been the partition's lowest unfinished offset
    #: (None when nothing is unfinished).
    oldest_incomplete_age: float | None
    #: Seconds since the committed offset last moved (or since the partition was assigned or
    #: the consumer resumed, whichever came last).
    since_commit_moved: float
    #: Records of this partition inside handler calls.
    in_flight: int
    #: Records of this partition waiting to be dispatched.
    waiting: int
    #: The offset map is near the metadata size limit: only the holes below run (see
    #: docs/back-pressure.md).
    blocked_by_metadata: bool
    #: In a stall episode (see ``Options.stall_threshold``).
    stalled: bool


@dataclass(frozen=True, slots=True)
class HealthReport:
    """Whether the consumer is alive and making progress, and why not."""

    lifecycle: Lifecycle
    #: Not failed, not closing or closed, and no partition stalled. A liveness probe can
    #: answer with this alone; ``reasons`` says what is wrong.
    healthy: bool
    partitions: tuple[PartitionHealth, ...]
    #: ``(topic, partition)`` of the partitions in a stall episode.
    stalled_partitions: tuple[tuple[str, int], ...]
    #: ``(topic, partition)`` of the partitions blocked by their offset map's size.
    blocked_by_metadata: tuple[tuple[str, int], ...]
    #: Records sent to the dead-letter topic so far (0 until dead-lettering is configured).
    dead_letter_failures: int
    #: Handler calls that ran past ``Options.processing_timeout`` so far.
    deadline_exceeded: int
    #: Of those, calls still running on a worker thread that cannot be interrupted (they hold
    #: a worker; their results will be ignored).
    overrunning_calls: int
    #: ``Options.stall_threshold`` (None: stall detection is off).
    stall_threshold: float | None
    #: Short human-readable reasons why ``healthy`` is False (empty when healthy).
    reasons: tuple[str, ...]
    #: The failure that stopped the consumer, as text (None while it has not failed).
    failure: str | None = None


def health_report(
    lifecycle: Lifecycle,
    *,
    partitions: list[PartitionHealth],
    dead_letter_failures: int,
    deadline_exceeded: int,
    overrunning_calls: int,
    stall_threshold: float | None,
    failure: BaseException | None,
) -> HealthReport:
    """Assemble a report and say why it is unhealthy (pure)."""
    reasons = []
    if failure is not None:
        reasons.append(f"failed: {failure}")
    if lifecycle in (Lifecycle.CLOSING, Lifecycle.CLOSED):
        reasons.append(f"lifecycle is {lifecycle.name}")
    stalled = tuple((p.topic, p.partition) for p in partitions if p.stalled)
    reasons.extend(
        f"{p.topic}[{p.partition}] stalled: offset {p.oldest_incomplete_offset} unfinished for "
        f"{p.oldest_incomplete_age or 0.0:.1f}s, committed offset {p.committed_offset} unmoved "
        f"for {p.since_commit_moved:.1f}s"
        for p in partitions
        if p.stalled
    )
    return HealthReport(
        lifecycle=lifecycle,
        healthy=not reasons,
        partitions=tuple(partitions),
        stalled_partitions=stalled,
        blocked_by_metadata=tuple(
            (p.topic, p.partition) for p in partitions if p.blocked_by_metadata
        ),
        dead_letter_failures=dead_letter_failures,
        deadline_exceeded=deadline_exceeded,
        overrunning_calls=overrunning_calls,
        stall_threshold=stall_threshold,
        reasons=tuple(reasons),
        failure=None if failure is None else repr(failure),
    )
