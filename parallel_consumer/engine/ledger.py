"""The ledger: the state of every record the engine holds, and what happens to a finished one.

Owned by the controller thread. It holds the assigned partitions (``work/partitions.py``), the
lanes (``work/shards.py``), the retry queue, the in-flight table, the commit tracker, the
counters, the credit not yet returned to the poller, each partition's progress, and (in the
transactional mode) the failures of records not yet committed. It applies
``work/outcomes.decide`` to failed records; a record to dead-letter is not written here but
queued in :attr:`Ledger.letters_due`, which the controller hands to delivery.

The epoch check lives here: :meth:`Ledger.current` says whether a partition's assignment is
the one a record (or run, or output) was taken from. Per-record loops (:meth:`Ledger.settle`,
:meth:`Ledger.on_records`) inline it; everything else asks :meth:`Ledger.current`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from parallel_consumer._clock import Clock
from parallel_consumer._events import PartitionsAssigned, PositionsReached, RecordsPolled
from parallel_consumer.context import RecordContext
from parallel_consumer.errors import RetriesExhausted, Retry, Skip
from parallel_consumer.hooks import Hooks
from parallel_consumer.options import InvalidMetadataPolicy, Options
from parallel_consumer.runners.base import CallCancelled
from parallel_consumer.work.commit_tracker import CommitAnswer, CommitTracker
from parallel_consumer.work.counters import Counters
from parallel_consumer.work.credit import credit_chunk
from parallel_consumer.work.inflight import Batch, InFlight
from parallel_consumer.work.item import TopicPartition, WorkItem
from parallel_consumer.work.lanes import items_for, shard_key_for
from parallel_consumer.work.outcomes import (
    DeadLetterNow,
    Decision,
    RetryAt,
    SkipNow,
    StopNow,
    counts_as_attempt,
    decide,
    failed_attempts,
)
from parallel_consumer.work.partitions import PartitionState, RecordTotals, restored_state
from parallel_consumer.work.progress import ProgressWatch
from parallel_consumer.work.refusals import Refusals
from parallel_consumer.work.retry_queue import RetryQueue
from parallel_consumer.work.shards import ShardMap
from parallel_consumer.work.shared import SharedPartitionState

__all__ = ["SHARE_HOLD_LIMIT", "WARN_FROM_ATTEMPT", "Ack", "DueLetter", "Ledger", "context_of"]

log = logging.getLogger("parallel_consumer")

#: A record's failed attempts are logged at INFO, and at WARNING from this attempt on.
WARN_FROM_ATTEMPT = 3

#: Share groups: a retry due within this many seconds waits here and is released once due;
#: a longer one is released at once (the broker redelivers it, with no delay of its own). The
#: record's acquisition lock (30 s by default) runs meanwhile: keep this well below it.
SHARE_HOLD_LIMIT = 5.0

#: Share groups: a record that left the engine, and whether it is done (accept) or goes back
#: to the broker for another delivery (release).
Ack = tuple[TopicPartition, int, bool]

#: A record to dead-letter: the item, the error to name in the headers, the reason.
DueLetter = tuple[WorkItem, BaseException | None, str]
#: Transactional mode: a record's failures (attempts, last error, last and first failure time).
FailureHistory = tuple[int, BaseException, Any, Any]


class Ledger:
    """Per-record state of the assigned partitions. See the module docstring."""

    def __init__(self, options: Options, clock: Clock, hooks: Hooks) -> None:
        self._options = options
        self._clock = clock
        self._hooks = hooks
        self._ordering = options.ordering
        #: The on_success hook, None unless implemented: skipped on the hot path.
        self.on_success: Any = None
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.shards = ShardMap(options.ordering)
        self.retries = RetryQueue()
        self.in_flight = InFlight()
        self.commits = CommitTracker(
            options.max_metadata_bytes, options.commit_every, spill=options.spill_offset_maps
        )
        self.counters = Counters()
        #: Topics the brokers refused outputs or dead letters on (kept by delivery).
        self.refusals = Refusals()
        #: Per partition since the start, across assignments: records processed, attempts
        #: failed (Statistics.partition_totals; metrics read them instead of a hook per call).
        self.totals: dict[TopicPartition, RecordTotals] = {}
        #: Credit not yet returned to the poller (records that left the engine).
        self.to_release = 0
        self.credit_chunk = credit_chunk(options.buffer_limit, options.fetch_batch_size)
        #: Per-partition progress, for stall detection and health() (docs/health.md).
        self.progress = ProgressWatch(options.stall_threshold)
        #: Partitions whose lowest unfinished offset may have changed: observed this turn, so
        #: stall clocks start when it happens, not at the next full pass.
        self.moved: set[TopicPartition] = set()
        #: on_stall=DEAD_LETTER: records whose young call was given its chance once already.
        self.stall_chances: set[tuple[TopicPartition, int]] = set()
        #: Transactional mode (keep_history): the failures of records not yet finished, by (tp,
        #: offset). An aborted transaction rewinds their partitions; the records come again and
        #: keep their attempts (a failed output aborts the transaction it was sent in).
        self.keep_history = False
        self.history: dict[tuple[TopicPartition, int], FailureHistory] = {}
        #: A close is under way: a cancelled call is no failure of its records.
        self.closing = False
        #: A close without drain took the records not started away: a record whose retry
        #: comes due now leaves too (uncommitted, its credit returned), as they did.
        self.dropping = False
        #: Records to dead-letter, for the controller to hand to delivery.
        self.letters_due: list[DueLetter] = []
        #: Share groups only (None otherwise): the records that left the engine since the last
        #: turn, to acknowledge (accept or release) through the committer.
        self.acks: list[Ack] | None = [] if options.share_group else None

    # -- the epoch check ------------------------------------------------------------------------

    def current(self, tp: TopicPartition, epoch: int) -> PartitionState | None:
        """The state of ``tp`` if its assignment is still ``epoch``; None if the partition was
        revoked (or revoked and assigned again) since."""
        state = self.partitions.get(tp)
        if state is None or state.epoch != epoch:
            return None
        return state

    def stale(self, count: int) -> None:
        """``count`` records of an assignment that is over left the engine."""
        self.counters.stale += count
        self.to_release += count

    def stale_item(self, item: WorkItem) -> None:
        """``item``'s call (or output) ended after its partition was revoked."""
        self.counters.stale += 1
        self.to_release += 1
        self.shards.stale_done(item)

    # -- records and partitions in ------------------------------------------------------------

    def on_records(self, event: RecordsPolled) -> None:
        """Register polled records in their lanes (every record: no runs)."""
        for tp, (epoch, messages) in event.batches.items():
            fresh = self.accept(tp, epoch, messages)
            if fresh:
                self.add(tp, epoch, fresh)

    def accept(self, tp: TopicPartition, epoch: int, messages: list[Any]) -> list[Any]:
        """The records of ``messages`` still to process (none if ``epoch`` is over, or the
        restored offset map marks them finished)."""
        state = self.partitions.get(tp)
        if state is None or state.epoch != epoch:
            self.to_release += len(messages)
            return []
        fresh = state.accept(messages)
        skipped = len(messages) - len(fresh)
        if skipped:
            self.counters.skipped += skipped
            self.to_release += skipped
        track = self.progress.track(tp)
        if fresh and (track is None or track.lowest is None):
            self.moved.add(tp)
        return fresh

    def add(self, tp: TopicPartition, epoch: int, fresh: list[Any]) -> None:
        """Put ``fresh`` records of ``tp`` (accepted, not registered yet) into their lanes."""
        items = items_for(self._ordering, tp, epoch, fresh)
        if self.history:
            self._recall_failures(tp, items)
        if self.acks is not None:
            _delivered(items)
        self.shards.add(tp, items)
        self.counters.registered += len(fresh)

    def items(self, tp: TopicPartition, epoch: int, messages: Sequence[Any]) -> list[WorkItem]:
        items = items_for(self._ordering, tp, epoch, messages)
        if self.acks is not None:
            _delivered(items)
        return items

    def item_of(self, tp: TopicPartition, epoch: int, message: Any) -> WorkItem:
        item = WorkItem(message, tp, shard_key_for(self._ordering, tp, message.key()), epoch)
        if self.acks is not None:
            _delivered((item,))
        return item

    def _recall_failures(self, tp: TopicPartition, items: list[WorkItem]) -> None:
        history = self.history
        for item in items:
            past = history.get((tp, item.offset))
            if past is not None:
                item.attempts, item.last_failure, item.last_failure_at, item.first_failure_at = past

    def assign(self, event: PartitionsAssigned) -> None:
        """New assignments (each partition forgotten first by the controller)."""
        fail = self._options.invalid_metadata_policy is InvalidMetadataPolicy.FAIL
        for a in event.assignments:
            state: PartitionState = (
                SharedPartitionState(a.tp, a.epoch)
                if a.shared
                else restored_state(
                    a.tp,
                    a.epoch,
                    a.committed_offset,
                    a.metadata,
                    fail_on_invalid=fail,
                    exact=a.exact_metadata,
                )
            )
            self.partitions[a.tp] = state
            state.totals = self.totals.setdefault(a.tp, state.totals)

    def positions(self, event: PositionsReached) -> None:
        for tp, epoch, offset in event.positions:
            state = self.current(tp, epoch)
            if state is not None:
                state.read_to(offset)

    def forget(self, tp: TopicPartition, state: PartitionState, held: Sequence[Batch]) -> None:
        """``tp`` (already out of :attr:`partitions`) is no longer ours: release its records.
        Its records in ``held`` calls (in flight, or whose outputs are on their way) come back
        as stale results and return their credit then; until they do, their lanes stay busy
        for the partition's next assignment. (Those of earlier assignments are held already.)"""
        self.to_release += self.shards.remove_partition(tp)
        self.to_release += self.retries.forget(tp)
        self.commits.forget(tp)
        self.progress.forget(tp)
        for batch in (*self.in_flight, *held):
            for item in batch.items:
                if item.tp == tp and item.epoch == state.epoch:
                    self.shards.hold_for_stale(item)

    def forget_history(self, tps: Sequence[TopicPartition]) -> None:
        if self.history:
            gone = set(tps)
            self.history = {k: v for k, v in self.history.items() if k[0] not in gone}

    # -- results --------------------------------------------------------------------------------

    def settle(
        self, batch: Batch, errors: Sequence[BaseException | None], finished_at: float
    ) -> None:
        """Carry out the outcome of each record of a finished call."""
        partitions = self.partitions
        counters = self.counters
        finish = self.finish
        on_success = self.on_success
        succeeded = 0
        for item, error in zip(batch.items, errors, strict=True):
            state = partitions.get(item.tp)
            if state is None or state.epoch != item.epoch:  # (current(), inline: per record)
                self.stale_item(item)
                continue
            if error is None:
                succeeded += 1
                state.totals.succeeded += 1
                finish(item, state)
                if on_success is not None:
                    on_success(context_of(item))
            else:
                self.failed(item, error, finished_at)
        if succeeded:
            counters.succeeded += succeeded

    def finish(self, item: WorkItem, state: PartitionState) -> None:
        """``item`` is done (processed, skipped or dead-lettered): its offset may commit."""
        self.to_release += 1
        track = self.progress.track(item.tp)
        if track is not None and track.lowest == item.offset:
            self.moved.add(item.tp)  # the partition's stall watch sees progress
        state.succeeded(item.offset)
        if self.stall_chances:
            self.stall_chances.discard((item.tp, item.offset))
        # (Its failure history, kept in the transactional mode, stays until a commit passes
        # it: the transaction holding its dead letter or outputs may still abort.)
        self.shards.finished(item)
        if self.acks is not None:
            self.acks.append((item.tp, item.offset, True))
        blocked = self.commits.blocked
        if blocked and item.tp in blocked:
            self.commits.after_success(state)

    def release(self, item: WorkItem) -> None:
        """Share groups: ``item`` goes back to the broker unfinished (a retry, a call past its
        deadline, a dead letter that cannot be written): another delivery will run it."""
        state = self.partitions.get(item.tp)
        self.to_release += 1
        self.shards.finished(item)
        if (
            state is None
            or state.epoch != item.epoch
            or not isinstance(state, SharedPartitionState)
        ):
            return
        state.released(item.offset)
        assert self.acks is not None
        self.acks.append((item.tp, item.offset, False))

    def take_acks(self) -> list[Ack]:
        acks = self.acks
        if not acks:
            return []
        self.acks = []
        return acks

    def settle_messages(self, state: PartitionState, messages: list[Any]) -> None:
        """Records of ``state``'s partition succeeded, as a stretch (of a run)."""
        count = len(messages)
        offsets = [m.offset() for m in messages]
        highest = max(offsets)  # (a run is in offset order per lane, not across lanes)
        state.succeeded_many(offsets, highest)
        state.totals.succeeded += count
        self.counters.succeeded += count
        self.to_release += count
        tp = state.tp
        if self.acks is not None:
            self.acks.extend((tp, offset, True) for offset in offsets)
        track = self.progress.track(tp)
        if track is not None and track.lowest is not None and track.lowest <= highest:
            self.moved.add(tp)
        if self.stall_chances:
            for offset in offsets:
                self.stall_chances.discard((tp, offset))
        blocked = self.commits.blocked
        if blocked and tp in blocked:
            self.commits.after_success(state)

    def count_failure(self, item: WorkItem, error: BaseException) -> RecordContext:
        """A failed attempt of ``item``: its history, the counter and the ``on_failure`` hook."""
        self.counters.failed += 1
        state = self.partitions.get(item.tp)
        if state is not None:
            state.totals.failed += 1
        item.attempts += 1
        item.last_failure = error
        item.last_failure_at = self._clock.now()
        if item.first_failure_at is None:
            item.first_failure_at = item.last_failure_at
        if self.keep_history:
            self.history[(item.tp, item.offset)] = (
                item.attempts,
                error,
                item.last_failure_at,
                item.first_failure_at,
            )
        record = RecordContext(item.message, item.attempts, error, item.last_failure_at)
        self._hooks.on_failure(record, error)
        return record

    def failed(self, item: WorkItem, error: BaseException, finished_at: float) -> None:
        """``item``'s call failed with ``error``: retry it, or give up on it (``decide``)."""
        if not counts_as_attempt(error, self._options):
            # The handler decided: not a failed attempt (the dead letter's attempt count and
            # the record's history stay as they were).
            self._give_up(item, error, decide(error, context_of(item), finished_at, self._options))
            return
        if self.closing and isinstance(error, CallCancelled):
            # close() cancelled the call: not the record's failure. It stays unfinished (and
            # uncommitted) and runs again after the restart; no retry, no exhaustion policy.
            self.shards.retry_later(item)
            return
        record = self.count_failure(item, error)
        decision = decide(error, record, finished_at, self._options)
        if not isinstance(decision, RetryAt):
            self._give_up(item, error, decision)
            return
        if isinstance(error, Retry):
            level = logging.DEBUG
        else:
            # Retries are routine: a record earns a warning once it keeps failing.
            level = logging.WARNING if item.attempts >= WARN_FROM_ATTEMPT else logging.INFO
        log.log(
            level,
            "%s[%d]@%d failed (attempt %d), retrying in %.3fs: %r",
            *item.tp,
            item.offset,
            item.attempts,
            decision.delay,
            error,
            # (the traceback only when DEBUG is on: retries are routine)
            exc_info=error if log.isEnabledFor(logging.DEBUG) else None,
        )
        self._hooks.on_retry(record, error, decision.delay)
        if self.acks is not None and decision.delay > SHARE_HOLD_LIMIT:
            self.release(item)  # (a share group: the broker redelivers it)
            return
        self.shards.retry_later(item)
        self.retries.push(item, decision.due)

    def _give_up(self, item: WorkItem, error: BaseException, decision: Decision) -> None:
        """Carry out a decision other than a retry for a record that just failed."""
        if isinstance(decision, SkipNow | DeadLetterNow | StopNow) and decision.exhausted:
            self.counters.retries_exhausted += 1
        if isinstance(decision, SkipNow):
            if isinstance(error, Skip):
                log.info("%s[%d]@%d skipped by the handler: %r", *item.tp, item.offset, error)
            else:  # a final failure: with its traceback
                log.warning(
                    "%s[%d]@%d skipped (%s) after %s: %r",
                    *item.tp,
                    item.offset,
                    decision.reason,
                    failed_attempts(item.attempts),
                    error,
                    exc_info=error,
                )
            state = self.partitions[item.tp]
            self.counters.skipped_on_failure += 1
            self.finish(item, state)
            self._hooks.on_skip(context_of(item), error, decision.reason)
        elif isinstance(decision, DeadLetterNow):
            self.shards.retry_later(item)  # its lane stays busy until the letter is written
            self.letters_due.append((item, error, decision.reason))
        else:
            assert isinstance(decision, StopNow)
            raise RetriesExhausted(decision.message) from error

    def take_letters_due(self) -> list[DueLetter]:
        due, self.letters_due = self.letters_due, []
        return due

    def pop_due_retries(self, now: float) -> list[WorkItem]:
        """The records whose retry is due, of current assignments whose lane is still there
        (the others release their credit: a partition forgotten, or a close without drain that
        took the lanes away after the record failed)."""
        due = []
        has_lane = self.shards.has_lane
        for item in self.retries.pop_due(now):
            if self.acks is not None:
                # A share group: the delay was waited out here; the broker redelivers it.
                self.release(item)
                continue
            if (
                self.dropping
                or self.current(item.tp, item.epoch) is None
                or not has_lane(item.shard_key)
            ):
                self.to_release += 1
                continue
            due.append(item)
        return due

    def retry_now(self, items: Sequence[WorkItem]) -> None:
        for item in items:
            self.shards.retry_now(item)

    def blocking_item(self, tp: TopicPartition, offset: int) -> WorkItem | None:
        """The record at ``offset`` of ``tp`` (a stalled partition's lowest unfinished one):
        inside a handler call, waiting for its retry, or waiting in its lane. None if it was
        not polled yet (an unfinished offset restored from the committed offset map). Only
        records of the partition's current assignment: a call of an earlier one that still
        runs belongs to no one (its result will be dropped as stale)."""
        state = self.partitions.get(tp)
        if state is None:
            return None
        epoch = state.epoch
        for batch in self.in_flight:
            for item in batch.items:
                if item.offset == offset and item.tp == tp and item.epoch == epoch:
                    return item
        found = self.retries.find(tp, offset) or self.shards.find(tp, offset)
        return found if found is not None and found.epoch == epoch else None

    # -- credit and commits ---------------------------------------------------------------------

    def credit_due(self) -> int:
        """Credit to return to the poller now (0: keep collecting): a chunk of it, or what
        there is while few records wait."""
        release = self.to_release
        if release and (release >= self.credit_chunk or self.shards.waiting < self.credit_chunk):
            self.to_release = 0
            return release
        return 0

    def dirty(self) -> bool:
        """Some partition has progress not committed yet."""
        return any(s.dirty for s in self.partitions.values())

    def on_commit_answers(self, answers: tuple[CommitAnswer, ...]) -> None:
        """The broker's answers to commits (see :meth:`CommitTracker.handle_answers`)."""
        passed = self.commits.handle_answers(answers, self.partitions, self.counters)
        if self.history:
            history = self.history
            for tp, offset in passed:
                # The group committed ``tp`` at ``offset``: failures of records below it can no
                # longer run again (transactional mode).
                for key in [k for k in history if k[0] == tp and k[1] < offset]:
                    del history[key]


def _delivered(items: Sequence[WorkItem]) -> None:
    """Share groups: the broker counts deliveries; a record redelivered after a failure (here
    or on another member) or a member's death has had that many attempts."""
    for item in items:
        item.attempts = max(item.attempts, (item.message.delivery_count() or 1) - 1)


def context_of(item: WorkItem) -> RecordContext:
    return RecordContext(item.message, item.attempts, item.last_failure, item.last_failure_at)
