"""The records waiting for their retry delay (owned by the engine's ledger)."""

from __future__ import annotations

import heapq
import itertools

from parallel_consumer.work.item import TopicPartition, WorkItem

__all__ = ["RetryQueue"]


class RetryQueue:
    """Failed records waiting for their retry delay: a heap by due time. Owned by the controller.

    Pure data: it never looks at a clock; the controller asks what is due at ``now``.
    """

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, WorkItem]] = []
        self._seq = itertools.count()

    def push(self, item: WorkItem, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), item))

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[WorkItem]:
        """Every record due at ``now``, highest offset first: each goes back to the front of its
        shard, so the records of a failed batch end up in offset order again."""
        heap = self._heap
        due = []
        while heap and heap[0][0] <= now:
            due.append(heapq.heappop(heap)[2])
        due.sort(key=lambda item: item.offset, reverse=True)
        return due

    def remove(self, item: WorkItem) -> bool:
        """Take ``item`` out of the queue (it is dead-lettered before its retry); False if it
        was not waiting."""
        kept = [entry for entry in self._heap if entry[2] is not item]
        if len(kept) == len(self._heap):
            return False
        heapq.heapify(kept)
        self._heap = kept
        return True

    def forget(self, tp: TopicPartition) -> int:
        """Drop the records of a partition leaving the assignment; returns how many."""
        kept = [entry for entry in self._heap if entry[2].tp != tp]
        dropped = len(self._heap) - len(kept)
        if dropped:
            heapq.heapify(kept)
            self._heap = kept
        return dropped

    def find(self, tp: TopicPartition, offset: int) -> WorkItem | None:
        """The record at ``offset`` of ``tp`` if it waits for its retry (a scan)."""
        for _, _, item in self._heap:
            if item.offset == offset and item.tp == tp:
                return item
        return None

    def __len__(self) -> int:
        return len(self._heap)

    def __repr__(self) -> str:
        return f"<RetryQueue {len(self._heap)} next_due={self.next_due()}>"
