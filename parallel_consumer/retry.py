"""Retry timing: pure functions from a failure to the delay before the next attempt, and the
queue of records waiting for theirs."""

from __future__ import annotations

import heapq
import itertools
import logging
from datetime import timedelta

from parallel_consumer.context import RecordContext
from parallel_consumer.errors import Retry
from parallel_consumer.options import Options
from parallel_consumer.work.item import TopicPartition, WorkItem

__all__ = ["RetryQueue", "retry_delay"]

log = logging.getLogger("parallel_consumer")


def retry_delay(options: Options, error: BaseException, record: RecordContext) -> float:
    """Seconds to wait before ``record`` is tried again after ``error``.

    ``Retry(delay=...)`` raised by the handler wins; then ``Options.retry_delay_provider`` (which
    sees the attempt count including this failure); then ``Options.retry_delay``. A provider
    that fails or returns nonsense falls back to ``retry_delay`` with a warning, because a bug in
    it must not stop the consumer.
    """
    if isinstance(error, Retry) and error.delay is not None:
        return error.delay
    provider = options.retry_delay_provider
    if provider is None:
        return options.retry_delay
    try:
        value = provider(record)
        seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    except Exception:
        log.warning("retry_delay_provider failed; using retry_delay", exc_info=True)
        return options.retry_delay
    if not seconds >= 0:  # also catches NaN
        log.warning("retry_delay_provider returned %r; using retry_delay", value)
        return options.retry_delay
    return seconds


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
