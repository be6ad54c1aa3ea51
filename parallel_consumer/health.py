"""``pc.health()``: a structured, frozen report of whether the consumer makes progress.

Built on the controller thread from its parts (like ``statistics()``), so it is consistent and
cheap: one pass over the assigned partitions and the calls in flight. See docs/health.md.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from parallel_consumer.errors import PartitionStalled
from parallel_consumer.status import Lifecycle
from parallel_consumer.work.inflight import Batch
from parallel_consumer.work.item import TopicPartition
from parallel_consumer.work.partitions import PartitionState
from parallel_consumer.work.progress import ProgressWatch, Stall
from parallel_consumer.work.runs import Run

__all__ = [
    "BROKERS_DOWN_UNHEALTHY_AFTER",
    "MISSING_TOPICS_UNHEALTHY_AFTER",
    "HealthReport",
    "PartitionHealth",
    "PartitionStall",
]

#: Seconds every broker may be down or unreachable (as the Kafka client reports it) before
#: ``health()`` is unhealthy: long enough for a broker restart or a leader election, short
#: enough for a liveness probe to notice a consumer that cannot reach Kafka at all.
BROKERS_DOWN_UNHEALTHY_AFTER = 15.0
#: Seconds a subscription may match no topic at all before ``health()`` is unhealthy: a new
#: topic being created by a deployment step has time to appear; a typo does not go unnoticed.
MISSING_TOPICS_UNHEALTHY_AFTER = 30.0


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
    #: Seconds since the Kafka client reported every broker down or unreachable (None while
    #: one answers); unhealthy from ``BROKERS_DOWN_UNHEALTHY_AFTER`` on.
    brokers_down_for: float | None = None
    #: Subscriptions (names or ``^regex``) that match no topic of the cluster; unhealthy once
    #: no subscription has matched any for ``MISSING_TOPICS_UNHEALTHY_AFTER`` seconds.
    missing_topics: tuple[str, ...] = ()
    #: The brokers' refusals in force: a failed login, or a missing ACL (on the group, a topic
    #: read, an output or dead-letter topic written to), each naming what to check or grant.
    #: Unhealthy at once while there is one: it does not mend itself.
    access_refused: tuple[str, ...] = ()


def partition_health(
    states: Iterable[PartitionState],
    *,
    progress: ProgressWatch,
    in_flight: Iterable[Batch],
    runs: Iterable[Run] = (),
    waiting: Mapping[TopicPartition, int],
    blocked: Collection[TopicPartition],
    now: float,
) -> list[PartitionHealth]:
    """One row per assigned partition, from the controller's parts (on its thread)."""
    running: dict[TopicPartition, int] = {}
    for batch in in_flight:
        for item in batch.items:
            running[item.tp] = running.get(item.tp, 0) + 1
    for run in runs:
        if not run.detached:
            running[run.tp] = running.get(run.tp, 0) + len(run) - run.settled
    rows = []
    for state in states:
        tp = state.tp
        lowest = state.incomplete.lowest()
        track = progress.track(tp)
        if track is not None and track.epoch != state.epoch:
            track = None
        age: float | None = None
        if lowest is not None:
            age = now - track.lowest_since if track and track.lowest == lowest else 0.0
        moved = now
        if track is not None and track.committed == state.committed_offset:
            moved = track.moved_at
        rows.append(
            PartitionHealth(
                topic=tp[0],
                partition=tp[1],
                committed_offset=state.committed_offset,
                oldest_incomplete_offset=lowest,
                oldest_incomplete_age=age,
                since_commit_moved=now - moved,
                in_flight=running.get(tp, 0),
                waiting=waiting.get(tp, 0),
                blocked_by_metadata=tp in blocked,
                # (as of the watch's last observation, unless the partition moved since)
                stalled=track is not None
                and track.reported
                and track.lowest == lowest
                and track.committed == state.committed_offset,
            )
        )
    return rows


def stalled_error(stall: Stall, threshold: float | None) -> PartitionStalled:
    """The failure of ``on_stall=STOP``."""
    topic, partition = stall.tp
    return PartitionStalled(
        f"{topic}[{partition}] made no progress for {stall.stalled_for:.1f}s: offset "
        f"{stall.offset} is unfinished and the committed offset ({stall.committed}) did not "
        f"move (Options.stall_threshold={threshold}s, on_stall=STOP). Find out why that "
        "record's handler call hangs or keeps failing; raise stall_threshold, or choose "
        "on_stall=WARN to keep running",
        topic=topic,
        partition=partition,
        offset=stall.offset,
        stalled_for=stall.stalled_for,
    )


def health_report(
    lifecycle: Lifecycle,
    *,
    partitions: list[PartitionHealth],
    dead_letter_failures: int,
    deadline_exceeded: int,
    overrunning_calls: int,
    stall_threshold: float | None,
    failure: BaseException | None,
    brokers_down_for: float | None = None,
    missing_topics: tuple[str, ...] = (),
    missing_topics_for: float | None = None,
    access_refused: tuple[str, ...] = (),
) -> HealthReport:
    """Assemble a report and say why it is unhealthy (pure)."""
    reasons = []
    if failure is not None:
        reasons.append(f"failed: {failure}")
    if brokers_down_for is not None and brokers_down_for >= BROKERS_DOWN_UNHEALTHY_AFTER:
        reasons.append(
            f"every Kafka broker down or unreachable for {brokers_down_for:.1f}s (see the "
            "WARNING logged when it started)"
        )
    if missing_topics_for is not None and missing_topics_for >= MISSING_TOPICS_UNHEALTHY_AFTER:
        reasons.append(
            f"the subscription matches no topic for {missing_topics_for:.1f}s: "
            f"{', '.join(repr(t) for t in missing_topics)} (a typo, or not created yet?)"
        )
    reasons.extend(f"Kafka refused access: {text}" for text in access_refused)
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
        brokers_down_for=brokers_down_for,
        missing_topics=missing_topics,
        access_refused=access_refused,
    )
