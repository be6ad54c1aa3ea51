"""A partition of a share group (KIP-932), as the engine sees it.

Every member of a share group reads every partition: a member gets whichever records the broker
hands it, in any order, and a record it released may come back to it (or go to another member).
Nothing is committed: each record is acknowledged on its own (``kafka/share/``). So the state of
a shared partition only keeps which records this instance holds, for the engine's views (the
lowest unfinished offset, progress, stalls); it never turns dirty and never plans a commit.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from parallel_consumer.work.item import TopicPartition
from parallel_consumer.work.partitions import IncompleteOffsets, PartitionState

__all__ = ["SharedPartitionState", "UnorderedOffsets"]


class UnorderedOffsets(IncompleteOffsets):
    """Offsets added in any order and removed in any order; the lowest stays O(log n): removed
    offsets are skipped lazily at the top of a heap, rebuilt when it holds far more of them than
    members."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[int] = []

    def add(self, offset: int) -> None:
        if offset not in self._members:
            self._members.add(offset)
            heapq.heappush(self._heap, offset)

    def extend(self, offsets: Sequence[int]) -> None:
        for offset in offsets:
            self.add(offset)

    def lowest(self) -> int | None:
        heap, members = self._heap, self._members
        while heap and heap[0] not in members:
            heapq.heappop(heap)
        if len(heap) > 4 * len(members) + 4096:
            self._heap = heap = sorted(members)
        return heap[0] if heap else None

    def below(self, limit: int) -> list[int]:
        return sorted(o for o in self._members if o < limit)

    def sorted(self) -> list[int]:
        return sorted(self._members)

    def clear(self) -> None:
        self._heap.clear()
        self._members.clear()


class SharedPartitionState(PartitionState):
    """A shared partition: records in any order, again after a release; never dirty."""

    def __init__(self, tp: TopicPartition, epoch: int) -> None:
        super().__init__(tp, epoch)
        self.incomplete = UnorderedOffsets()

    def accept(self, messages: Sequence[Any]) -> list[Any]:
        """Register every record of ``messages``: each was acquired by this instance (the
        poller never hands over a record it still holds)."""
        incomplete = self.incomplete
        for message in messages:
            offset = message.offset()
            incomplete.add(offset)
            if offset > self.highest_seen:
                self.highest_seen = offset
        return list(messages)

    def released(self, offset: int) -> None:
        """The record at ``offset`` went back to the broker unfinished."""
        self.incomplete.discard(offset)

    def read_to(self, position: int) -> None:
        """(A share consumer reports no positions.)"""

    def offset_to_commit(self) -> int:
        lowest = self.incomplete.lowest()
        return self.highest_seen + 1 if lowest is None else lowest

    @property
    def dirty(self) -> bool:
        return False
