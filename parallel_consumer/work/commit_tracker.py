"""The commit tracker: when to commit, what to commit per partition, what is on its way, what
the broker answered, and which partitions are blocked. Owned by the controller thread (through
its ledger); pure data and decisions, no I/O.

"Blocked" lives here and only here: a partition whose offset map is near or over the metadata
limit runs only the holes below its highest succeeded offset until the map shrinks, unless
maps over the limit spill to the side topic (``spill``, docs/offset-metadata.md): then nothing
blocks. The controller reads :attr:`CommitTracker.blocked` when it asks the shards for work, and
unparks the shards of the partitions :meth:`CommitTracker.take_to_unpark` returns. The limit
follows the highest succeeded offset while the partition stays blocked.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping

from parallel_consumer.errors import InternalError
from parallel_consumer.offsets import CommitPlan, MetadataStatus, plan_commit
from parallel_consumer.work.counters import Counters
from parallel_consumer.work.item import TopicPartition
from parallel_consumer.work.partitions import PartitionState

__all__ = [
    "IDLE_COMMIT_AFTER",
    "PENDING_COMMIT_TIMEOUT",
    "CommitAnswer",
    "CommitTracker",
    "OffsetCommit",
]

log = logging.getLogger("parallel_consumer")

#: Statuses that do not block a partition when maps over the limit spill.
_SPILLING = frozenset({MetadataStatus.NEAR_LIMIT, MetadataStatus.SPILL})
#: A commit neither acknowledged nor failed after this long is sent again.
PENDING_COMMIT_TIMEOUT = 30.0
#: An engine that finished everything it polled commits at once, if the last commit is this
#: fraction of commit_interval old (docs/commits.md#when).
IDLE_COMMIT_AFTER = 0.1


@dataclasses.dataclass(frozen=True, slots=True)
class OffsetCommit:
    """One partition's share of a commit, for the assignment ``epoch`` it was planned in.
    ``metadata`` ``""`` commits no metadata at all. ``spill``: ``metadata`` is a map over the
    limit, which the committer writes to the side topic and commits a reference to instead."""

    tp: TopicPartition
    epoch: int
    offset: int
    metadata: str
    spill: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class CommitAnswer:
    """The broker's answer for one :class:`OffsetCommit`; ``error`` is None on success.
    ``permanent`` errors fail again however often they are retried (authorisation, a map over
    the broker's ``offset.metadata.max.bytes``)."""

    commit: OffsetCommit
    error: str | None = None
    permanent: bool = False


@dataclasses.dataclass(slots=True)
class _Pending:
    version: int
    sent_at: float
    #: Times this same commit was sent (again when overdue) and not yet answered.
    sends: int = 1


class CommitTracker:
    """Commit planning and bookkeeping for every assigned partition."""

    def __init__(self, max_metadata_bytes: int, every: float = 5.0, *, spill: bool = False) -> None:
        self._max_metadata_bytes = max_metadata_bytes
        #: Maps over the limit go to the side topic instead of blocking the partition.
        self._spill = spill
        #: Seconds between commits (Options.commit_every), and when the next is due.
        self.every = every
        self.next_at = 0.0
        #: Blocked partitions -> the offset below which records may still run.
        self.blocked: dict[TopicPartition, int] = {}
        self._to_unpark: list[TopicPartition] = []
        #: Sent and not yet answered, per partition: (epoch, offset, metadata) -> _Pending.
        self._pending: dict[TopicPartition, dict[tuple[int, int, str], _Pending]] = {}
        #: Last planned map per partition: (size in bytes, status name).
        self._metadata: dict[TopicPartition, tuple[int, str]] = {}

    # -- timing ---------------------------------------------------------------------------------

    def schedule(self, now: float) -> None:
        """A commit was sent (or is due no sooner than) now: the next one is a period later."""
        self.next_at = now + self.every

    def idle_at(self) -> float:
        """When an engine that finished everything may commit, ahead of :attr:`next_at`."""
        every = self.every
        return self.next_at - every + every * IDLE_COMMIT_AFTER

    # -- planning -------------------------------------------------------------------------------

    def plan(self, state: PartitionState) -> CommitPlan | None:
        """What to commit for ``state`` now (None: nothing); updates whether it is blocked."""
        plan = plan_commit(
            state.incomplete.below(state.highest_succeeded),
            state.highest_succeeded,
            max_metadata_bytes=self._max_metadata_bytes,
            spill=self._spill,
        )
        if not state.incomplete:
            # Nothing unfinished: the client's read position may be past trailing transaction
            # markers or aborted records, which would otherwise show as lag forever.
            target = state.offset_to_commit()
            if plan is None and target > max(0, state.committed_offset or 0):
                plan = CommitPlan(
                    offset=target, metadata="", status=MetadataStatus.FITS, encoding=None, size=0
                )
            elif plan is not None and plan.offset < target:
                plan = dataclasses.replace(plan, offset=target)
        if plan is None:
            return None
        tp = state.tp
        self._metadata[tp] = (plan.size, plan.status.name.lower())
        too_big = plan.status is not MetadataStatus.FITS and not (
            self._spill and plan.status in _SPILLING
        )
        if too_big and tp not in self.blocked:
            self.blocked[tp] = state.highest_succeeded
            log.warning(
                "%s[%d]: offset map is %d bytes (%s, limit %d): only records below offset %d "
                "run until it shrinks%s",
                *tp,
                plan.size,
                plan.status.name,
                self._max_metadata_bytes,
                state.highest_succeeded,
                "; committing the offset without it" if plan.metadata == "" else "",
            )
        elif too_big:
            self._follow(state)
        elif tp in self.blocked:
            self._unblock(tp)
        return plan

    def due(
        self, states: Iterable[PartitionState], now: float, *, final: bool = False
    ) -> list[OffsetCommit]:
        """The commits to send now: one per changed partition, unless the same commit is already
        on its way (and not overdue); ``final`` sends every changed partition regardless."""
        out = []
        for state in states:
            if not state.dirty:
                continue
            commit = self._planned(state)
            if commit is None:
                continue
            pending = self._pending.get(state.tp, {}).get(_key(commit))
            if not final and pending is not None and now - pending.sent_at < PENDING_COMMIT_TIMEOUT:
                continue  # the same commit is on its way; its answer decides
            self.sent(state, commit, now)
            out.append(commit)
        return out

    def final_for(self, state: PartitionState, now: float) -> OffsetCommit | None:
        """The last commit of a partition that is leaving (revoke), if it needs one."""
        if not (state.dirty or self._pending.get(state.tp)):
            return None
        commit = self._planned(state)
        if commit is not None:
            self.sent(state, commit, now)
        return commit

    def _planned(self, state: PartitionState) -> OffsetCommit | None:
        plan = self.plan(state)
        if plan is None:
            return None
        spill = plan.status is MetadataStatus.SPILL
        return OffsetCommit(state.tp, state.epoch, plan.offset, plan.metadata, spill)

    def sent(self, state: PartitionState, commit: OffsetCommit, now: float) -> None:
        # Only the newest commit of a partition is awaited: it covers every older one, whose
        # answer may never come (a lost callback would otherwise keep a close waiting).
        key = _key(commit)
        pending = self._pending.get(state.tp, {}).get(key)
        sends = 1 if pending is None else pending.sends + 1
        self._pending[state.tp] = {key: _Pending(state.version, now, sends)}

    # -- answers and progress -----------------------------------------------------------------

    def answered(self, state: PartitionState, answer: CommitAnswer) -> bool:
        """Apply the broker's answer; False if it answers no pending commit of this assignment
        (an older epoch's, or already answered)."""
        commit = answer.commit
        if commit.epoch != state.epoch:
            return False
        waiting = self._pending.get(state.tp, {})
        pending = waiting.get(_key(commit))
        if pending is None:
            return False
        if answer.error is None:
            state.acknowledged(commit.offset, pending.version)
        elif pending.sends > 1:
            # The same commit was sent again: that request's answer may still succeed.
            pending.sends -= 1
            return True
        del waiting[_key(commit)]
        return True

    def handle_answers(
        self,
        answers: Iterable[CommitAnswer],
        partitions: Mapping[TopicPartition, PartitionState],
        counters: Counters,
    ) -> list[tuple[TopicPartition, int]]:
        """Apply a commit's answers to the partitions still assigned in the epoch they were
        planned in, and count them; returns the (partition, offset) pairs committed. A
        permanent failure raises :class:`InternalError` (the consumer stops)."""
        passed = []
        for answer in answers:
            commit = answer.commit
            state = partitions.get(commit.tp)
            current = state is not None and state.epoch == commit.epoch
            if answer.error is None:
                counters.commits_acknowledged += 1
                passed.append((commit.tp, commit.offset))
            elif answer.permanent:
                raise InternalError(
                    f"the broker rejected the commit of {commit.tp[0]}[{commit.tp[1]}]@"
                    f"{commit.offset} for good: {answer.error}"
                )
            else:
                counters.commit_failures += 1
                # A commit of a partition since revoked fails as a matter of course (the group
                # moved to a new generation); the revoke's own commit is what counts there.
                log.log(
                    logging.WARNING if current else logging.INFO,
                    "commit of %s[%d]@%d failed (%s): %s",
                    *commit.tp,
                    commit.offset,
                    "retried at the next interval" if current else "no longer assigned",
                    answer.error,
                )
            if state is not None and current:
                self.answered(state, answer)
        return passed

    def after_success(self, state: PartitionState) -> None:
        """A record of a blocked partition succeeded: without holes it is free again."""
        if state.tp not in self.blocked:
            return
        if not state.has_holes():
            self._unblock(state.tp)
        else:
            self._follow(state)

    def take_to_unpark(self) -> list[TopicPartition]:
        """Partitions unblocked, or whose limit rose, since the last call: their parked shards
        must be judged again."""
        out, self._to_unpark = self._to_unpark, []
        return out

    def _follow(self, state: PartitionState) -> None:
        # Records in flight when the partition was blocked may succeed above the limit; the ones
        # of them that failed are holes now, below the new highest succeeded offset. The limit
        # follows it, or those holes would stay parked and the partition never unblock.
        tp = state.tp
        if state.highest_succeeded > self.blocked[tp]:
            self.blocked[tp] = state.highest_succeeded
            self._to_unpark.append(tp)

    def _unblock(self, tp: TopicPartition) -> None:
        del self.blocked[tp]
        self._to_unpark.append(tp)

    def forget(self, tp: TopicPartition) -> None:
        self.blocked.pop(tp, None)
        self._pending.pop(tp, None)
        self._metadata.pop(tp, None)

    # -- views --------------------------------------------------------------------------------

    def has_pending(self, tp: TopicPartition | None = None) -> bool:
        if tp is not None:
            return bool(self._pending.get(tp))
        return any(self._pending.values())

    def metadata(self, tp: TopicPartition) -> tuple[int, str]:
        """(size, status) of the last map planned for ``tp``."""
        return self._metadata.get(tp, (0, "fits"))

    def __repr__(self) -> str:
        pending = sum(len(p) for p in self._pending.values())
        return f"<CommitTracker pending={pending} blocked={sorted(self.blocked)}>"


def _key(commit: OffsetCommit) -> tuple[int, int, str]:
    return (commit.epoch, commit.offset, commit.metadata)
