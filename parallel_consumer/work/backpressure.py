"""Per-partition pause decisions, with hysteresis (pure).

Pausing a partition makes the Kafka client drop what it prefetched for it, and resuming costs a
re-fetch, so partitions are paused only when their backlog crowds out the others: in PARTITION
order always (one record per partition runs at a time, so a buffer full of one partition's
records would leave the workers idle), in the other orders only while workers sit idle although
records wait (every waiting record is behind a busy key). Then a partition with more than its
fair share of the buffer pauses, and it resumes once its backlog has drained to half of that.
The hard bound on records held by the engine is kept by the poller's credit (see ``credit.py``),
not here.
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
    *,
    crowding: bool,
) -> frozenset[TopicPartition]:
    """The partitions that should be paused now.

    ``cap`` is a partition's fair share (:func:`partition_cap`). While ``crowding``, a partition
    pauses when its waiting records reach ``cap``; a paused partition resumes when they fall to
    ``cap // 2`` or below, and keeps its state in between.
    """
    low = cap // 2
    result: set[TopicPartition] = set()
    for tp in assigned:
        waiting = waiting_by_tp.get(tp, 0)
        if (crowding and waiting >= cap) or (tp in paused and waiting > low):
            result.add(tp)
    return frozenset(result)
