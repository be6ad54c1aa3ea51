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

from collections.abc import Callable, Mapping, Set

from parallel_consumer.work.item import TopicPartition

__all__ = ["PAUSE_CHECK_INTERVAL", "Pauses", "partition_cap", "partitions_to_pause"]


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


#: How often paused partitions are checked for resumption while nothing else happens.
PAUSE_CHECK_INTERVAL = 0.005


class Pauses:
    """Which partitions the controller wants paused, and when to look again. Owned by the
    controller thread; the decision itself is :func:`partitions_to_pause`.

    Decisions are re-evaluated when something changed the backlog or the assignment
    (:meth:`mark_stale`), while some partition is paused at most every
    ``PAUSE_CHECK_INTERVAL`` (:meth:`wake_at` tells the controller when, so that a paused
    partition resumes even if no event arrives), and while workers starve.
    """

    __slots__ = (
        "_fetch_batch",
        "_limit",
        "_partition_order",
        "count",
        "next_check",
        "paused",
        "stale",
    )

    def __init__(self, limit: int, fetch_batch: int, *, partition_order: bool) -> None:
        self._limit = limit
        self._fetch_batch = fetch_batch
        self._partition_order = partition_order
        self.paused: frozenset[TopicPartition] = frozenset()
        self.stale = True
        self.next_check = 0.0
        #: Partitions paused so far.
        self.count = 0

    def due(self, now: float, starving: Callable[[], bool]) -> bool:
        """Time to decide again; ``starving`` is asked only when the answer depends on it."""
        if self.stale:
            return True
        return now >= self.next_check and (bool(self.paused) or starving())

    def wake_at(self) -> float | None:
        return self.next_check if self.paused else None

    def update(
        self,
        now: float,
        waiting_by_tp: Mapping[TopicPartition, int],
        assigned: Set[TopicPartition],
        *,
        running: bool,
        starving: bool,
    ) -> frozenset[TopicPartition] | None:
        """Decide again; returns the new set to send to the poller, or None if unchanged.
        Not ``running`` (paused by the user, draining, closing): every partition is paused."""
        self.stale = False
        self.next_check = now + PAUSE_CHECK_INTERVAL
        if running:
            cap = partition_cap(self._limit, len(assigned), self._fetch_batch)
            wanted = partitions_to_pause(
                waiting_by_tp,
                assigned,
                self.paused,
                cap,
                crowding=self._partition_order or starving,
            )
        else:
            wanted = frozenset(assigned)
        if wanted == self.paused:
            return None
        self.count += len(wanted - self.paused)
        self.paused = wanted
        return wanted
