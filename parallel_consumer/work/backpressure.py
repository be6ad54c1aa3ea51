"""Per-partition pause decisions, with hysteresis (pure).

Pausing a partition makes the Kafka client drop what it prefetched for it, and resuming costs a
fetch round trip, so partitions are paused rarely: only when *their* backlog is full, and they
resume only once it has drained to half. The hard bound on records held by the engine is kept by
the poller's credit (see ``_poller.py``), not here.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from parallel_consumer.work.item import TopicPartition

__all__ = ["partition_cap", "partitions_to_pause"]


def partition_cap(limit: int, assigned: int, fetch_batch: int) -> int:
    """The backlog at which one partition is paused: a fair share of ``limit``, at least one
    fetch batch (so a partition never pauses before it could fill one ``consume()``)."""
    share = limit // max(1, assigned)
    return max(share, min(fetch_batch, limit))


def partitions_to_pause(
    waiting_by_tp: Mapping[TopicPartition, int],
    assigned: Set[TopicPartition],
    paused: Set[TopicPartition],
    cap: int,
) -> frozenset[TopicPartition]:
    """The partitions that should be paused now.

    A partition pauses when its waiting records reach ``cap`` and resumes when they fall to
    ``cap // 2`` or below; between the two it keeps its current state.
    """
    low = cap // 2
    result: set[TopicPartition] = set()
    for tp in assigned:
        waiting = waiting_by_tp.get(tp, 0)
        if waiting >= cap or (tp in paused and waiting > low):
            result.add(tp)
    return frozenset(result)
