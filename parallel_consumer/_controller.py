"""Controller: owns all work state and loops over its inbox (thread ``<name>-controller``).

Everything that changes shards, partition states, retry timers or in-flight counts happens here,
one event at a time. Other threads only post events (``post()``); the controller answers through
futures and by sending commands to the poller and batches to the runner.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any

from parallel_consumer._clock import Clock
from parallel_consumer._events import (
    CommitResult,
    Control,
    ControllerEvent,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    PollerFailed,
    PositionsReached,
    RecordsPolled,
    Release,
    SetPaused,
    StopPoller,
    WorkDone,
)
from parallel_consumer.commit import Committer
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.errors import InternalError, Retry
from parallel_consumer.offsets import (
    CommitPlan,
    MetadataStatus,
    OffsetDecodeError,
    decode_offset_map,
    plan_commit,
)
from parallel_consumer.options import InvalidMetadataPolicy, Options, ProcessingOrder
from parallel_consumer.retry import retry_delay
from parallel_consumer.runners.base import Handler, Runner
from parallel_consumer.status import Lifecycle, Statistics
from parallel_consumer.work.backpressure import credit_chunk, partition_cap, partitions_to_pause
from parallel_consumer.work.item import TopicPartition, WorkItem
from parallel_consumer.work.partitions import PartitionState
from parallel_consumer.work.shards import ShardMap, shard_key_for

__all__ = ["Controller"]

log = logging.getLogger("parallel_consumer")

#: After the work is done on close, how long the final commit may take to be acknowledged.
FINAL_COMMIT_TIMEOUT = 10.0
#: How long the poller (and, after a failure, the workers) may take to stop.
STOP_TIMEOUT = 10.0
#: A commit neither acknowledged nor failed after this long is sent again.
PENDING_COMMIT_TIMEOUT = 30.0
#: How often paused partitions are checked for resumption while nothing else happens.
PAUSE_CHECK_INTERVAL = 0.005


class Controller:
    """The engine's single decision maker. See ARCHITECTURE.md, "Threads and who owns what"."""

    def __init__(
        self,
        options: Options,
        *,
        runner: Runner,
        poller: Any,  # anything with send(PollerCommand) and join(timeout) -> bool
        committer: Committer,
        clock: Clock,
        name: str | None = None,
    ) -> None:
        self._options = options
        self._runner = runner
        self._poller = poller
        self._committer = committer
        self._clock = clock
        self._inbox: queue.SimpleQueue[ControllerEvent] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, name=f"{name or options.name}-controller", daemon=True
        )
        #: Written only by the controller thread; others may read it.
        self.lifecycle = Lifecycle.NEW
        #: Resolved when the controller has stopped: with None, or with the failure.
        self.stopped: Future[None] = Future()
        self._failure: BaseException | None = None
        # -- work state (controller thread only) --
        self._partitions: dict[TopicPartition, PartitionState] = {}
        self._shards = ShardMap(options.ordering)
        self._blocked: dict[TopicPartition, int] = {}
        self._retries: list[tuple[float, int, WorkItem]] = []
        self._retry_seq = itertools.count()
        self._batches_in_flight = 0
        self._records_in_flight = 0
        self._to_release = 0
        self._paused: frozenset[TopicPartition] = frozenset()
        self._credit_chunk = credit_chunk(options.buffer_limit, options.fetch_batch_size)
        #: Pause decisions are re-evaluated when records arrived or, while some partition is
        #: paused, at most every PAUSE_CHECK_INTERVAL: not on every turn of the loop.
        self._pauses_stale = True
        self._next_pause_check = 0.0
        self._next_commit = 0.0
        # -- close --
        self._close_requested: Control | None = None
        self._close_deadline = 0.0
        self._final_commit_deadline: float | None = None
        # -- counters --
        self._registered = 0
        self._skipped = 0
        self._succeeded = 0
        self._failed = 0
        self._stale = 0
        self._commits_sent = 0
        self._commits_acked = 0
        self._commit_failures = 0
        self._pauses = 0

    # -- other threads ------------------------------------------------------------------------

    def post(self, event: ControllerEvent) -> None:
        """Thread-safe: queue an event for the controller."""
        self._inbox.put(event)

    def start(self, handler: Handler, *, thread: bool = True) -> None:
        """Start the runner and (unless ``thread=False``, for tests stepping with
        :meth:`run_once`) the controller thread."""
        self._runner.start(handler, self.post)
        self.lifecycle = Lifecycle.RUNNING
        self._next_commit = self._clock.monotonic() + self._options.commit_interval
        if thread:
            self._thread.start()

    def request(
        self, action: str, *, drain: bool = True, timeout: float | None = None
    ) -> Future[Any]:
        reply: Future[Any] = Future()
        self.post(Control(action, reply, drain, timeout))
        return reply

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    # -- the controller thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:
            log.error("controller failed", exc_info=True)
            if isinstance(exc, InternalError):
                self._failure = exc
            else:
                self._failure = InternalError(f"the controller failed: {exc!r}")
                self._failure.__cause__ = exc
            self._emergency_stop()
        finally:
            self.lifecycle = Lifecycle.CLOSED
            if self._close_requested is not None:
                self._close_requested.reply.set_result(None)
            self._answer_pending_controls()
            if self._failure is not None:
                self.stopped.set_exception(self._failure)
            else:
                self.stopped.set_result(None)

    def _loop(self) -> None:
        while not self.run_once(block=True):
            pass

    def run_once(self, *, block: bool) -> bool:
        """One turn of the loop: wait for events (if ``block``), handle them, dispatch, commit,
        update pauses. Returns True when a close has completed. Runs on the controller thread;
        tests call it directly, without starting the thread, to step the engine by hand."""
        self._assert_owner()
        inbox = self._inbox
        clock = self._clock
        now = clock.monotonic()
        wait = self._next_deadline(now) - now if block else 0.0
        try:
            event: ControllerEvent | None = (
                inbox.get(timeout=clock.block_for(wait)) if wait > 0 else inbox.get_nowait()
            )
        except queue.Empty:
            event = None
        while event is not None:
            self._handle(event)
            try:
                event = inbox.get_nowait()
            except queue.Empty:
                event = None
        now = clock.monotonic()
        if self._retries:
            self._release_due_retries(now)
        self._dispatch()
        if now >= self._next_commit:
            self._commit_dirty()
            self._next_commit = now + self._options.commit_interval
        if (
            self._pauses_stale
            or (self._paused and now >= self._next_pause_check)
            or (now >= self._next_pause_check and self._starving())
        ):
            self._update_pauses()
            self._pauses_stale = False
            self._next_pause_check = now + PAUSE_CHECK_INTERVAL
        release = self._to_release
        if release and (release >= self._credit_chunk or self._shards.waiting < self._credit_chunk):
            self._poller.send(Release(release))
            self._to_release = 0
        return self._close_requested is not None and self._close_step(now)

    def _assert_owner(self) -> None:
        owner = self._thread.ident
        if owner is not None and owner != threading.get_ident():
            raise RuntimeError(
                f"the controller's state belongs to {self._thread.name}; "
                f"{threading.current_thread().name} must post events instead"
            )

    def _next_deadline(self, now: float) -> float:
        deadline = self._next_commit
        if self._retries and self._retries[0][0] < deadline:
            deadline = self._retries[0][0]
        if self._close_requested is not None:
            deadline = min(deadline, now + 0.05)
        return deadline

    def _handle(self, event: ControllerEvent) -> None:
        if isinstance(event, WorkDone):
            self._on_work_done(event)
            return
        # Anything else may change the assignment, the lifecycle or the backlog.
        self._pauses_stale = True
        if isinstance(event, RecordsPolled):
            self._on_records(event)
        elif isinstance(event, CommitResult):
            self._on_commit_result(event)
        elif isinstance(event, PartitionsAssigned):
            self._on_assigned(event)
        elif isinstance(event, PartitionsRevoked):
            self._on_revoked(event)
        elif isinstance(event, PartitionsLost):
            for tp in event.tps:
                self._forget(tp)
        elif isinstance(event, PositionsReached):
            for tp, epoch, offset in event.positions:
                state = self._partitions.get(tp)
                if state is not None and state.epoch == epoch:
                    state.read_to(offset)
        elif isinstance(event, Control):
            self._on_control(event)
        elif isinstance(event, PollerFailed):
            raise InternalError(f"the Kafka poller failed: {event.error}") from event.error

    # -- records in -----------------------------------------------------------------------------

    def _on_records(self, event: RecordsPolled) -> None:
        ordering = self._options.ordering
        shards = self._shards
        for tp, (epoch, messages) in event.batches.items():
            state = self._partitions.get(tp)
            if state is None or state.epoch != epoch:
                self._to_release += len(messages)
                continue
            fresh = state.accept(messages)
            skipped = len(messages) - len(fresh)
            if skipped:
                self._skipped += skipped
                self._to_release += skipped
            shards.add(
                tp, [WorkItem(m, tp, shard_key_for(ordering, tp, m.key()), epoch) for m in fresh]
            )
            self._registered += len(fresh)

    def _on_assigned(self, event: PartitionsAssigned) -> None:
        for assignment in event.assignments:
            tp, committed, metadata = (
                assignment.tp,
                assignment.committed_offset,
                assignment.metadata,
            )
            restored: tuple[int, ...] | list[int] = ()
            highest = -1 if committed is None else committed - 1
            if committed is not None and metadata:
                try:
                    decoded = decode_offset_map(committed, metadata)
                except OffsetDecodeError as exc:
                    if self._options.invalid_metadata_policy is InvalidMetadataPolicy.FAIL:
                        raise InternalError(
                            f"{tp[0]}[{tp[1]}]: committed offset {committed} carries metadata "
                            f"that cannot be decoded ({exc}); set "
                            "Options(invalid_metadata_policy=REPLAY) to replay instead"
                        ) from exc
                    log.error(
                        "%s[%d]: cannot decode the offset map committed at offset %d (%s); "
                        "replaying everything from that offset",
                        *tp,
                        committed,
                        exc,
                    )
                else:
                    restored = decoded.incomplete
                    highest = decoded.highest_seen
            self._forget(tp)
            self._partitions[tp] = PartitionState(
                tp,
                assignment.epoch,
                committed_offset=committed,
                restored_incomplete=restored,
                restored_highest=highest,
            )

    def _on_revoked(self, event: PartitionsRevoked) -> None:
        offsets = []
        for tp in event.tps:
            state = self._partitions.get(tp)
            if state is not None and (state.dirty or state.pending_commits):
                plan = self._plan(state)
                if plan is not None:
                    state.commit_sent(plan.offset, plan.metadata, self._clock.monotonic())
                    offsets.append((tp, plan.offset, plan.metadata))
                    self._commits_sent += 1
            self._forget(tp)
        event.reply.set_result(offsets)

    def _forget(self, tp: TopicPartition) -> None:
        state = self._partitions.pop(tp, None)
        if state is None:
            return
        self._to_release += self._shards.remove_partition(tp)
        if self._blocked.pop(tp, None) is not None:
            self._shards.unpark(tp)
        kept = [entry for entry in self._retries if entry[2].tp != tp]
        if len(kept) != len(self._retries):
            self._to_release += len(self._retries) - len(kept)
            heapq.heapify(kept)
            self._retries = kept

    # -- dispatch and results -------------------------------------------------------------------

    def _dispatch(self) -> None:
        if self.lifecycle is not Lifecycle.RUNNING and self.lifecycle is not Lifecycle.DRAINING:
            return
        shards = self._shards
        take = shards.take
        blocked = self._blocked
        capacity = self._runner.capacity + self._runner.backlog
        batch_size = self._options.batch_size
        submit = self._runner.submit
        while self._batches_in_flight < capacity:
            items: list[WorkItem] = []
            while len(items) < batch_size:
                item = take(blocked)
                if item is None:
                    break
                items.append(item)
            if not items:
                return
            context = PollContext(
                [
                    RecordContext(i.message, i.attempts, i.last_failure, i.last_failure_at)
                    for i in items
                ]
            )
            self._batches_in_flight += 1
            self._records_in_flight += len(items)
            submit(items, context)

    def _on_work_done(self, event: WorkDone) -> None:
        self._batches_in_flight -= 1
        self._records_in_flight -= len(event.items)
        error = event.error
        partitions = self._partitions
        for item in event.items:
            state = partitions.get(item.tp)
            if state is None or state.epoch != item.epoch:
                self._stale += 1
                self._to_release += 1
                continue
            if error is None:
                self._succeeded += 1
                self._to_release += 1
                state.succeeded(item.offset)
                self._shards.finished(item)
                if self._blocked and not state.blocked and item.tp in self._blocked:
                    del self._blocked[item.tp]
                    self._shards.unpark(item.tp)
            else:
                self._failed += 1
                self._schedule_retry(item, error, event.finished_at)

    def _schedule_retry(self, item: WorkItem, error: BaseException, finished_at: float) -> None:
        item.attempts += 1
        item.last_failure = error
        item.last_failure_at = self._clock.now()
        context = RecordContext(item.message, item.attempts, error, item.last_failure_at)
        delay = retry_delay(self._options, error, context)
        log.log(
            logging.DEBUG if isinstance(error, Retry) else logging.WARNING,
            "%s[%d]@%d failed (attempt %d), retrying in %.3fs: %r",
            *item.tp,
            item.offset,
            item.attempts,
            delay,
            error,
        )
        self._shards.retry_later(item)
        heapq.heappush(self._retries, (finished_at + delay, next(self._retry_seq), item))

    def _release_due_retries(self, now: float) -> None:
        retries = self._retries
        due = []
        while retries and retries[0][0] <= now:
            due.append(heapq.heappop(retries)[2])
        # Each goes back to the front of its shard: the highest offset first, so that records of
        # a failed batch end up in offset order again.
        due.sort(key=lambda item: item.offset, reverse=True)
        for item in due:
            state = self._partitions.get(item.tp)
            if state is None or state.epoch != item.epoch:
                self._to_release += 1
                continue
            self._shards.retry_now(item)

    # -- commits ------------------------------------------------------------------------------

    def _plan(self, state: PartitionState) -> CommitPlan | None:
        plan = plan_commit(
            state.incomplete.below(state.highest_succeeded),
            state.highest_succeeded,
            max_metadata_bytes=self._options.max_metadata_bytes,
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
        state.metadata_size = plan.size
        state.metadata_status = plan.status.name.lower()
        too_big = plan.status is not MetadataStatus.FITS
        tp = state.tp
        if too_big and not state.blocked:
            state.blocked = True
            self._blocked[tp] = state.highest_succeeded
            log.warning(
                "%s[%d]: offset map is %d bytes (%s, limit %d): only records below offset %d "
                "run until it shrinks%s",
                *tp,
                plan.size,
                plan.status.name,
                self._options.max_metadata_bytes,
                state.highest_succeeded,
                "; committing the offset without it" if plan.metadata == "" else "",
            )
        elif not too_big and state.blocked:
            state.blocked = False
            if self._blocked.pop(tp, None) is not None:
                self._shards.unpark(tp)
        return plan

    def _commit_dirty(self, *, final: bool = False) -> None:
        now = self._clock.monotonic()
        offsets = []
        for tp, state in self._partitions.items():
            if not state.dirty:
                continue
            plan = self._plan(state)
            if plan is None:
                continue
            sent_at = state.pending_commits.get((plan.offset, plan.metadata))
            if not final and sent_at is not None and now - sent_at[1] < PENDING_COMMIT_TIMEOUT:
                continue  # the same commit is on its way; its answer decides
            state.commit_sent(plan.offset, plan.metadata, now)
            offsets.append((tp, plan.offset, plan.metadata))
        if offsets:
            self._commits_sent += len(offsets)
            self._committer.commit(offsets, final=final)

    def _on_commit_result(self, event: CommitResult) -> None:
        for tp, offset, metadata, error in event.results:
            state = self._partitions.get(tp)
            if error is None:
                self._commits_acked += 1
            else:
                self._commit_failures += 1
                log.warning(
                    "commit of %s[%d]@%d failed (retried at the next interval): %s",
                    *tp,
                    offset,
                    error,
                )
            if state is not None:
                state.commit_acknowledged(offset, metadata, ok=error is None)

    # -- back-pressure ------------------------------------------------------------------------

    def _starving(self) -> bool:
        """Workers are idle while records wait: every waiting record is behind a busy lane."""
        return (
            self._batches_in_flight < self._runner.capacity + self._runner.backlog
            and self._shards.waiting > 0
            and not self._shards.has_ready()
        )

    def _update_pauses(self) -> None:
        assigned = self._partitions.keys()
        if self.lifecycle is Lifecycle.RUNNING:
            cap = partition_cap(
                self._options.buffer_limit, len(assigned), self._options.fetch_batch_size
            )
            wanted = partitions_to_pause(
                self._shards.waiting_by_tp,
                assigned,
                self._paused,
                cap,
                crowding=self._options.ordering is ProcessingOrder.PARTITION or self._starving(),
            )
        else:
            wanted = frozenset(assigned)
        if wanted != self._paused:
            self._pauses += len(wanted - self._paused)
            self._paused = wanted
            self._poller.send(SetPaused(wanted))

    # -- control and close --------------------------------------------------------------------

    def _on_control(self, event: Control) -> None:
        action = event.action
        if action == "statistics":
            event.reply.set_result(self.statistics())
        elif action == "pause":
            if self.lifecycle is Lifecycle.RUNNING:
                self.lifecycle = Lifecycle.PAUSED
            event.reply.set_result(self.lifecycle)
        elif action == "resume":
            if self.lifecycle is Lifecycle.PAUSED:
                self.lifecycle = Lifecycle.RUNNING
            event.reply.set_result(self.lifecycle)
        elif action == "close":
            if self._close_requested is not None:
                # Already closing: answer when the first close finishes.
                self._close_requested.reply.add_done_callback(
                    lambda _: event.reply.set_result(None)
                )
                return
            self._begin_close(event)
        else:  # pragma: no cover - the facade sends only the actions above
            event.reply.set_exception(ValueError(f"unknown control action {action!r}"))

    def _begin_close(self, event: Control) -> None:
        self._close_requested = event
        timeout = self._options.shutdown_timeout if event.timeout is None else event.timeout
        self._close_deadline = self._clock.monotonic() + timeout
        if event.drain:
            self.lifecycle = Lifecycle.DRAINING
            return
        self.lifecycle = Lifecycle.CLOSING
        # Not started yet: left for the next owner of the partition (they stay uncommitted).
        for tp in list(self._partitions):
            self._to_release += self._shards.remove_partition(tp)

    def _close_step(self, now: float) -> bool:
        """Advance the close; True when the controller may stop."""
        if self._final_commit_deadline is None:
            if self.lifecycle is Lifecycle.DRAINING:
                if (self._shards.waiting or self._retries or self._records_in_flight) and (
                    now < self._close_deadline
                ):
                    return False
                self.lifecycle = Lifecycle.CLOSING
            if self._records_in_flight and now < self._close_deadline:
                return False
            if self._records_in_flight or self._shards.waiting or self._retries:
                log.warning(
                    "closing with %d records in flight, %d waiting and %d waiting for a retry: "
                    "they are not committed and will be processed again",
                    self._records_in_flight,
                    self._shards.waiting,
                    len(self._retries),
                )
            self._runner.stop(timeout=0.0 if self._records_in_flight else 1.0)
            self._commit_dirty(final=True)
            self._final_commit_deadline = now + FINAL_COMMIT_TIMEOUT
            return False
        pending = any(state.pending_commits for state in self._partitions.values())
        if pending and now < self._final_commit_deadline:
            return False
        if pending:
            log.warning("the final commit was not acknowledged in time")
        self._poller.send(StopPoller())
        if not self._poller.join(STOP_TIMEOUT):
            log.warning("the poller did not stop in time")
        return True

    def _emergency_stop(self) -> None:
        """After a failure: stop the workers and the poller without committing."""
        try:
            self._runner.stop(timeout=STOP_TIMEOUT)
        finally:
            self._poller.send(StopPoller())
            self._poller.join(STOP_TIMEOUT)

    def _answer_pending_controls(self) -> None:
        while True:
            try:
                event = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(event, Control):
                if event.action == "statistics":
                    event.reply.set_result(self.statistics())
                else:
                    event.reply.set_result(self.lifecycle)
            elif isinstance(event, PartitionsRevoked):
                event.reply.set_result([])

    # -- views --------------------------------------------------------------------------------

    def statistics(self) -> Statistics:
        retry_waiting = len(self._retries)
        return Statistics(
            lifecycle=self.lifecycle,
            records_registered=self._registered,
            records_skipped=self._skipped,
            records_succeeded=self._succeeded,
            records_failed=self._failed,
            results_stale=self._stale,
            waiting=self._shards.waiting,
            in_flight=self._records_in_flight,
            retry_waiting=retry_waiting,
            held=self._shards.waiting + self._records_in_flight + retry_waiting,
            shards=len(self._shards),
            commits_sent=self._commits_sent,
            commits_acknowledged=self._commits_acked,
            commit_failures=self._commit_failures,
            paused_partitions=len(self._paused),
            partition_pauses=self._pauses,
            blocked_partitions=len(self._blocked),
            partitions=tuple(s.snapshot() for s in self._partitions.values()),
        )

    def __repr__(self) -> str:
        return (
            f"<Controller {self.lifecycle.name} partitions={len(self._partitions)} "
            f"waiting={self._shards.waiting} in_flight={self._records_in_flight} "
            f"retries={len(self._retries)}>"
        )
