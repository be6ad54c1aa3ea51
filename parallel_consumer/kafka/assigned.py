"""The partitions the poller holds, and what it handed over of each.

Pure (no client, no threads): the poller owns one :class:`AssignedPartitions`, feeds it what the
client returned and posts what it decides. Per partition it keeps the assignment epoch (every
record and commit carries it: work of an earlier epoch is dropped), one past the last offset
handed over, the first offset the client delivered in this assignment (where a rewind goes
when nothing was committed yet) and the client position last reported. Records the client
delivered beyond the credit wait here, in order, until credit returns.

Messages are anything with ``topic()``, ``partition()``, ``offset()`` and ``error()`` (the
client's ``Message``, the fakes' records).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from parallel_consumer.work.item import TopicPartition

__all__ = ["AssignedPartitions", "Batches"]

#: Per partition: (epoch, its records in order), as posted in ``RecordsPolled``.
Batches = dict[TopicPartition, tuple[int, list[Any]]]


class AssignedPartitions:
    """What the poller holds per assigned partition (owned by the poller thread)."""

    __slots__ = ("delivered_to", "epochs", "first_seen", "next_epoch", "overflow", "positions")

    def __init__(self) -> None:
        self.epochs: dict[TopicPartition, int] = {}
        self.next_epoch = 0
        #: The client position last reported.
        self.positions: dict[TopicPartition, int] = {}
        #: One past the last offset handed over.
        self.delivered_to: dict[TopicPartition, int] = {}
        #: The first offset the client delivered in this assignment.
        self.first_seen: dict[TopicPartition, int] = {}
        #: Records the client delivered beyond the credit, in order.
        self.overflow: deque[Any] = deque()

    def assign(self, tps: Iterable[TopicPartition]) -> int:
        """``tps`` join (or join again) under a new epoch, which is returned."""
        self.next_epoch += 1
        epoch = self.next_epoch
        for tp in tps:
            self.epochs[tp] = epoch
            self._reset(tp)
        return epoch

    def forget(self, tps: Sequence[TopicPartition]) -> None:
        """``tps`` leave the assignment: drop everything held of them."""
        self._drop_overflow(tps)
        for tp in tps:
            self.epochs.pop(tp, None)
            self._reset(tp)

    def renew(
        self, revoking: frozenset[TopicPartition]
    ) -> tuple[int, dict[TopicPartition, int | None]]:
        """After an aborted transaction: every partition gets a new epoch (those being revoked
        too, so that offsets planned for them before the abort are dropped). Returns the epoch
        and, per partition kept, the first offset delivered in its assignment (None if none),
        whose delivery starts again from scratch."""
        self.next_epoch += 1
        epoch = self.next_epoch
        kept = [tp for tp in self.epochs if tp not in revoking]
        for tp in self.epochs:
            if tp in revoking:
                self.epochs[tp] = epoch
        first = {tp: self.first_seen.get(tp) for tp in kept}
        self._drop_overflow(kept)
        for tp in kept:
            self.epochs[tp] = epoch
            self._reset(tp)
        return epoch, first

    def split(self, messages: Sequence[Any]) -> tuple[Batches, int, list[tuple[Any, Any]]]:
        """What ``consume()`` returned, grouped by partition in one pass (the client returns
        each partition's records together: the partition is looked up only where it changes),
        without records of partitions not held (stragglers of a revoke). Returns the batches,
        how many records they hold, and the (error, message) pairs the client reported."""
        epochs = self.epochs
        first_seen = self.first_seen
        batches: Batches = {}
        errors: list[tuple[Any, Any]] = []
        current: list[Any] | None = None
        last_topic: str | None = None
        last_partition = -1
        count = 0
        for message in messages:
            error = message.error()
            if error is not None:
                errors.append((error, message))
                continue
            partition = message.partition()
            topic = message.topic()
            if partition != last_partition or topic != last_topic:
                last_partition, last_topic = partition, topic
                tp = (topic, partition)
                epoch = epochs.get(tp)
                if epoch is None:
                    current = None  # a straggler of a partition revoked during this consume()
                    continue
                batch = batches.get(tp)
                if batch is None:
                    batch = batches[tp] = (epoch, [])
                    if tp not in first_seen:
                        # (also for records held back in the overflow: a rewind must go back
                        # to them when nothing was committed yet)
                        first_seen[tp] = message.offset()
                current = batch[1]
            elif current is None:
                continue
            current.append(message)
            count += 1
        return batches, count, errors

    def admit(self, batches: Batches, count: int, available: int) -> tuple[Batches, int]:
        """Of ``batches`` (``count`` records), what may go to the engine with ``available``
        credit now. More than that is possible only from a partition assigned inside the
        ``consume()``, before it could be paused: those wait in the overflow, in order, so the
        bound on records in the engine holds."""
        if not self.overflow and count <= available:
            return batches, count
        for _, held in batches.values():
            self.overflow.extend(held)
        return self.release(available)

    def release(self, available: int) -> tuple[Batches, int]:
        """What of the overflow may go to the engine with ``available`` credit."""
        overflow = self.overflow
        count = min(len(overflow), available)
        batches: Batches = {}
        epochs = self.epochs
        for _ in range(count):
            message = overflow.popleft()
            tp = (message.topic(), message.partition())
            batch = batches.get(tp)
            if batch is None:
                batch = batches[tp] = (epochs[tp], [])
            batch[1].append(message)
        return batches, count

    def handed_over(self, batches: Batches) -> None:
        """``batches`` went to the engine."""
        delivered_to = self.delivered_to
        for tp, (_, batch_messages) in batches.items():
            delivered_to[tp] = batch_messages[-1].offset() + 1

    def reached(
        self, positions: Iterable[tuple[TopicPartition, int]]
    ) -> tuple[tuple[TopicPartition, int, int], ...]:
        """Of the client's ``positions``, those past the last record handed over and not
        reported yet, as (tp, epoch, offset): the log ends there with offsets that are not
        records (transaction markers, aborted records), and without them the group would show
        a lag of one forever. The client's position is past records still held back in the
        overflow: not a gap."""
        held_back = {(m.topic(), m.partition()) for m in self.overflow}
        changed = []
        for tp, offset in positions:
            epoch = self.epochs.get(tp)
            if (
                epoch is None
                or tp in held_back
                or offset < 0
                or offset <= self.delivered_to.get(tp, -1)
                or offset == self.positions.get(tp)
            ):
                continue
            self.positions[tp] = offset
            changed.append((tp, epoch, offset))
        return tuple(changed)

    def _reset(self, tp: TopicPartition) -> None:
        self.positions.pop(tp, None)
        self.delivered_to.pop(tp, None)
        self.first_seen.pop(tp, None)

    def _drop_overflow(self, tps: Iterable[TopicPartition]) -> None:
        if self.overflow:
            gone = set(tps)
            self.overflow = deque(
                m for m in self.overflow if (m.topic(), m.partition()) not in gone
            )

    def __repr__(self) -> str:
        return (
            f"<AssignedPartitions {len(self.epochs)} epoch={self.next_epoch} "
            f"overflow={len(self.overflow)}>"
        )
