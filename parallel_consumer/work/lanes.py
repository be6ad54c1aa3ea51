"""Lanes: which ordering lane a record belongs to (the lane rule), and one lane (a shard).

A lane is (topic, partition, key) in KEY order, and the partition in PARTITION and UNORDERED
order; null keys of one partition share one KEY lane. Every part of the engine that needs a
record's lane asks here: :func:`shard_key_for` for one record, :func:`items_for` and
:func:`key_lanes` for a batch of records of one partition (the rule bound once per batch, not
a call per record).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from parallel_consumer.options import ProcessingOrder
from parallel_consumer.work.item import TopicPartition, WorkItem

__all__ = ["Shard", "items_for", "key_lanes", "shard_key_for"]


def shard_key_for(ordering: ProcessingOrder, tp: TopicPartition, key: bytes | None) -> object:
    """The lane (shard) a record belongs to. Null keys of one partition share one KEY lane."""
    if ordering is ProcessingOrder.KEY:
        return (tp[0], tp[1], key)
    return tp


def key_lanes(tp: TopicPartition, messages: Sequence[Any]) -> list[object]:
    """The KEY-order lanes of ``messages`` of ``tp`` (:func:`shard_key_for`, for a batch)."""
    topic, partition = tp
    return [(topic, partition, m.key()) for m in messages]


def items_for(
    ordering: ProcessingOrder, tp: TopicPartition, epoch: int, messages: Sequence[Any]
) -> list[WorkItem]:
    """A :class:`WorkItem` in its lane for each of ``messages`` of ``tp`` (assignment
    ``epoch``): :func:`shard_key_for`'s rule, bound once for the batch."""
    if ordering is ProcessingOrder.KEY:
        topic, partition = tp
        return [WorkItem(m, tp, (topic, partition, m.key()), epoch) for m in messages]
    return [WorkItem(m, tp, tp, epoch) for m in messages]


class Shard:
    """One ordering lane. Owned by the controller thread (through its ShardMap)."""

    __slots__ = ("busy", "key", "parked", "passed", "queue", "removed", "scheduled", "tp")

    def __init__(self, key: object, tp: TopicPartition) -> None:
        self.key = key
        self.tp = tp
        #: Records waiting for dispatch, in offset order (a due retry goes back to the front).
        self.queue: deque[WorkItem] = deque()
        #: Records of this shard in flight or waiting for their retry delay.
        self.busy = 0
        #: True while the shard sits in the ready queue or is parked.
        self.scheduled = False
        #: Parked: its head is above its blocked partition's limit (see ShardMap.take).
        self.parked = False
        self.removed = False
        #: How often :meth:`ShardMap.take_longest` passed it over for a longer lane.
        self.passed = 0

    def reuse(self, key: object, tp: TopicPartition) -> None:
        """Serve as the new lane ``key`` (this one was dropped: empty, not busy, not
        scheduled, not parked), as if just made: a lane made and dropped per record then
        costs no allocations."""
        self.key = key
        self.tp = tp
        self.busy = self.passed = 0
        self.removed = False

    def __repr__(self) -> str:
        return f"<Shard {self.key!r} waiting={len(self.queue)} busy={self.busy}>"
