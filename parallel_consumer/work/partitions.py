"""PartitionState: which offsets of one assigned partition are finished, and what to commit.

One object per assignment: a revoke throws it away and a new assignment makes a new one with a
new epoch, so results of the old assignment can be recognised as stale.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from parallel_consumer.errors import InternalError
from parallel_consumer.offsets import OffsetDecodeError, decode_offset_map
from parallel_consumer.work.item import TopicPartition

__all__ = ["IncompleteOffsets", "PartitionSnapshot", "PartitionState", "restored_state"]

log = logging.getLogger("parallel_consumer")


class IncompleteOffsets:
    """A set of offsets added in increasing order and removed in any order.

    Cheaper than a sorted container on the hot path (an append and a set insert per record, a
    set removal per success) while the lowest member stays O(1) amortised: removed offsets are
    skipped lazily at the front of the insertion order, and the order is rebuilt when it holds
    far more removed offsets than members (a record stuck at the front).
    """

    __slots__ = ("_members", "_order")

    def __init__(self, offsets: Sequence[int] = ()) -> None:
        self._order: deque[int] = deque(offsets)
        self._members: set[int] = set(offsets)

    def add(self, offset: int) -> None:
        """Add ``offset``, which must be above every offset added before."""
        self._order.append(offset)
        self._members.add(offset)

    def extend(self, offsets: Sequence[int]) -> None:
        """Add ``offsets`` (ascending), all above every offset added before."""
        self._order.extend(offsets)
        self._members.update(offsets)

    def discard(self, offset: int) -> None:
        self._members.discard(offset)

    def discard_many(self, offsets: Sequence[int]) -> None:
        self._members.difference_update(offsets)

    def lowest(self) -> int | None:
        order, members = self._order, self._members
        while order and order[0] not in members:
            order.popleft()
        if len(order) > 4 * len(members) + 4096:
            # A record stuck at the front keeps the removed offsets behind it: drop them.
            self._order = order = deque(sorted(members))
        return order[0] if order else None

    def below(self, limit: int) -> list[int]:
        """Members below ``limit``, ascending."""
        members = self._members
        out = []
        for offset in self._order:
            if offset >= limit:
                break
            if offset in members:
                out.append(offset)
        return out

    def sorted(self) -> list[int]:
        members = self._members
        return [offset for offset in self._order if offset in members]

    def clear(self) -> None:
        self._order.clear()
        self._members.clear()

    def __contains__(self, offset: object) -> bool:
        return offset in self._members

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[int]:
        return iter(self.sorted())

    def __bool__(self) -> bool:
        return bool(self._members)

    def __repr__(self) -> str:
        return f"<IncompleteOffsets {len(self._members)} lowest={self.lowest()}>"


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    """Statistics of one assigned partition."""

    topic: str
    partition: int
    epoch: int
    incomplete: int
    highest_seen: int
    highest_succeeded: int
    committed_offset: int | None
    dirty: bool
    blocked: bool
    metadata_size: int
    metadata_status: str
    #: The highest offset at and below which every polled record succeeded (the lowest
    #: unfinished offset - 1; ``highest_seen`` when nothing is unfinished).
    highest_sequential_succeeded: int = -1


class RecordTotals:
    """Records of one partition processed, and attempts failed, since the consumer started
    (shared by its successive assignments)."""

    __slots__ = ("failed", "succeeded")

    def __init__(self) -> None:
        self.succeeded = 0
        self.failed = 0


class PartitionState:
    """Processing state of one assigned partition. Owned by the controller thread.

    ``incomplete`` holds every offset that was polled (or restored from the committed offset
    map) and has not succeeded. Offsets below ``highest_seen`` that are not in it are finished,
    including gaps left by compaction and transaction markers.
    """

    def __init__(
        self,
        tp: TopicPartition,
        epoch: int,
        *,
        committed_offset: int | None = None,
        restored_incomplete: Sequence[int] = (),
        restored_highest: int = -1,
    ) -> None:
        self.tp = tp
        self.epoch = epoch
        self.totals = RecordTotals()
        self.incomplete = IncompleteOffsets(restored_incomplete)
        #: Restored incomplete offsets that no poll has delivered yet (ascending).
        self._unpolled: list[int] = list(restored_incomplete)
        self.highest_seen = restored_highest
        self.highest_succeeded = restored_highest
        #: Offsets at or below this that are not incomplete were finished before a restart.
        self._restored_highest = restored_highest
        self._highest_polled = -1
        #: The client's read position: offsets below it that were never delivered are not records.
        self._read_to = -1
        self._bootstrap = True
        self.committed_offset = committed_offset
        #: Bumped on every change that alters what would be committed.
        self.version = 0
        self._clean_version = 0

    # -- records ------------------------------------------------------------------------------

    def accept(self, messages: Sequence[Any]) -> list[Any]:
        """Register a polled batch of this partition (offset order); return the records to run.

        Records the restored offset map marks finished, and records already registered, are
        left out. The first batch after assignment and every batch over restored offsets also
        repair the state for truncation, compaction and offset resets.
        """
        if not messages:
            return []
        first = messages[0].offset()
        last = messages[-1].offset()
        if self._bootstrap:
            self._bootstrap = False
            self._check_start(first)
        if self._unpolled:
            self._forget_unpolled(last, messages)
        incomplete = self.incomplete
        if first > self._highest_polled and first > self._restored_highest:
            # The common case: every record is new and above anything restored.
            self._highest_polled = last
            incomplete.extend([m.offset() for m in messages])
            if last > self.highest_seen:
                self.highest_seen = last
            return list(messages)
        fresh: list[Any] = []
        for message in messages:
            offset = message.offset()
            if offset <= self._highest_polled:
                continue  # delivered twice (a retried fetch); already registered
            self._highest_polled = offset
            if offset <= self._restored_highest:
                if offset not in incomplete:
                    continue  # finished before the restart
            else:
                incomplete.add(offset)
            fresh.append(message)
        if last > self.highest_seen:
            self.highest_seen = last
        return fresh

    def _check_start(self, first: int) -> None:
        expected = self.offset_to_commit()
        if first > expected:
            gone = self.incomplete.below(first)
            if gone:
                log.warning(
                    "%s[%d]: first polled offset %d is above the committed position %d "
                    "(retention, compaction or an offset reset); forgetting %d unfinished "
                    "offsets below it",
                    *self.tp,
                    first,
                    expected,
                    len(gone),
                )
                for offset in gone:
                    self.incomplete.discard(offset)
                self._unpolled = [o for o in self._unpolled if o >= first]
                self._changed()
        elif first < expected:
            log.warning(
                "%s[%d]: first polled offset %d is below the committed position %d (the offset "
                "was rewound); the restored offset map no longer applies and everything from "
                "%d is processed",
                *self.tp,
                first,
                expected,
                first,
            )
            self.incomplete.clear()
            self._unpolled.clear()
            self._restored_highest = -1
            self.highest_seen = first - 1
            self.highest_succeeded = first - 1
            self._changed()

    def _forget_unpolled(self, last: int, messages: Sequence[Any]) -> None:
        """Restored offsets up to the batch's last are delivered now, or never will be.

        The client delivers a partition in offset order, so a restored offset below ``last``
        that is not in this batch was skipped: compacted away, deleted by retention, a
        transaction marker, or jumped over by an offset reset. That holds for offsets between
        two batches as much as for those inside one; they are no longer incomplete.
        """
        unpolled = self._unpolled
        stop = bisect.bisect_right(unpolled, last)
        if not stop:
            return
        present = {m.offset() for m in messages}
        for offset in unpolled[:stop]:
            if offset not in present:
                self.incomplete.discard(offset)
                self._changed()
        del unpolled[:stop]

    def succeeded(self, offset: int) -> None:
        self.incomplete.discard(offset)
        if offset > self.highest_succeeded:
            self.highest_succeeded = offset
        self.version += 1  # _changed(), inline: this runs once per record

    def succeeded_many(self, offsets: Sequence[int], highest: int) -> None:
        """Records at ``offsets`` (not empty; ``highest`` the largest) succeeded."""
        self.incomplete.discard_many(offsets)
        if highest > self.highest_succeeded:
            self.highest_succeeded = highest
        self.version += 1

    def has_holes(self) -> bool:
        """An unfinished offset lies below the highest succeeded one (the map is not empty)."""
        lowest = self.incomplete.lowest()
        return lowest is not None and lowest < self.highest_succeeded

    # -- commits ------------------------------------------------------------------------------

    def read_to(self, position: int) -> None:
        """The client has read up to ``position`` (exclusive), and every record below it was
        delivered before this call: the offsets in between are transaction markers, aborted or
        compacted records, which count as finished."""
        if position > self._read_to:
            if self._unpolled and self._unpolled[0] < position:
                # Restored unfinished offsets the client read past without delivering them.
                self._forget_unpolled(position - 1, ())
            before = self.offset_to_commit()
            self._read_to = position
            if self.offset_to_commit() != before:
                self._changed()

    def offset_to_commit(self) -> int:
        lowest = self.incomplete.lowest()
        if lowest is not None:
            return lowest
        if self._read_to > self._highest_polled:
            return max(self.highest_succeeded + 1, self._read_to)
        return self.highest_succeeded + 1

    @property
    def dirty(self) -> bool:
        return self.version != self._clean_version

    def _changed(self) -> None:
        self.version += 1

    def acknowledged(self, offset: int, version: int) -> None:
        """The broker stored a commit of ``offset`` planned at ``version``: if nothing changed
        since, the partition is clean."""
        if self.committed_offset is None or offset >= self.committed_offset:
            self.committed_offset = offset
        if version == self.version:
            self._clean_version = version

    # -- views --------------------------------------------------------------------------------

    def snapshot(
        self, *, blocked: bool = False, metadata_size: int = 0, metadata_status: str = "fits"
    ) -> PartitionSnapshot:
        lowest = self.incomplete.lowest()
        return PartitionSnapshot(
            topic=self.tp[0],
            partition=self.tp[1],
            epoch=self.epoch,
            incomplete=len(self.incomplete),
            highest_seen=self.highest_seen,
            highest_succeeded=self.highest_succeeded,
            committed_offset=self.committed_offset,
            dirty=self.dirty,
            blocked=blocked,
            metadata_size=metadata_size,
            metadata_status=metadata_status,
            highest_sequential_succeeded=self.highest_seen if lowest is None else lowest - 1,
        )

    def __repr__(self) -> str:
        return (
            f"<PartitionState {self.tp[0]}[{self.tp[1]}] epoch={self.epoch} "
            f"incomplete={len(self.incomplete)} succeeded<={self.highest_succeeded} "
            f"committed={self.committed_offset} {'dirty' if self.dirty else 'clean'}>"
        )


def restored_state(
    tp: TopicPartition,
    epoch: int,
    committed: int | None,
    metadata: str | None,
    *,
    fail_on_invalid: bool,
    exact: bool = False,
) -> PartitionState:
    """The state of a newly assigned partition from what the group committed: the offset, and
    the map of finished records above it in ``metadata``. Undecodable metadata is replayed from
    the committed offset (logged), or raises ``InternalError`` when ``fail_on_invalid``.

    ``exact``: ``metadata`` is exactly the committed bytes, so the map is decoded whole
    (``decode_offset_map(..., exact=True)``); by default it may be followed by stray characters,
    as confluent-kafka's ``committed()`` returns it, and is cut out of them."""
    restored: tuple[int, ...] = ()
    highest = -1 if committed is None else committed - 1
    if committed is not None and metadata:
        try:
            decoded = decode_offset_map(committed, metadata, exact=exact)
        except OffsetDecodeError as exc:
            if fail_on_invalid:
                raise InternalError(
                    f"{tp[0]}[{tp[1]}]: committed offset {committed} carries metadata that "
                    f"cannot be decoded ({exc}); set Options(invalid_metadata_policy=REPLAY) "
                    "to replay instead"
                ) from exc
            log.error(
                "%s[%d]: cannot decode the offset map committed at offset %d (%s); replaying "
                "everything from that offset",
                *tp,
                committed,
                exc,
            )
        else:
            restored = tuple(decoded.incomplete)
            highest = decoded.highest_seen
    return PartitionState(
        tp,
        epoch,
        committed_offset=committed,
        restored_incomplete=restored,
        restored_highest=highest,
    )
