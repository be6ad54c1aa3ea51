"""Controller: the loop, the routing of events, and close (thread ``<name>-controller``).

It owns the work state and is the only thread that changes it, one event at a time, through
parts that each own one kind of state: the partitions (``work/partitions.py``), the shards
(``work/shards.py``), the retry queue (``work/retry_queue.py``), the in-flight table
(``work/inflight.py``), the commit tracker (``work/commit_tracker.py``) and the counters.
What happens to a finished record is decided by ``work/outcomes.decide``; the controller
carries it out.
Other threads only post events (:meth:`Controller.post`); the controller answers through
futures and by sending commands to the poller, commits to the committer and batches to the
runner.
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from parallel_consumer._clock import Clock
from parallel_consumer._events import (
    CommitResult,
    Control,
    ControllerEvent,
    DeadlineExtended,
    OutputsDelivered,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    PollerCommand,
    PollerFailed,
    PositionsReached,
    ProducerFailed,
    RecordsPolled,
    RecordUnreadable,
    Release,
    RunDone,
    SetPaused,
    StopPoller,
    WorkDone,
    WorkDoneMany,
)
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.dead_letter import Reason
from parallel_consumer.engine.closing import STOP_TIMEOUT, Closing, Step
from parallel_consumer.engine.letters import DeadLetters, Letter
from parallel_consumer.errors import (
    DeadLetter,
    DeadlineExceeded,
    InternalError,
    RetriesExhausted,
    Retry,
    Skip,
)
from parallel_consumer.health import (
    HealthReport,
    PartitionStall,
    health_report,
    partition_health,
    stalled_error,
)
from parallel_consumer.hooks import CallSampling, Hooks, NoHooks, StallReport, active_hooks
from parallel_consumer.kafka.committers import Committer
from parallel_consumer.kafka.producer import Outputs
from parallel_consumer.options import (
    InvalidMetadataPolicy,
    Options,
    ProcessingOrder,
    StallPolicy,
)
from parallel_consumer.produce import ProduceError, ProduceResult, ProducerRecord, outputs_of
from parallel_consumer.runners.base import CallCancelled, Handler, Runner
from parallel_consumer.status import Lifecycle, PollerStatistics, Statistics, assemble_statistics
from parallel_consumer.work.backpressure import Pauses
from parallel_consumer.work.chains import Bundles, Chains
from parallel_consumer.work.commit_tracker import CommitAnswer, CommitTracker, OffsetCommit
from parallel_consumer.work.counters import Counters
from parallel_consumer.work.credit import credit_chunk
from parallel_consumer.work.deadlines import Deadlines
from parallel_consumer.work.inflight import Batch, InFlight
from parallel_consumer.work.item import TopicPartition, WorkItem
from parallel_consumer.work.outcomes import (
    DeadLetterNow,
    Decision,
    RetryAt,
    SkipNow,
    StopNow,
    decide,
)
from parallel_consumer.work.outputs import Pending, PendingOutputs, RunOutputs, TransactionGate
from parallel_consumer.work.partitions import PartitionState, RecordTotals, restored_state
from parallel_consumer.work.progress import ProgressWatch, Stall
from parallel_consumer.work.retry_queue import RetryQueue
from parallel_consumer.work.runs import Run, Runs
from parallel_consumer.work.service import MIN_SERVICE, ServiceTime
from parallel_consumer.work.shards import ShardMap
from parallel_consumer.work.stall import StallWatch

__all__ = ["Controller"]

log = logging.getLogger("parallel_consumer")

#: A record's failed attempts are logged at INFO, and at WARNING from this attempt on.
WARN_FROM_ATTEMPT = 3
#: Roughly what handing one call to a worker thread and its result back costs (seconds): two
#: queue hand-overs and two thread wake-ups. Calls much shorter than this go out in chunks.
THREAD_HOP = 60e-6
#: Most calls in one chunk.
MAX_CHUNK = 64
#: Adaptive dispatch (docs/performance.md#adaptive-dispatch). It needs a runner that can take
#: over the rest of a chunk whose current call hangs (``release_stuck``).
ADAPTIVE_DISPATCH = True
#: A chunk a worker has run for longer than this is stuck (a call that hangs, or calls that
#: turned slow): its calls not started yet go to other workers, one by one, and the finished
#: ones are reported (real seconds).
STUCK_AFTER = 0.02
#: How often the controller looks for stuck chunks while any is running (real seconds).
STUCK_CHECK_EVERY = 0.01
#: An engine that finished everything it polled commits at once, if the last commit is this
#: fraction of commit_interval old (docs/commits.md#when).
IDLE_COMMIT_AFTER = 0.1
#: Runs (docs/performance.md#runs): a partition's records go to one worker as a run, in offset
#: order, while calls are this many times shorter than a thread hop (chunk_size >= this: calls
#: of 30 µs at most, where a run is faster than per-record dispatch even with few partitions).
RUNS = True
RUN_FROM_CHUNK = 2
#: A run whose calls take this long on average, once it ran for STUCK_AFTER, is detached: its
#: calls are no longer short, and must not run one after another while workers are idle.
RUN_SLOW_CALL = THREAD_HOP
#: Chains (docs/performance.md#chains): while calls are not short enough for chunks, a worker
#: that takes a record of a KEY or PARTITION lane also takes the records waiting behind it, up
#: to CHAIN_SECONDS of calls and CHAIN_MOST records, and runs them one after another, each only
#: once the one before succeeded: no round trip through the controller between two records of
#: a lane. CHAIN_SECONDS is as long as a chunk may run before it counts as stuck: lanes share
#: the workers at that grain, and a chain's results normally come in one report. A chain's
#: records hold credit until it reports: chains out together (one per slot of the call limit)
#: hold at most half of max_buffered_records, so that the poller can still fetch.
CHAINS = True
CHAIN_SECONDS = STUCK_AFTER
CHAIN_MOST = 16
#: While chains are on, and there are at most this many lanes per call slot, the next lane to
#: run is the one with the most records waiting (ShardMap.take_longest): a burst then ends
#: when its total work allows, not when its longest lane does. (With many more lanes than
#: workers, each lane is short and the order matters little.)
LONGEST_FIRST_LANES = 8
#: While the next lane is the longest and the lanes are at most the call slots (workers and
#: backlog) plus the backlog once more, at most this many calls (or chains) wait in the
#: runner's backlog for a worker. A hand-out to the backlog picks its lane before a worker is
#: free; with a backlog of a quarter of the workers and as many lanes as slots, every lane not
#: running would sit in the backlog, in the order it was picked, and the engine would never
#: have a choice (W1 KEY-20: 20 lanes, 16 workers and 4 backlog slots ran round-robin, its
#: lanes ending up to 0.3 s apart). Two keep a worker that frees from waiting for the
#: controller.
LONGEST_FIRST_BACKLOG = 2
#: Bundles (docs/performance.md#bundles): while calls are too long for chunks and far more
#: records are ready than the workers can start (at least BUNDLE_READY times as many as a
#: bundle for every call slot), a worker gets a few calls of different lanes at once, run one
#: after another: the controller hands out and settles them with one hop each way instead of
#: one per call, which at a hundred workers and calls of milliseconds is most of its work. A
#: bundle holds at most BUNDLE_MOST calls and BUNDLE_SECONDS of them, so that it does not
#: count as stuck for being a bundle.
BUNDLES = True
BUNDLE_MOST = 4
BUNDLE_SECONDS = 0.75 * STUCK_AFTER
BUNDLE_READY = 2


class PollerPort(Protocol):
    """What the controller needs of the poller."""

    def send(self, command: PollerCommand) -> None: ...

    def join(self, timeout: float) -> bool: ...

    def statistics(self) -> PollerStatistics: ...


class Controller:
    """The engine's single decision maker. See ARCHITECTURE.md, "Threads and who owns what"."""

    def __init__(
        self,
        options: Options,
        *,
        runner: Runner,
        poller: PollerPort,
        committer: Committer,
        clock: Clock,
        hooks: Hooks | None = None,
        name: str | None = None,
        sampling: CallSampling | None = None,
    ) -> None:
        self._options = options
        self._runner = runner
        self._poller = poller
        self._committer = committer
        self._clock = clock
        self._hooks = hooks or NoHooks()
        # The per-call and per-record hooks, None unless implemented: skipped on the hot path.
        active = active_hooks(self._hooks)
        self._on_dispatch = self._hooks.on_dispatch if "on_dispatch" in active else None
        self._on_work_done = self._hooks.on_work_done if "on_work_done" in active else None
        self._on_success = self._hooks.on_success if "on_success" in active else None
        #: Metrics' sample of calls (see CallSampling), and when the next periodic one is due.
        self._sampling = sampling
        self._next_sample = 0.0
        #: Per partition since the start, across assignments: records processed, attempts
        #: failed (Statistics.partition_totals; metrics read them instead of a hook per call).
        self._totals: dict[TopicPartition, RecordTotals] = {}
        #: Time per call as the runners report it. Its windows are real time (they are about
        #: threads and pauses, not the engine's clock); tests may replace _service_clock.
        self._service_time = ServiceTime(STUCK_CHECK_EVERY)
        self._service_clock: Callable[[], float] = time.monotonic
        #: Calls per hand-over to the runner: 1, or more for calls much shorter than a thread
        #: hop (adaptive dispatch; only runners with ``submit_chunk``, and no deadlines).
        self.chunk_size = 1
        self._chunks = False
        #: The runner takes many calls at once (``submit_many``); decided in start().
        self._submit_many = False
        #: When to look for stuck chunks next (time.monotonic(): it is about real threads).
        self._next_stuck_check = 0.0
        #: Chunks were handed to the runner since nothing was last in flight.
        self._chunks_out = False
        #: Runs of consecutive records (work/runs.py); decided in start().
        self._runs = Runs()
        self._runs_on = False
        #: Calls of detached runs, now single calls in the in-flight table: batch id -> run.
        self._adopted: dict[int, Run] = {}
        #: Chains out (CHAINS). A chain holds one worker however many of its calls are in
        #: flight: the call limit counts ``_chains.extra`` out of the in-flight table.
        self._chains = Chains()
        self._chains_on = False
        self._chain_most = CHAIN_MOST
        #: Bundles out (BUNDLES), counted like chains: one worker each.
        self._bundles = Bundles()
        self._bundles_on = False
        self._bundle_most = BUNDLE_MOST
        self._bundle_ready = BUNDLE_READY
        #: on_stall=DEAD_LETTER: records whose young call was given its chance once already.
        self._stall_chances: set[tuple[TopicPartition, int]] = set()
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
        self._retries = RetryQueue()
        self._in_flight = InFlight()
        self._commits = CommitTracker(options.max_metadata_bytes)
        self._counters = Counters()
        #: Credit not yet returned to the poller (records that left the engine).
        self._to_release = 0
        self._credit_chunk = credit_chunk(options.buffer_limit, options.fetch_batch_size)
        self._pauses = Pauses(
            options.buffer_limit,
            options.fetch_batch_size,
            partition_order=options.ordering is ProcessingOrder.PARTITION,
        )
        self._stall = StallWatch()
        #: Deadlines of calls in flight, and calls still running past theirs (docs/deadlines.md).
        self._deadlines = Deadlines()
        self._timeout = options.processing_timeout
        #: Per-partition progress, for stall detection and health() (docs/health.md).
        self._progress = ProgressWatch(options.stall_threshold)
        #: When to observe every partition's progress next (None: nothing to watch).
        self._progress_at: float | None = 0.0
        #: Partitions whose lowest unfinished offset may have changed: observed this turn, so
        #: stall clocks start when it happens, not at the next full pass.
        self._progress_moved: set[TopicPartition] = set()
        self._progress_every = min(1.0, (options.stall_threshold or 10.0) / 10)
        self._next_commit = 0.0
        self._close: Closing | None = None
        # -- poll_and_produce (None / unused for poll) --
        self._outputs: Outputs | None = None
        self._produces = False
        self._produce_runs = False
        self._on_produced: Callable[[ProduceResult], object] | None = None
        self._pending = PendingOutputs()
        #: The transactional mode's gate (None in the consumer commit modes).
        self._gate: TransactionGate | None = None
        #: Revokes waiting for the transaction that commits their partitions (transactional),
        #: with the epoch of each partition when the revoke came.
        self._revokes: list[tuple[PartitionsRevoked, dict[TopicPartition, int]]] = []
        #: Transactional mode: the failures of records not yet finished, by (tp, offset). An
        #: aborted transaction rewinds their partitions; the records come again and keep
        #: their attempts (a failed output aborts the transaction it was sent in).
        self._history: dict[tuple[TopicPartition, int], tuple[int, BaseException, Any, Any]] = {}
        #: Dead letters being written or waiting to be written again (None: dead-lettering off).
        self._letters: DeadLetters | None = None

    # -- other threads ------------------------------------------------------------------------

    def post(self, event: ControllerEvent) -> None:
        """Thread-safe: queue an event for the controller."""
        self._inbox.put(event)

    def start(
        self,
        handler: Handler,
        *,
        runner: Runner | None = None,
        thread: bool = True,
        outputs: Outputs | None = None,
        on_produced: Callable[[ProduceResult], object] | None = None,
        produces: bool = True,
        dead_letters: DeadLetters | None = None,
    ) -> None:
        """Start the runner and (unless ``thread=False``, for tests stepping with
        :meth:`run_once`) the controller thread. ``runner`` replaces the one given at
        construction (the facade picks the runner once it sees the handler). With ``outputs``
        the handler's return values are outputs to produce (``poll_and_produce``);
        ``on_produced`` sees each delivered one. With ``dead_letters``, failed records may be
        dead-lettered through ``outputs`` (then ``produces=False`` for a ``poll`` handler, whose
        return values are not outputs)."""
        if runner is not None:
            self._runner = runner
        self._outputs = outputs
        self._produces = outputs is not None and produces
        self._letters = dead_letters
        self._on_produced = on_produced
        if outputs is not None and outputs.transactional:
            self._gate = TransactionGate()
        # Adaptive dispatch needs a runner that runs chunks; with deadlines every call goes
        # alone (a deadline measures the call, not a wait behind other calls of a chunk). It is
        # off (ADAPTIVE_DISPATCH) until a hung call can no longer strand the rest of its chunk.
        self._chunks = (
            ADAPTIVE_DISPATCH
            and self._timeout is None
            and callable(getattr(self._runner, "submit_chunk", None))
            and callable(getattr(self._runner, "release_stuck", None))
        )
        # Runs carry no per-call bookkeeping: no per-call hooks, one record a call. With
        # poll_and_produce a run's records finish once their outputs are acknowledged
        # (RunOutputs); not in PARTITION order, where a partition's next record may only run
        # once the outputs of the one before are (a failed output retries its record), nor
        # with on_produced, which sees each output with its call.
        self._produce_runs = (
            self._produces
            and self._on_produced is None
            and self._options.ordering is not ProcessingOrder.PARTITION
        )
        self._runs_on = (
            RUNS
            and self._chunks
            and callable(getattr(self._runner, "submit_run", None))
            and getattr(self._runner, "runs", False) is True
            and (self._produce_runs or (not self._produces and self._gate is None))
            and self._options.batch_size == 1
            and self._on_dispatch is None
            and self._on_work_done is None
            and self._on_success is None
        )
        # Chains hand a lane's next records to the worker of the one before; outputs must be
        # acknowledged before a lane's next record runs (a failed output retries its record),
        # so not with poll_and_produce, nor in batches.
        self._chains_on = (
            CHAINS
            and self._chunks
            and callable(getattr(self._runner, "submit_chain", None))
            and callable(getattr(self._runner, "take_back_chain", None))
            and self._options.ordering is not ProcessingOrder.UNORDERED
            and self._options.batch_size == 1
            and not self._produces
            and self._gate is None
        )
        # A runner that takes many calls at once: one hand-over for a dispatch pass.
        self._submit_many = callable(getattr(self._runner, "submit_many", None))
        slots = self._runner.capacity + self._runner.backlog
        if self._chains_on:
            self._chain_most = min(CHAIN_MOST, self._options.buffer_limit // (2 * slots))
            self._chains_on = self._chain_most > 1
        # Bundles: calls of different lanes behind one another on one worker, as chunks are.
        # They hold credit until they report, as chains do.
        self._bundle_most = min(BUNDLE_MOST, self._options.buffer_limit // (2 * slots))
        self._bundles_on = BUNDLES and self._chunks and self._bundle_most > 1
        self._runner.start(handler, self.post)
        self.lifecycle = Lifecycle.RUNNING
        self._next_commit = self._clock.monotonic() + self._options.commit_every
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
            while not self.run_once(block=True):
                pass
        except BaseException as exc:
            log.error("controller failed", exc_info=True)
            if isinstance(exc, InternalError | RetriesExhausted):
                self._failure = exc
            else:
                self._failure = InternalError(f"the controller failed: {exc!r}")
                self._failure.__cause__ = exc
            self._emergency_stop()
        finally:
            for revoke, _ in self._revokes:
                revoke.reply.set_result(None)
            if self._outputs is not None:
                self._outputs.close(abort=self._failure is not None)
            self.lifecycle = Lifecycle.CLOSED
            if self._close is not None:
                self._close.reply.set_result(None)
            self._answer_pending_controls()
            if self._failure is not None:
                self.stopped.set_exception(self._failure)
            else:
                self.stopped.set_result(None)

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
        for tp in self._commits.take_to_unpark():
            self._shards.unpark(tp)
        due = self._deadlines.next_at()
        if due is not None and now >= due:
            self._expire_calls(now)
        if self._chunks:
            self._release_stuck_chunks()
        self._dispatch(now)
        if now >= self._next_commit:
            if self._gate is None:
                self._send_commits(self._commits.due(self._partitions.values(), now))
            elif self._gate.outputs or any(s.dirty for s in self._partitions.values()):
                self._gate.wanted = True
            self._next_commit = now + self._options.commit_every
        elif self._gate is None and now >= self._idle_commit_at() and self._drained():
            # Everything polled is finished: commit it now, not up to commit_interval later
            # (at most every tenth of commit_interval).
            commits = self._commits.due(self._partitions.values(), now)
            if commits:
                self._send_commits(commits)
                self._next_commit = now + self._options.commit_every
        outputs = self._outputs
        if outputs is not None and outputs.backlog:
            outputs.pump()
        if self._gate is not None:
            self._advance_transaction(now)
        if self._pauses.due(now, self._starving):
            self._update_pauses(now)
        release = self._to_release
        if release and (release >= self._credit_chunk or self._shards.waiting < self._credit_chunk):
            self._poller.send(Release(release))
            self._to_release = 0
        self._watch_for_stall(now)
        if self._progress_at is not None and now >= self._progress_at:
            self._watch_partitions(now)
        elif self._progress_moved:
            self._watch_partitions(now, self._progress_moved)
        self._progress_moved.clear()
        return self._close is not None and self._close_step(now)

    def _assert_owner(self) -> None:
        owner = self._thread.ident
        if owner is not None and owner != threading.get_ident():
            raise RuntimeError(
                f"the controller's state belongs to {self._thread.name}; "
                f"{threading.current_thread().name} must post events instead"
            )

    def _idle_commit_at(self) -> float:
        """When an engine that finished everything may commit, ahead of ``_next_commit``."""
        every = self._options.commit_every
        return self._next_commit - every + every * IDLE_COMMIT_AFTER

    def _drained(self) -> bool:
        """Nothing polled is waiting, running, waiting for a retry or for its outputs."""
        return not (
            self._shards.waiting
            or self._in_flight
            or self._runs
            or self._retries
            or self._pending
            or (self._letters is not None and len(self._letters) > 0)
        )

    def _next_deadline(self, now: float) -> float:
        deadline = self._next_commit
        if self._gate is None and self._drained():
            idle_at = self._idle_commit_at()
            # (Only ahead of now: a turn at or after idle_at has sent what it could; a commit
            # still awaiting its answer must not make the loop spin until the answer comes.)
            if now < idle_at < deadline and any(s.dirty for s in self._partitions.values()):
                deadline = idle_at
        due = self._retries.next_due()
        if due is not None and due < deadline:
            deadline = due
        for wake in (
            self._pauses.wake_at(),
            self._stall.wake_at(),
            self._deadlines.next_at(),
            self._progress_at,
        ):
            # A paused partition resumes once its backlog drained, a stall is reported and a
            # call past its deadline is failed, even if no event arrives to wake the loop.
            if wake is not None and wake < deadline:
                deadline = wake
        if self._close is not None:
            deadline = min(deadline, now + 0.05)
        if self._chunks_out:
            # Chunks were handed out and calls are in flight: look for stuck ones regularly
            # (a chunk reports only when it ends, so no event may come meanwhile).
            if self._in_flight or self._runs:
                deadline = min(deadline, now + STUCK_CHECK_EVERY)
            else:
                self._chunks_out = False
        if self._outputs is not None and self._outputs.backlog:
            deadline = min(deadline, now + 0.005)  # outputs wait for room in the producer
        return deadline

    def _handle(self, event: ControllerEvent) -> None:
        if isinstance(event, RunDone):
            self._on_run_done(event)
            return
        if isinstance(event, WorkDoneMany):
            self._on_chunk_done(event)
            return
        if isinstance(event, WorkDone):
            if event.took:
                self._observe_service(event.took)
            if self._bundles and event.batch in self._bundles:
                # A call of a stuck bundle that another worker ran reports alone; it began
                # there, not at the bundle's hand-out.
                self._bundles.over(event.batch)
                if event.took:
                    self._in_flight.began(event.batch, event.finished_at - event.took)
            self._work_done(
                event.batch, event.errors, event.value, event.finished_at, event.partial
            )
            return
        if isinstance(event, OutputsDelivered):
            self._on_delivered(event)
            return
        if isinstance(event, DeadlineExtended):
            self._deadlines.extend(event.batch, event.until)
            return
        # Anything else may change the assignment, the lifecycle or the backlog.
        self._pauses.stale = True
        if isinstance(event, RecordsPolled):
            self._on_records(event)
        elif isinstance(event, CommitResult):
            self._on_commit_result(event.answers)
        elif isinstance(event, PartitionsAssigned):
            self._on_assigned(event)
        elif isinstance(event, PartitionsRevoked):
            self._on_revoked(event)
        elif isinstance(event, PartitionsLost):
            for tp in event.tps:
                self._forget(tp)
            self._forget_history(event.tps)
            if self._gate is not None and (self._gate.outputs or self._pending):
                # Their outputs may be in the open transaction; their offsets can no longer
                # commit with them. Abort it: the partitions kept start again from their
                # committed offsets.
                self._gate.abort_soon()
            self._hooks.on_rebalance("lost", event.tps)
        elif isinstance(event, PositionsReached):
            for tp, epoch, offset in event.positions:
                state = self._partitions.get(tp)
                if state is not None and state.epoch == epoch:
                    state.read_to(offset)
        elif isinstance(event, Control):
            self._on_control(event)
        elif isinstance(event, RecordUnreadable):
            raise InternalError(
                f"{event.tp[0]}[{event.tp[1]}]@{event.offset} cannot be read ({event.error}); "
                "stopping without committing past it. Fix or delete the record (or move the "
                "group's offset past it) and start again"
            )
        elif isinstance(event, PollerFailed):
            raise InternalError(f"the Kafka poller failed: {event.error}") from event.error
        elif isinstance(event, ProducerFailed):
            raise InternalError(event.reason)

    # -- records in, partitions in and out ------------------------------------------------------

    def _on_records(self, event: RecordsPolled) -> None:
        key_order = self._options.ordering is ProcessingOrder.KEY
        shards = self._shards
        counters = self._counters
        for tp, (epoch, messages) in event.batches.items():
            state = self._partitions.get(tp)
            if state is None or state.epoch != epoch:
                self._to_release += len(messages)
                continue
            fresh = state.accept(messages)
            skipped = len(messages) - len(fresh)
            if skipped:
                counters.skipped += skipped
                self._to_release += skipped
            track = self._progress.track(tp)
            if fresh and (track is None or track.lowest is None):
                self._progress_moved.add(tp)
            if self._runs_on and fresh:
                fresh = self._to_runs(tp, epoch, fresh)
                if not fresh:
                    continue
            if key_order:  # shard_key_for's rule, inline: one call less per record
                topic, partition = tp
                items = [WorkItem(m, tp, (topic, partition, m.key()), epoch) for m in fresh]
            else:
                items = [WorkItem(m, tp, tp, epoch) for m in fresh]
            if self._history:
                self._recall_failures(tp, items)
            shards.add(tp, items)
            counters.registered += len(fresh)

    def _to_runs(self, tp: TopicPartition, epoch: int, fresh: list[Any]) -> list[Any]:
        """Queue for runs what of ``fresh`` may go to them; return the records for the lanes.

        A record goes to a run unless its lane has records (waiting, running or waiting for a
        retry): each lane's records are all in runs or all in lanes, in offset order either
        way. A partition with records queued for runs keeps queuing them (behind those), even
        after calls turned long: the queue goes to the lanes as a whole when it is next due
        (:meth:`_start_runs`)."""
        runs = self._runs
        shards = self._shards
        if not runs.busy(tp) and (
            self.chunk_size < RUN_FROM_CHUNK
            or tp in self._commits.blocked
            # (transactional: records that failed before an abort keep their attempts in the
            # lanes, see _recall_failures; runs start again once commits passed them)
            or (self._history and any(k[0] == tp for k in self._history))
        ):
            return fresh
        if shards.stale_held_in(tp) and not runs.busy(tp):
            # (rare: a call of a revoked assignment of ``tp`` still runs; its lane waits for
            # it. A revoke takes the partition's runs back, so none is busy here.)
            return fresh
        lanes = shards.lanes_of(tp)
        taken: list[WorkItem] = []
        if not lanes or self._options.ordering is ProcessingOrder.UNORDERED:
            to_run, to_lanes = fresh, list[Any]()
        elif self._options.ordering is ProcessingOrder.PARTITION:
            idle = shards.take_idle(tp)
            if idle is None:
                return fresh
            # The partition's lane had only records waiting: they run first, then these.
            taken = idle
            to_run, to_lanes = [i.message for i in idle] + fresh, []
        else:
            # A key whose lane only has records waiting joins the runs with them (they come
            # first): otherwise, under a steady flow, lanes would keep their keys for good.
            topic, partition = tp
            has_lane = shards.has_lane
            take_idle = shards.take_idle
            to_run, to_lanes = list[Any](), list[Any]()
            for message in fresh:
                key = (topic, partition, message.key())
                if has_lane(key):
                    idle = take_idle(key)
                    if idle is None:
                        to_lanes.append(message)
                        continue
                    taken.extend(idle)
                    to_run.extend(i.message for i in idle)
                to_run.append(message)
        if to_run:
            runs.queue(tp, epoch, to_run)
            shards.count_waiting(tp, len(to_run))
            self._counters.registered += len(to_run) - len(taken)
        return to_lanes

    def _runs_to_lanes(
        self, tp: TopicPartition, messages: Sequence[Any] = (), *, counted: bool = False
    ) -> None:
        """Put ``messages`` (records of a run that left it, in offset order), then the records
        queued for runs of ``tp``, into their lanes. ``counted``: ``messages`` count as waiting
        already."""
        state = self._partitions[tp]
        epoch = state.epoch
        queued = self._runs.take_queued(tp)
        rest = list(messages)
        if counted and rest:
            self._shards.count_waiting(tp, -len(rest))
        if queued is not None:
            self._shards.count_waiting(tp, -len(queued[1]))
            rest.extend(queued[1])
        if rest:
            self._shards.add(tp, [self._item_of(tp, epoch, m) for m in rest])

    def _item_of(self, tp: TopicPartition, epoch: int, message: Any) -> WorkItem:
        if self._options.ordering is ProcessingOrder.KEY:
            return WorkItem(message, tp, (tp[0], tp[1], message.key()), epoch)
        return WorkItem(message, tp, tp, epoch)

    def _start_runs(self) -> int:
        """Hand out a run for each partition with records queued and none out, as far as
        the call limit allows; returns how many runs are out."""
        runs = self._runs
        queued = runs.queued
        limit = self._call_limit()
        short = self.chunk_size >= RUN_FROM_CHUNK
        blocked = self._commits.blocked
        service = self._service_time.value or THREAD_HOP
        longest = max(MAX_CHUNK, int(STUCK_AFTER / 4 / service))
        sampling = self._sampling
        timed = sampling.slow_after if sampling is not None else None
        distinct = self._produce_runs and self._options.ordering is ProcessingOrder.KEY
        for tp in list(queued):
            if tp in runs.active:
                continue
            if not short or tp in blocked:
                self._runs_to_lanes(tp)
                continue
            if len(self._in_flight) + self._workers_in_runs() >= limit:
                break
            epoch, waiting = queued[tp]
            most = self._distinct_keys(tp, waiting, longest) if distinct else longest
            if not most:
                continue  # its next record's key has outputs on their way: wait for them
            if len(waiting) > most:
                popleft = waiting.popleft
                messages = [popleft() for _ in range(most)]
            else:
                del queued[tp]
                messages = list(waiting)
            run = runs.start(tp, epoch, messages, timed=timed)
            if self._produce_runs:
                run.outputs = []
            self._counters.runs += 1
            self._shards.count_waiting(tp, -len(messages))
            self._runner.submit_run(run)  # type: ignore[attr-defined]
            self._chunks_out = True
        return self._workers_in_runs()

    def _distinct_keys(self, tp: TopicPartition, messages: deque[Any], most: int) -> int:
        """How many of ``messages`` from the first may run as one run of poll_and_produce in
        KEY order: up to the first whose key has outputs on their way (held, see RunOutputs)
        or appears before it in the run. A run's records then produce for distinct keys, so
        a failed output retries its record before any later record of its key runs."""
        topic, partition = tp
        is_held = self._shards.is_held
        seen: set[bytes | None] = set()
        add = seen.add
        for index, message in enumerate(itertools.islice(messages, most)):
            key = message.key()
            if key in seen or is_held((topic, partition, key)):
                return index
            add(key)
        return min(most, len(messages))

    def _workers_in_runs(self) -> int:
        """Workers that runs hold, beside the calls of the in-flight table: one per run out,
        but for a detached run whose call in progress is in that table already (adopted): a
        hung call must hold one slot of the call limit, not two."""
        out = len(self._runs.out)
        if self._adopted:
            # (an adopted call abandoned by the stall policy counts as an overrun instead)
            in_flight = self._in_flight
            overrun = self._deadlines.is_overrun
            out -= sum(1 for b in self._adopted if b in in_flight or overrun(b))
        return out

    def _on_run_done(self, event: RunDone) -> None:
        run = event.run
        self._runs.ended(run)
        if event.service:
            self._observe_service(event.service)
        if run.adopted is not None:
            # Detached: its records were settled or went to the lanes then, but for the call
            # that was in progress, which is a single call of the in-flight table now.
            index, batch_id = run.adopted
            self._adopted.pop(batch_id, None)
            value = None
            partial = False
            if event.ok > index:
                errors: tuple[BaseException | None] = (None,)
                if run.outputs is not None:
                    value = run.outputs[index]
            elif event.error is not None:
                errors = (event.error,)
                if run.outputs is not None and len(run.outputs) > index:
                    # It failed its record with PollContext.fail, and returned outputs
                    value, partial = run.outputs[index], True
            else:
                errors = (CallCancelled("the runner stopped before the call started"),)
            self._work_done(batch_id, errors, value, event.finished_at, partial)
            return
        if run.detached:
            return
        tp = run.tp
        state = self._partitions.get(tp)
        if state is None or state.epoch != run.epoch:  # pragma: no cover - forget detaches
            self._counters.stale += len(run) - run.settled
            self._to_release += len(run) - run.settled
            return
        if event.samples and self._sampling is not None:
            self._sample_run(self._sampling, run, event)
        ok = event.ok
        self._settle_run(run, state, ok)
        if ok == len(run):
            return
        # The run ended early: a call failed, or the runner stopped. The failed record and all
        # after it go to the lanes (the failed one busy in its lane, so that the records of
        # its key wait behind it), where failures are handled as for any record.
        error = event.error
        rest = run.messages[ok:]
        if error is None:
            self._runs_to_lanes(tp, rest)
            return
        item = self._item_of(tp, run.epoch, rest[0])
        self._shards.adopt(item)
        self._runs_to_lanes(tp, rest[1:])
        if run.outputs is not None and len(run.outputs) > ok:
            # The call failed its record with PollContext.fail and returned outputs: they are
            # produced, and the failure applies once they are acknowledged, as for any call.
            batch = self._in_flight.add((item,), self._clock.monotonic())
            self._work_done(
                batch.id, (error,), run.outputs[ok], event.finished_at, True, sample=False
            )
            return
        self._failed(item, error, event.finished_at)

    def _settle_run(self, run: Run, state: PartitionState, upto: int) -> None:
        """The calls of ``run`` from its last settled one up to ``upto`` succeeded: their
        records are finished, or (poll_and_produce) finish once their outputs are
        acknowledged."""
        first = run.settled
        if upto <= first:
            return
        run.settled = upto
        if run.outputs is None:
            self._settle_messages(state, run.messages[first:upto])
        else:
            self._run_outputs(run, state, first, upto)

    def _settle_messages(self, state: PartitionState, messages: list[Any]) -> None:
        """Records of ``state``'s partition succeeded, as a stretch (of a run)."""
        count = len(messages)
        offsets = [m.offset() for m in messages]
        highest = max(offsets)  # (a run is in offset order per lane, not across lanes)
        state.succeeded_many(offsets, highest)
        state.totals.succeeded += count
        self._counters.succeeded += count
        self._to_release += count
        tp = state.tp
        track = self._progress.track(tp)
        if track is not None and track.lowest is not None and track.lowest <= highest:
            self._progress_moved.add(tp)
        if self._stall_chances:
            for offset in offsets:
                self._stall_chances.discard((tp, offset))
        blocked = self._commits.blocked
        if blocked and tp in blocked:
            self._commits.after_success(state)

    def _sample_run(self, sampling: CallSampling, run: Run, event: RunDone) -> None:
        """The calls of a run its worker timed, for metrics (see :meth:`_sample`)."""
        finished_at = event.finished_at
        for index, took in event.samples:
            periodic = finished_at >= self._next_sample
            if not periodic and took <= sampling.slow_after:
                continue
            if periodic and sampling.interval is not None:
                self._next_sample = finished_at + sampling.interval
            error = event.error if index == event.ok else None
            try:
                sampling.sample([run.messages[index]], (error,), took, periodic)
            except Exception:
                log.warning("metrics failed to take a sample of a call", exc_info=True)

    def _detach_run(self, run: Run, *, drop: bool) -> None:
        """Take back the records ``run`` has not started: they go to the lanes (or, with
        ``drop``, stay for the partition's next owner: a close without drain). The call in
        progress becomes a single call of the in-flight table; finished records are settled."""
        detached = self._runs.detach(run)
        state = self._partitions.get(run.tp)
        if state is None or state.epoch != run.epoch:  # pragma: no cover - forget detaches
            return
        self._settle_run(run, state, detached.finished.stop)
        if detached.running is not None:
            self._adopt(run, detached.running, lane=True)
        if drop:
            self._to_release += len(detached.drained)
        else:
            self._runs_to_lanes(run.tp, detached.drained)

    def _adopt(self, run: Run, index: int, *, lane: bool) -> WorkItem:
        """The call of ``run``'s record ``index`` is in progress while the run is detached:
        make it a single call of the in-flight table (its lane busy, with ``lane``)."""
        item = self._item_of(run.tp, run.epoch, run.messages[index])
        if lane:
            self._shards.adopt(item)
        else:
            item.in_flight = True
        now = self._clock.monotonic()
        if run.timed is not None and run.call_started:
            # (metrics measure the call from its start, not from now)
            now -= max(0.0, time.perf_counter() - run.call_started)
        batch = self._in_flight.add((item,), now)
        run.adopted = (index, batch.id)
        self._adopted[batch.id] = run
        return item

    def _check_runs(self, real_now: float) -> None:
        """Detach runs whose current call takes long (it hangs), or whose calls turned slow:
        their records not started go to the lanes, and other workers.

        Each look judges the run on what happened since the previous look: stuck if no call
        ended for STUCK_AFTER, slow if the calls that ended since the previous look took more
        than RUN_SLOW_CALL each (once the run is STUCK_AFTER old). A run is detached when a
        later look agrees with an earlier one. A pause of the whole process (a full garbage
        collection takes 20-50 ms, and so can a thread starved of the GIL) makes one look find
        every run slow, and the next finds them fast again."""
        for run in list(self._runs.active.values()):
            started = run.started
            if not started:
                continue
            done = run.done
            if done >= len(run.messages):
                continue  # every call returned: its report is on its way
            if not run.look_at:
                run.look_at, run.look_done = started, 0
            window = real_now - run.look_at
            calls = done - run.look_done
            run.look_at, run.look_done = real_now, done
            if calls or not run.progress_at:
                run.progress_at = real_now
            # (stuck implies slow; both are named for the reader)
            stuck = real_now - run.progress_at > STUCK_AFTER
            slow = real_now - started > STUCK_AFTER and window > RUN_SLOW_CALL * max(1, calls)
            if not (stuck or slow):
                run.slow_since = 0.0
                continue
            if not run.slow_since:
                run.slow_since = real_now
                continue
            if real_now - run.slow_since < STUCK_CHECK_EVERY / 2:
                continue  # (the same look, or one right after it)
            log.debug("%r detached: its calls are no longer short", run)
            self._counters.runs_detached += 1
            self._detach_run(run, drop=False)

    def _recall_failures(self, tp: TopicPartition, items: list[WorkItem]) -> None:
        history = self._history
        for item in items:
            past = history.get((tp, item.offset))
            if past is not None:
                item.attempts, item.last_failure, item.last_failure_at, item.first_failure_at = past

    def _on_assigned(self, event: PartitionsAssigned) -> None:
        fail = self._options.invalid_metadata_policy is InvalidMetadataPolicy.FAIL
        for a in event.assignments:
            self._forget(a.tp)
            state = self._partitions[a.tp] = restored_state(
                a.tp,
                a.epoch,
                a.committed_offset,
                a.metadata,
                fail_on_invalid=fail,
                exact=a.exact_metadata,
            )
            state.totals = self._totals.setdefault(a.tp, state.totals)
        self._hooks.on_rebalance("assigned", [a.tp for a in event.assignments])

    def _on_revoked(self, event: PartitionsRevoked) -> None:
        """The poller waits inside its revoke callback until ``reply`` resolves, running the
        commands it receives meanwhile: the final commit sent here reaches the broker before
        the partitions are let go, and after every commit sent for them earlier.

        Transactional mode: the revoked partitions' offsets must commit in the transaction
        that holds their outputs, so the revoke waits for that transaction's commit (sent once
        every output sent so far was acknowledged, see _advance_transaction)."""
        if self._gate is not None:
            partitions = self._partitions
            epochs = {tp: partitions[tp].epoch for tp in event.tps if tp in partitions}
            self._revokes.append((event, epochs))
            self._gate.wanted = True
            return
        now = self._clock.monotonic()
        final = []
        for tp in event.tps:
            state = self._partitions.get(tp)
            if state is not None:
                run = self._runs.active.get(tp)
                if run is not None and run.epoch == state.epoch and run.outputs is None:
                    # The calls its worker finished succeeded: the final commit covers them
                    # (their report would come too late). Read once: the count only grows.
                    # (Not those of poll_and_produce: their outputs are not acknowledged.)
                    before = run.settled
                    self._settle_run(run, state, min(run.done, len(run.messages)))
                    self._runs.settled_early(run.settled - before)
                # So for its chains; and their calls not started must not start any more.
                self._recall_chains(tp)
                # And for the calls of its bundles that finished and wait for the rest of
                # their bundle (the results of other partitions' calls go with them).
                self._settle_bundled(tp)
                commit = self._commits.final_for(state, now)
                if commit is not None:
                    final.append(commit)
            self._forget(tp)
        if final:
            self._send_commits(final, final=True)
        event.reply.set_result(None)
        self._hooks.on_rebalance("revoked", event.tps)

    def _forget_history(self, tps: Sequence[TopicPartition]) -> None:
        if self._history:
            gone = set(tps)
            self._history = {k: v for k, v in self._history.items() if k[0] not in gone}

    def _forget(self, tp: TopicPartition) -> None:
        if tp in self._partitions:
            # (its chains' calls not started never start: the partition is no longer ours)
            self._recall_chains(tp)
        state = self._partitions.pop(tp, None)
        if state is None:
            return
        run = self._runs.active.get(tp)
        if run is not None:
            # Its records finished since the revoke settled the rest are not settled (the
            # partition is gone); the call in progress is held below like any call in flight
            # of the partition.
            detached = self._runs.detach(run)
            run.settled = detached.finished.stop
            self._counters.stale += len(detached.finished)
            self._to_release += len(detached.finished) + len(detached.drained)
            if detached.running is not None:
                self._adopt(run, detached.running, lane=False)
        self._to_release += self._shards.remove_partition(tp)
        queued = self._runs.take_queued(tp)  # (remove_partition dropped their waiting count)
        if queued is not None:
            self._to_release += len(queued[1])
        self._to_release += self._retries.forget(tp)
        if self._letters is not None:
            self._letters.forget(tp)
        self._commits.forget(tp)
        self._progress.forget(tp)
        # Its records in flight (or whose outputs are on their way) come back as stale results
        # and return their credit then; until they do, their lanes stay busy for the
        # partition's next assignment. (Those of still earlier assignments are held already.)
        batches = [*self._in_flight, *(p.batch for p in self._pending)]
        for batch in batches:
            for item in batch.items:
                if item.tp == tp and item.epoch == state.epoch:
                    self._shards.hold_for_stale(item)

    # -- dispatch and results -------------------------------------------------------------------

    def _dispatch(self, now: float) -> None:
        if self.lifecycle is not Lifecycle.RUNNING and self.lifecycle is not Lifecycle.DRAINING:
            return
        runs_out = self._start_runs() if self._runs.queued else self._workers_in_runs()
        take = self._shards.take
        blocked = self._commits.blocked
        in_flight = self._in_flight
        chunk = self.chunk_size
        limit = self._call_limit() - runs_out
        capacity = limit * chunk + self._chains.extra + self._bundles.extra
        batch_size = self._options.batch_size
        submit = self._runner.submit
        # Single calls (not chunks or chains) for a runner that takes many at once
        # (submit_many), in order.
        single: list[tuple[int, PollContext]] | None = [] if self._submit_many else None
        on_dispatch = self._on_dispatch
        timeout = self._timeout
        # Chains: calls not short enough for chunks, and not so long that one lane's next
        # records run later on a busy worker than they would on another (CHAIN_SECONDS).
        chain = 1
        if self._chains_on and chunk == 1:
            service = self._service_time.value
            if service:
                chain = max(1, min(self._chain_most, int(CHAIN_SECONDS / service)))
                if chain > 1 and len(self._shards) <= LONGEST_FIRST_LANES * capacity:
                    # Calls of milliseconds over few lanes for the workers, where the longest
                    # lane sets the end of a burst: serve the longest lanes first.
                    take = self._shards.take_longest
                    backlog = self._runner.backlog
                    if len(self._shards) <= limit + backlog:
                        # So few lanes that the runner's backlog would hold every one not
                        # running: no lane would be left to choose from (see
                        # LONGEST_FIRST_BACKLOG).
                        capacity -= max(0, backlog - LONGEST_FIRST_BACKLOG)
        # Bundles: calls too long for chunks, and many more records ready than the workers
        # can start (see BUNDLES).
        bundle = self._bundle_size(limit) if chunk == 1 and self._bundles_on else 1
        #: The bundle begun: each call with the partitions of its records.
        bundled: list[tuple[int, PollContext, tuple[TopicPartition, ...]]] = []
        calls: list[tuple[int, PollContext]] = []
        # (a bundle begun is filled: it holds the one worker its first call took)
        while len(in_flight) < capacity or 0 < len(bundled) < bundle:
            if batch_size == 1 and timeout is None:
                # The hot path: one record per call, no deadline.
                item = take(blocked)
                if item is None:
                    break
                batch = in_flight.add((item,), now)
                context = PollContext.of_one(
                    RecordContext(
                        item.message, item.attempts, item.last_failure, item.last_failure_at
                    )
                )
                # (chains: the records waiting behind it in its lane may follow it; not into
                # a bundle begun, whose worker is counted already)
                after = (
                    self._shards.take_following(item, chain - 1, blocked)
                    if chain > 1 and not bundled
                    else ()
                )
            else:
                after = ()
                items: list[WorkItem] = []
                while len(items) < batch_size:
                    item = take(blocked)
                    if item is None:
                        break
                    items.append(item)
                if not items:
                    break
                records = [
                    RecordContext(i.message, i.attempts, i.last_failure, i.last_failure_at)
                    for i in items
                ]
                if timeout is None:
                    batch = in_flight.add(items, now)
                    context = PollContext(records)
                else:
                    batch = in_flight.add(items, now, now + timeout)
                    self._deadlines.started(batch.id, now + timeout)
                    context = PollContext(
                        records, keep_alive=functools.partial(self._keep_alive, batch.id)
                    )
            if on_dispatch is not None:
                on_dispatch(batch.id, context)
            if chunk == 1:
                if after:
                    capacity += len(after)
                    if single:  # (the calls before it go first)
                        self._runner.submit_many(single)  # type: ignore[attr-defined]
                        single = []
                    self._submit_chain(batch.id, context, after, now)
                elif bundle > 1:
                    if bundled:
                        capacity += 1  # (a bundle holds one worker: its first call's)
                    bundled.append((batch.id, context, tuple(i.tp for i in batch.items)))
                    if len(bundled) == bundle:
                        self._submit_bundle(bundled)
                        bundled = []
                elif single is not None:
                    single.append((batch.id, context))
                else:
                    submit(batch.id, context)
                continue
            calls.append((batch.id, context))
            if len(calls) >= chunk:
                self._runner.submit_chunk(calls)  # type: ignore[attr-defined]
                self._chunks_out = True
                calls = []
        if len(bundled) == 1:
            call, context, _ = bundled[0]
            if single is not None:
                single.append((call, context))
            else:
                submit(call, context)
        elif bundled:
            self._submit_bundle(bundled)
        if single:
            self._runner.submit_many(single)  # type: ignore[attr-defined]
        if calls:
            if len(calls) == 1:
                submit(*calls[0])
            else:
                self._runner.submit_chunk(calls)  # type: ignore[attr-defined]
                self._chunks_out = True

    def _bundle_size(self, limit: int) -> int:
        """Calls per bundle in this dispatch pass: 1 (no bundles) unless two or more calls
        fit in BUNDLE_SECONDS and the records ready to start are at least BUNDLE_READY times
        what full bundles for every call slot hold. A worker then seldom waits idle while its
        next call sits in another worker's bundle; the last records of a burst go out one by
        one."""
        service = self._service_time.value
        if not service or service < THREAD_HOP or limit <= 0:
            return 1  # (calls short enough for chunks, or not measured yet)
        most = min(self._bundle_most, int(BUNDLE_SECONDS / service))
        if most < 2:
            return 1
        ready = self._shards.ready_count(self._commits.blocked) // self._options.batch_size
        return max(1, min(most, ready // (self._bundle_ready * limit)))

    def _submit_bundle(
        self, calls: list[tuple[int, PollContext, tuple[TopicPartition, ...]]]
    ) -> None:
        """Calls of different lanes (each with the partitions of its records), run one after
        another on one worker (a chunk: see ``ThreadRunner.submit_chunk``, which also hands
        the rest of a stuck one to other workers); the call limit counts the bundle as one
        worker until its calls are over."""
        self._bundles.start([(call, tps) for call, _, tps in calls])
        self._counters.bundles += 1
        chunk = [(call, context) for call, context, _ in calls]
        self._runner.submit_chunk(chunk)  # type: ignore[attr-defined]
        self._chunks_out = True

    def _submit_chain(
        self, first: int, context: PollContext, after: Sequence[WorkItem], now: float
    ) -> None:
        """Hand call ``first`` and the records ``after`` it in its lane to one worker as a
        chain: each record a call of its own in the in-flight table, started only once the
        one before it succeeded."""
        calls = [(first, context)]
        on_dispatch = self._on_dispatch
        for item in after:
            batch = self._in_flight.add((item,), now)
            follower = PollContext.of_one(
                RecordContext(item.message, item.attempts, item.last_failure, item.last_failure_at)
            )
            if on_dispatch is not None:
                on_dispatch(batch.id, follower)
            calls.append((batch.id, follower))
        tps = (after[0].tp,)
        self._chains.start([(call, tps) for call, _ in calls])
        self._counters.chains += 1
        self._runner.submit_chain(calls)  # type: ignore[attr-defined]
        self._chunks_out = True

    def _put_back(self, batch_ids: Sequence[int]) -> None:
        """Calls of a chain that never started (a call before them failed): their records go
        back to the front of their lane, as if never taken."""
        items: list[WorkItem] = []
        on_work_done = self._on_work_done
        for batch_id in batch_ids:
            batch = self._take_back(batch_id)
            if batch is None:  # taken back meanwhile (close, the stall policy)
                continue
            if on_work_done is not None:
                # (every call handed out ends for the hooks, this one without running)
                error = CallCancelled("not started: a call before it in its chain failed or hung")
                on_work_done(batch_id, (error,) * len(batch.items), 0.0)
            for item in batch.items:
                state = self._partitions.get(item.tp)
                if state is None or state.epoch != item.epoch:
                    # Its partition was revoked meanwhile: as for a stale result.
                    self._counters.stale += 1
                    self._to_release += 1
                    self._shards.stale_done(item)
                else:
                    items.append(item)
        if items:
            self._shards.put_back(items)

    def _recall_chain(self, chain: int) -> None:
        """Chain ``chain`` ends for the engine now: the calls it finished are settled (a
        revoke's final commit covers them) and its calls not started go back to their lane
        (a revoked partition's: released, like its waiting records). The call its worker is in
        reports on its own."""
        results, rest = self._runner.take_back_chain(chain)  # type: ignore[attr-defined]
        if results:
            self._on_chunk_done(WorkDoneMany(results, 0.0))
        if rest:
            self._put_back(rest)

    def _settle_bundled(self, tp: TopicPartition) -> None:
        """Report now the finished calls of every bundle with a call of ``tp``: a revoke's final
        commit must cover them (their worker would report them with the bundle's last call,
        too late). Their worker reports the rest."""
        take_finished = getattr(self._runner, "take_finished", None)
        if take_finished is None or not self._bundles:
            return
        for bundle in self._bundles.of_partition(tp):
            results = take_finished(bundle)
            if results:
                self._on_chunk_done(WorkDoneMany(results, 0.0))

    def _recall_chains(self, tp: TopicPartition) -> None:
        for chain in self._chains.of_partition(tp):
            self._recall_chain(chain)

    def _take_back(self, batch_id: int) -> Batch | None:
        """A call the runner gave back before it started (close, or a chain's call behind a
        failed or hung one): it is over, and never reports. Its batch, if still in flight."""
        self._chains.over(batch_id)
        self._bundles.over(batch_id)
        # (a call the stall policy gave up on before it started is over too)
        self._deadlines.forget_overrun(batch_id)
        self._deadlines.ended(batch_id)
        return self._in_flight.pop(batch_id)

    def _observe_service(self, took: float) -> None:
        """Adaptive dispatch: follow the time per call (:class:`ServiceTime`); calls much
        shorter than a thread hop go out in chunks (one hop for many calls), longer ones one by
        one, so that no call waits behind another on a worker while other workers are idle."""
        if not self._chunks:
            return
        service = self._service_time.observe(took, self._service_clock())
        self.chunk_size = max(1, min(MAX_CHUNK, int(THREAD_HOP / max(service, MIN_SERVICE))))

    def _release_stuck_chunks(self) -> None:
        real_now = time.monotonic()
        if real_now < self._next_stuck_check:
            return
        self._next_stuck_check = real_now + STUCK_CHECK_EVERY
        if self._runs.active:
            self._check_runs(time.perf_counter())
        # (the finished calls it reports are handled now, not posted: a revoke handled before
        # them would leave them out of its final commit)
        moved = self._runner.release_stuck(  # type: ignore[attr-defined]
            STUCK_AFTER, self._on_chunk_done
        )
        if moved:
            log.debug("%d calls of stuck chunks handed to other workers", moved)

    def _on_chunk_done(self, event: WorkDoneMany) -> None:
        if event.service:  # (0.0: not measured, as for the asyncio runner's reports)
            self._observe_service(event.service)
        work_done = self._work_done
        chains = self._chains
        bundles = self._bundles
        # (no chain or bundle begins while a report is handled: asked once per report)
        grouped = bool(chains) or bool(bundles)
        for batch_id, errors, value, finished_at, partial in event.calls:
            if grouped:
                # A call of a chain or a bundle began when the one before it ended, not at
                # the hand-out: metrics and hooks time the call itself (slow_after, processing
                # time).
                began = chains.ended(batch_id, finished_at)
                if began is None:
                    began = bundles.ended(batch_id, finished_at)
                if began is not None:
                    self._in_flight.began(batch_id, began)
            work_done(batch_id, errors, value, finished_at, partial)
        if event.unstarted:
            # (after the failed call's outcome: its record waits for its retry at the front
            # of its lane, and these go back behind it)
            self._put_back(event.unstarted)

    def _call_limit(self) -> int:
        """How many calls may be in flight. With deadlines there is no backlog inside the
        runner (a call's deadline measures the call, not a wait for a worker), and calls
        past their deadline that still run hold a worker each."""
        runner = self._runner
        backlog = runner.backlog if self._timeout is None else 0
        return runner.capacity + backlog - self._deadlines.overruns

    def _keep_alive(self, batch: int, seconds: float) -> None:
        # Runs on the handler's thread (or the process pool's): it only posts.
        self.post(DeadlineExtended(batch, self._clock.monotonic() + seconds))

    def _work_done(
        self,
        batch_id: int,
        errors: Sequence[BaseException | None],
        value: object,
        finished_at: float,
        partial: bool,
        *,
        sample: bool = True,
    ) -> None:
        """A handler call ended (one ``WorkDone``, or one call of a chunk). ``sample``: False
        for a call metrics saw already (a run's, see _sample_run)."""
        deadlines = self._deadlines
        if self._timeout is not None and deadlines.finished_late(batch_id, finished_at):
            # It ended after its deadline, before the controller noticed the deadline passed:
            # a late result like any other (it must not count), but the call is over.
            batch = self._in_flight.pop(batch_id)
            deadlines.ended(batch_id)
            if batch is None:  # pragma: no cover - a watched call is in flight
                return
            self._counters.deadline_exceeded += 1
            self._counters.late_results += 1
            error = DeadlineExceeded(
                f"the handler call ended after its deadline (processing_timeout="
                f"{self._timeout:g}s); its result is ignored"
            )
            self._settle(batch, (error,) * len(batch.items), finished_at)
            return
        if deadlines.ended(batch_id):
            # The call ran past its deadline and its records went on without it.
            self._counters.late_results += 1
            log.info("the late result of handler call %d is ignored", batch_id)
            return
        batch = self._in_flight.pop(batch_id)
        if batch is None:
            return  # taken back from the runner on close
        if self._on_work_done is not None:
            self._on_work_done(batch.id, errors, finished_at - batch.started_at)
        sampling = self._sampling
        if sampling is not None and sample:
            self._sample(sampling, batch, errors, finished_at)
        if self._produces and (partial or not any(errors)):
            # Outputs belong to the call: a record it failed with PollContext.fail is retried
            # (or dead-lettered) on its own, once the call's outputs are acknowledged.
            try:
                outputs = outputs_of(value)
            except TypeError as exc:
                errors = (exc,) * len(batch.items)
            else:
                if outputs:
                    pending = Pending(batch, outputs, errors if partial else None)
                    if self._gate is None or self._gate.open:
                        self._send_outputs(pending)
                    else:
                        self._pending.queue(pending)
                    return
        self._settle(batch, errors, finished_at)

    def _sample(
        self,
        sampling: CallSampling,
        batch: Batch,
        errors: Sequence[BaseException | None],
        finished_at: float,
    ) -> None:
        """Hand the call to metrics if a periodic sample is due or it was slow: one comparison
        per call otherwise."""
        duration = finished_at - batch.started_at
        periodic = finished_at >= self._next_sample
        if not periodic and duration <= sampling.slow_after:
            return
        if periodic and sampling.interval is not None:
            self._next_sample = finished_at + sampling.interval
        try:
            sampling.sample([i.message for i in batch.items], errors, duration, periodic)
        except Exception:
            log.warning("metrics failed to take a sample of a call", exc_info=True)

    def _settle(
        self, batch: Batch, errors: Sequence[BaseException | None], finished_at: float
    ) -> None:
        """Carry out the outcome of each record of a finished call (or, for a negative batch
        id, of a dead letter's write)."""
        if batch.id < 0:
            self._dead_letter_settled(batch, errors[0], finished_at)
            return
        partitions = self._partitions
        counters = self._counters
        finish = self._finish
        on_success = self._on_success
        succeeded = 0
        for item, error in zip(batch.items, errors, strict=True):
            state = partitions.get(item.tp)
            if state is None or state.epoch != item.epoch:
                counters.stale += 1
                self._to_release += 1
                self._shards.stale_done(item)
                continue
            if error is None:
                succeeded += 1
                state.totals.succeeded += 1
                finish(item, state)
                if on_success is not None:
                    on_success(_context_of(item))
            else:
                self._failed(item, error, finished_at)
        if succeeded:
            counters.succeeded += succeeded

    def _finish(self, item: WorkItem, state: PartitionState) -> None:
        """``item`` is done (processed, skipped or dead-lettered): its offset may commit."""
        self._to_release += 1
        track = self._progress.track(item.tp)
        if track is not None and track.lowest == item.offset:
            self._progress_moved.add(item.tp)  # the partition's stall watch sees progress
        state.succeeded(item.offset)
        if self._stall_chances:
            self._stall_chances.discard((item.tp, item.offset))
        # (Its failure history, kept in the transactional mode, stays until a commit passes
        # it: the transaction holding its dead letter or outputs may still abort.)
        self._shards.finished(item)
        blocked = self._commits.blocked
        if blocked and item.tp in blocked:
            self._commits.after_success(state)

    # -- outputs (poll_and_produce) ---------------------------------------------------------------

    def _send_outputs(self, pending: Pending) -> None:
        partitions = self._partitions
        for item in pending.batch.items:
            state = partitions.get(item.tp)
            if state is None or state.epoch != item.epoch:
                # Part of the call's input is no longer ours: its outputs cannot be told apart,
                # so none is sent; the records still ours run again.
                error = ProduceError("not produced: the call's partition was revoked meanwhile")
                errors = (error,) * len(pending.batch.items)
                self._settle(pending.batch, errors, self._clock.monotonic())
                return
        assert self._outputs is not None
        self._pending.sending(pending)
        if self._gate is not None:
            self._gate.outputs += len(pending.outputs)
        if pending.batch.id > 0:  # (dead letters are counted apart)
            self._counters.outputs_sent += len(pending.outputs)
        self._outputs.send(pending.batch.id, pending.outputs)

    def _run_outputs(self, run: Run, state: PartitionState, first: int, upto: int) -> None:
        """Records ``first`` to ``upto`` of a poll_and_produce run succeeded: produce their
        outputs (held back while a transaction commits); they finish once all are
        acknowledged. In KEY order their lanes are held until then."""
        assert run.outputs is not None
        messages = run.messages[first:upto]
        outputs: list[ProducerRecord] = []
        owners: list[int] = []
        for index, value in enumerate(run.outputs[first:upto]):
            if value is None:
                continue
            if type(value) is ProducerRecord:
                outputs.append(value)
                owners.append(index)
            else:
                outputs.extend(value)
                owners.extend([index] * len(value))
        if not outputs:
            self._settle_messages(state, messages)
            return
        held: list[object] | None = None
        if self._options.ordering is ProcessingOrder.KEY:
            topic, partition = run.tp
            held = [(topic, partition, m.key()) for m in messages]
            self._shards.hold(held)
        pending = RunOutputs(run.id, run.tp, run.epoch, messages, outputs, owners, held)
        if self._gate is None or self._gate.open:
            self._send_run_outputs(pending)
        else:
            self._pending.queue_run(pending)

    def _send_run_outputs(self, pending: RunOutputs) -> None:
        state = self._partitions.get(pending.tp)
        if state is None or state.epoch != pending.epoch:
            # Revoked meanwhile (held back by the gate): none is sent, they run again.
            self._run_outputs_gone(pending)
            return
        assert self._outputs is not None
        self._pending.sending_run(pending)
        count = len(pending.outputs)
        if self._gate is not None:
            self._gate.outputs += count
        self._counters.outputs_sent += count
        self._outputs.send_run(pending.id, pending.outputs, pending.owners)

    def _run_outputs_gone(self, pending: RunOutputs) -> None:
        """The records of ``pending`` are no longer ours (their partition was revoked)."""
        count = len(pending.messages)
        self._counters.stale += count
        self._to_release += count
        if pending.held is not None:
            self._shards.release(pending.held)

    def _run_delivered(
        self, run_id: int, failures: dict[int, BaseException] | None, now: float
    ) -> None:
        pending = self._pending.run_delivered(run_id)
        if pending is None:  # pragma: no cover - every run is reported once
            return
        if failures is None:
            self._counters.outputs_acknowledged += len(pending.outputs)
        else:
            failed = sum(1 for owner in pending.owners if owner in failures)
            self._counters.outputs_failed += failed
            self._counters.outputs_acknowledged += len(pending.outputs) - failed
            if self._gate is not None:
                # The transaction holds the run's other outputs, and these records run again:
                # it must not commit (see _delivered).
                self._gate.abort_soon()
        state = self._partitions.get(pending.tp)
        if state is None or state.epoch != pending.epoch:
            self._run_outputs_gone(pending)
            return
        if failures is None:
            self._settle_messages(state, pending.messages)
            if pending.held is not None:
                self._shards.release(pending.held)
            return
        # A failed output retries its record, in its lane; everything of the partition still
        # to run goes to the lanes (after its run out, if any), where the records of its key
        # wait behind it: the rule of a run that failed (see _on_run_done).
        tp = pending.tp
        run = self._runs.active.get(tp)
        if run is not None and run.epoch == state.epoch:
            self._detach_run(run, drop=False)
        good = [m for i, m in enumerate(pending.messages) if i not in failures]
        if good:
            self._settle_messages(state, good)
        items = []
        for index, error in failures.items():
            item = self._item_of(tp, pending.epoch, pending.messages[index])
            self._shards.adopt(item)  # (before the holds end: its lane stays busy)
            items.append((item, error))
        self._runs_to_lanes(tp)
        if pending.held is not None:
            self._shards.release(pending.held)
        for item, error in items:
            self._failed(item, error, now)

    def _on_delivered(self, event: OutputsDelivered) -> None:
        now = self._clock.monotonic()
        for batch_id, results in event.calls:
            self._delivered(batch_id, results, now)
        for run_id, failures in event.runs:
            self._run_delivered(run_id, failures, now)

    def _delivered(
        self,
        batch_id: int,
        results: tuple[tuple[int, int] | BaseException | None, ...],
        now: float,
    ) -> None:
        pending = self._pending.delivered(batch_id)
        if pending is None:  # pragma: no cover - every call is reported once
            return
        batch = pending.batch
        failures = [r for r in results if isinstance(r, BaseException)]
        if batch.id < 0:  # a dead letter
            if failures and self._gate is not None:
                self._gate.abort_soon()  # the transaction must not commit without it
            self._settle(batch, (failures[0] if failures else None,), now)
            return
        if failures:
            failure = failures[0]
            self._counters.outputs_failed += len(failures)
            self._counters.outputs_acknowledged += len(results) - len(failures)
            if self._gate is not None:
                # The transaction may hold the call's other outputs, and its input is retried:
                # it must not commit. Abort it (once the outputs sent so far are settled).
                self._gate.abort_soon()
            self._settle(batch, (failure,) * len(batch.items), now)
            return
        self._counters.outputs_acknowledged += len(pending.outputs)
        if self._on_produced is not None:
            self._report_produced(pending, results)
        self._settle(batch, pending.errors or (None,) * len(batch.items), now)

    def _report_produced(
        self, pending: Pending, results: Sequence[tuple[int, int] | BaseException | None]
    ) -> None:
        assert self._on_produced is not None
        context = PollContext(
            [
                RecordContext(i.message, i.attempts, i.last_failure, i.last_failure_at)
                for i in pending.batch.items
            ]
        )
        for record, result in zip(pending.outputs, results, strict=True):
            assert isinstance(result, tuple)
            try:
                self._on_produced(ProduceResult(context, record, result[0], result[1]))
            except Exception:
                log.error(
                    "on_produced(%r) for the output of %r raised; ignored",
                    record,
                    context,
                    exc_info=True,
                )

    def _advance_transaction(self, now: float) -> None:
        """Transactional mode: commit once wanted and every sent output is acknowledged;
        let held-back outputs go once the gate is open again."""
        gate = self._gate
        assert gate is not None
        if gate.ready(self._pending.in_delivery):
            revokes, self._revokes = self._revokes, []
            if gate.must_abort:
                # Abort instead of committing; the poller rewinds the partitions it keeps.
                gate.sent()
                self._counters.commits_sent += 1
                answer = self._committer.commit((), abort=True)
                answer.add_done_callback(self._post_answer)
            else:
                commits = self._commits.due(self._partitions.values(), now, final=bool(revokes))
                if commits or gate.outputs:
                    gate.sent()
                    self._send_commits(commits, final=bool(revokes))
                else:
                    gate.skipped()
            for event, epochs in revokes:
                # The commit of their partitions was sent before this answer: the poller runs
                # it inside its revoke callback, while they are still ours. (A partition
                # assigned again since, after the poller gave up waiting, is not forgotten.)
                for tp in event.tps:
                    state = self._partitions.get(tp)
                    if state is not None and state.epoch == epochs.get(tp):
                        self._forget(tp)
                self._forget_history(event.tps)
                event.reply.set_result(None)
                self._hooks.on_rebalance("revoked", event.tps)
        if gate.open and self._pending.queued:
            for pending in self._pending.take_queued():
                self._send_outputs(pending)
        if gate.open and self._pending.queued_runs:
            for outputs in self._pending.take_queued_runs():
                self._send_run_outputs(outputs)

    def _count_failure(self, item: WorkItem, error: BaseException) -> RecordContext:
        """A failed attempt of ``item``: its history, the counter and the ``on_failure`` hook."""
        self._counters.failed += 1
        state = self._partitions.get(item.tp)
        if state is not None:
            state.totals.failed += 1
        item.attempts += 1
        item.last_failure = error
        item.last_failure_at = self._clock.now()
        if item.first_failure_at is None:
            item.first_failure_at = item.last_failure_at
        if self._gate is not None:
            self._history[(item.tp, item.offset)] = (
                item.attempts,
                error,
                item.last_failure_at,
                item.first_failure_at,
            )
        record = RecordContext(item.message, item.attempts, error, item.last_failure_at)
        self._hooks.on_failure(record, error)
        return record

    def _failed(self, item: WorkItem, error: BaseException, finished_at: float) -> None:
        if isinstance(error, Skip) or (
            isinstance(error, DeadLetter) and self._options.dead_lettering
        ):
            # The handler decided: not a failed attempt (the dead letter's attempt count and
            # the record's history stay as they were).
            self._give_up(item, error, decide(error, _context_of(item), finished_at, self._options))
            return
        if self._close is not None and isinstance(error, CallCancelled):
            # close() cancelled the call: not the record's failure. It stays unfinished (and
            # uncommitted) and runs again after the restart; no retry, no exhaustion policy.
            self._shards.retry_later(item)
            return
        record = self._count_failure(item, error)
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
        )
        self._hooks.on_retry(record, error, decision.delay)
        self._shards.retry_later(item)
        self._retries.push(item, decision.due)

    def _give_up(self, item: WorkItem, error: BaseException, decision: Decision) -> None:
        """Carry out a decision other than a retry for a record that just failed."""
        if getattr(decision, "exhausted", False):
            self._counters.retries_exhausted += 1
        if isinstance(decision, SkipNow):
            log.log(
                logging.INFO if isinstance(error, Skip) else logging.WARNING,
                "%s[%d]@%d skipped after %d failed attempts (%s): %r",
                *item.tp,
                item.offset,
                item.attempts,
                decision.reason,
                error,
            )
            state = self._partitions[item.tp]
            self._counters.skipped_on_failure += 1
            self._finish(item, state)
            self._hooks.on_skip(_context_of(item), error, decision.reason)
        elif isinstance(decision, DeadLetterNow):
            self._shards.retry_later(item)  # its lane stays busy until the letter is written
            if isinstance(error, DeadLetter) and error.__cause__ is not None:
                error = error.__cause__  # `raise DeadLetter(...) from exc`: the headers name exc
            self._dead_letter_now(item, error, decision.reason)
        else:
            assert isinstance(decision, StopNow)
            raise RetriesExhausted(decision.message) from error

    def _dead_letter_now(self, item: WorkItem, error: BaseException | None, reason: str) -> None:
        """Write ``item`` to its dead-letter topic now; its offset commits once the broker
        acknowledged the dead letter (in the transactional mode: in the transaction that
        commits the offset). The seam for policies that give up on a record (``decide``, and
        ``on_stall=DEAD_LETTER``).

        Contract: controller thread only; ``item`` belongs to the current assignment and is not
        in the runner: it has just failed, or it waits for its retry (it is taken out of the
        retry queue here). Its lane stays busy until the letter is written (KEY/PARTITION order
        holds in the dead-letter topic too). ``reason`` is a ``dead_letter.Reason`` value. With
        dead-lettering off this raises :class:`RetriesExhausted` (the consumer stops). A write
        that fails leaves the record uncommitted and is tried again (``dead_letter_failures``).
        A record whose dead letter is already on its way is left alone (no second write).
        """
        self._assert_owner()
        letters = self._letters
        if letters is None or self._outputs is None:
            raise RetriesExhausted(
                f"{item.tp[0]}[{item.tp[1]}]@{item.offset} is to be dead-lettered ({reason}) "
                "but dead-lettering is off; set Options.dead_letter_topic"
            ) from error
        if letters.sending_for(item):
            return
        self._retries.remove(item)
        letters.take_waiting(item)  # a letter waiting to be written again is replaced
        self._send_dead_letter(Letter(item, error, reason))

    def _send_dead_letter(self, letter: Letter) -> None:
        assert self._letters is not None
        batch, record = self._letters.start(letter, self._clock.monotonic())
        pending = Pending(batch, [record])
        if self._gate is None or self._gate.open:
            self._send_outputs(pending)
        else:
            self._pending.queue(pending)

    def _dead_letter_settled(
        self, batch: Batch, error: BaseException | None, finished_at: float
    ) -> None:
        assert self._letters is not None
        letter = self._letters.settled(batch.id)
        item = batch.items[0]
        state = self._partitions.get(item.tp)
        if letter is None or state is None or state.epoch != item.epoch:
            # Revoked meanwhile: nothing commits for it here; its next owner runs it again
            # and may write a second dead letter (at-least-once).
            self._counters.stale += 1
            self._to_release += 1
            self._shards.stale_done(item)
            return
        if error is None:
            self._counters.dead_lettered += 1
            self._letters.written(letter)
            self._finish(item, state)
            self._hooks.on_dead_letter(_context_of(item), letter.error, letter.reason)
        else:
            self._counters.dead_letter_failures += 1
            self._retries.push(item, finished_at + self._letters.failed(letter, error))

    def _release_due_retries(self, now: float) -> None:
        letters = self._letters
        for item in self._retries.pop_due(now):
            state = self._partitions.get(item.tp)
            if state is None or state.epoch != item.epoch:  # pragma: no cover - forgotten
                self._to_release += 1
                continue
            letter = letters.take_waiting(item) if letters is not None else None
            if letter is not None:
                self._send_dead_letter(letter)
            else:
                self._shards.retry_now(item)

    # -- commits ------------------------------------------------------------------------------

    def _send_commits(self, commits: list[OffsetCommit], *, final: bool = False) -> None:
        if not commits and self._gate is None:
            return  # (a transaction commits its outputs even when no offset moved)
        self._counters.commits_sent += len(commits)
        if commits:
            self._hooks.on_commit_sent(commits)
        answer = self._committer.commit(commits, final=final)
        answer.add_done_callback(self._post_answer)

    def _post_answer(self, answer: Future[tuple[CommitAnswer, ...]]) -> None:
        # Runs on whichever thread resolves the future (the poller): only posts.
        self.post(CommitResult(answer.result()))

    def _forget_history_below(self, tp: TopicPartition, offset: int) -> None:
        """The group committed ``tp`` at ``offset``: failures of records below it can no
        longer run again (transactional mode)."""
        history = self._history
        for key in [k for k in history if k[0] == tp and k[1] < offset]:
            del history[key]

    def _on_commit_result(self, answers: tuple[CommitAnswer, ...]) -> None:
        if self._gate is not None:
            self._gate.answered()
        counters = self._counters
        for answer in answers:
            commit = answer.commit
            state = self._partitions.get(commit.tp)
            current = state is not None and state.epoch == commit.epoch
            if answer.error is None:
                counters.commits_acknowledged += 1
                if self._history:
                    self._forget_history_below(commit.tp, commit.offset)
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
                self._commits.answered(state, answer)
        self._hooks.on_commit(answers)

    # -- back-pressure and stalls ---------------------------------------------------------------

    def _starving(self) -> bool:
        """Workers are idle while records wait: every waiting record is behind a busy lane.
        (Records queued for runs wait for their partition's run by design: one run of a
        partition at a time is what keeps its order, and it is no sign of crowding.)"""
        return (
            len(self._in_flight)
            - self._chains.extra
            - self._bundles.extra
            + self._workers_in_runs()
            < self._call_limit()
            and self._shards.waiting > self._runs.queued_records()
            and not self._shards.has_ready()
        )

    def _update_pauses(self, now: float) -> None:
        backlog = self._shards.waiting_by_tp
        chained = self._chains.by_tp
        bundled = self._bundles.by_tp
        if self._runs.active or chained or bundled:
            # A run's records not settled, and the records of its chains and bundles in
            # flight, are the partition's backlog too.
            backlog = dict(backlog)
            for tp, run in self._runs.active.items():
                backlog[tp] = backlog.get(tp, 0) + len(run) - run.settled
            for held in (chained, bundled):
                for tp, count in held.items():
                    backlog[tp] = backlog.get(tp, 0) + count
        wanted = self._pauses.update(
            now,
            backlog,
            self._partitions.keys(),
            running=self.lifecycle is Lifecycle.RUNNING,
            starving=self._starving(),
        )
        if wanted is not None:
            self._poller.send(SetPaused(wanted))

    def _watch_for_stall(self, now: float) -> None:
        idle_for = self._stall.observe(
            now,
            stalled=bool(
                self._shards.waiting
                and not self._in_flight
                and not self._runs
                and not self._pending
                and not self._retries
                and not self._deadlines.overruns  # hung calls hold every worker
                and self.lifecycle in (Lifecycle.RUNNING, Lifecycle.DRAINING)
            ),
        )
        if idle_for is None:
            return
        self._counters.stalls += 1
        report = StallReport(
            waiting=self._shards.waiting,
            retry_waiting=len(self._retries),
            in_flight=self._in_flight.records + self._runs.records_out,
            paused_partitions=len(self._pauses.paused),
            blocked_partitions=len(self._commits.blocked),
            idle_for=idle_for,
        )
        log.warning("no progress: %s; %r %r", report, self._shards, self._commits)
        self._hooks.on_stall(report)

    # -- deadlines and partition progress (docs/deadlines.md, docs/health.md) -------------------

    def _expire_calls(self, now: float) -> None:
        for batch_id in self._deadlines.expired(now):
            batch = self._in_flight.pop(batch_id)
            if batch is None:  # pragma: no cover - a watched call is in flight
                self._deadlines.forget_overrun(batch_id)
                continue
            assert self._timeout is not None
            self._counters.deadline_exceeded += 1
            error = DeadlineExceeded(
                f"the handler call ran past its deadline (processing_timeout="
                f"{self._timeout:g}s) and was abandoned"
            )
            self._abandon(batch, error, now)

    def _abandon(
        self, batch: Batch, error: BaseException, now: float, *, whole: Batch | None = None
    ) -> None:
        """Fail ``batch``'s records now (``batch`` is already out of the in-flight table and
        an overrun in ``_deadlines``) and ask the runner to end the call. Whatever the call
        reports later is ignored: the records go on through the normal failure path.
        ``whole``: the call, when ``batch`` holds only the records to fail this way."""
        call = whole or batch
        first = call.items[0]
        log.warning(
            "%s[%d]@%d%s: handler call %d abandoned after %.1fs (%s); its records are retried, "
            "and its result, if it ever comes, ignored",
            *first.tp,
            first.offset,
            f" (+{len(call.items) - 1} more)" if len(call.items) > 1 else "",
            call.id,
            now - call.started_at,
            error,
        )
        if self._on_work_done is not None:
            self._on_work_done(call.id, (error,) * len(call.items), now - call.started_at)
        if self._sampling is not None:
            # (its duration so far: longer than the deadline, possibly than slow_after)
            self._sample(self._sampling, call, (error,) * len(call.items), now)
        # The asyncio runner cancels the task, the process runner replaces the worker
        # process; a thread runs on (it holds a worker until it returns: see _call_limit).
        if call.id not in self._adopted:  # (a detached run's call is on a thread: it runs on)
            self._runner.cancel(call.id, error)
        chain = self._chains.chain_of(call.id)
        if chain is not None:
            # The records chained behind it must not wait for a call that may never return:
            # they go back to their lane (which stays busy until this record is settled).
            self._recall_chain(chain)
        if batch.items:
            self._settle(batch, (error,) * len(batch.items), now)

    def _watch_partitions(self, now: float, only: set[TopicPartition] | None = None) -> None:
        """Observe the progress of every partition (or ``only`` those); act on partitions
        found stalled."""
        progress = self._progress
        stalls: list[Stall] = []
        if self.lifecycle is Lifecycle.RUNNING or self.lifecycle is Lifecycle.DRAINING:
            partitions = self._partitions
            for tp in partitions if only is None else only:
                state = partitions.get(tp)
                if state is None:
                    continue
                stall = progress.observe(
                    tp,
                    epoch=state.epoch,
                    lowest=state.incomplete.lowest(),
                    committed=state.committed_offset,
                    now=now,
                )
                if stall is not None:
                    stalls.append(stall)
        if only is None:
            wake = progress.wake_at()
            if progress.watching:
                periodic = now + self._progress_every
                wake = periodic if wake is None else min(wake, periodic)
            self._progress_at = wake
        elif self._progress_at is None or self._progress_at > now + self._progress_every:
            self._progress_at = now + self._progress_every
        for stall in stalls:
            self._on_partition_stall(stall, now)

    def _on_partition_stall(self, stall: Stall, now: float) -> None:
        policy = self._options.on_stall
        topic, partition = stall.tp
        self._counters.partition_stalls += 1
        log.warning(
            "%s[%d] stalled: offset %d unfinished and the committed offset (%s) unmoved for "
            "%.1fs (stall_threshold=%ss); on_stall=%s",
            topic,
            partition,
            stall.offset,
            stall.committed,
            stall.stalled_for,
            self._options.stall_threshold,
            policy.name,
        )
        self._hooks.on_partition_stall(
            PartitionStall(
                topic, partition, stall.offset, stall.committed, stall.stalled_for, policy.value
            )
        )
        if policy is StallPolicy.STOP:
            raise stalled_error(stall, self._options.stall_threshold)
        if policy is StallPolicy.DEAD_LETTER:
            item = self._blocking_item(stall.tp, stall.offset)
            if item is not None:
                self._on_stalled_record(item, now)
            # If the record holds the partition again, that is a new episode.
            self._progress.restart(stall.tp, now)

    def _blocking_item(self, tp: TopicPartition, offset: int) -> WorkItem | None:
        """The record at ``offset`` of ``tp`` (a stalled partition's lowest unfinished one):
        inside a handler call, waiting for its retry, or waiting in its lane. None if it was
        not polled yet (an unfinished offset restored from the committed offset map)."""
        for batch in self._in_flight:
            for item in batch.items:
                if item.offset == offset and item.tp == tp:
                    return item
        return self._retries.find(tp, offset) or self._shards.find(tp, offset)

    def _on_stalled_record(self, item: WorkItem, now: float) -> None:
        """``on_stall=DEAD_LETTER``: ``item`` holds its stalled partition; dead-letter it.

        A call running it is abandoned like a call past its deadline (a thread runs on, its
        late result ignored; an async call is cancelled; a worker process is replaced), unless
        that attempt only just started (say, its retry), which gets its chance. The record is
        then written to the dead-letter topic (reason ``stalled``) instead of being retried, and
        its offset commits once the letter is acknowledged. A record waiting for its retry is
        dead-lettered at once. A record waiting in its lane for a worker is not what holds the
        partition up (the workers are busy elsewhere): it is left alone."""
        threshold = self._options.stall_threshold
        assert threshold is not None
        runner_running = getattr(self._runner, "running", None)
        adopted = self._adopted

        def running(batch_id: int) -> bool | None:
            # (a detached run's call is running; None: the runner cannot tell)
            if batch_id in adopted:
                return True
            return None if runner_running is None else runner_running(batch_id)

        for batch in self._in_flight:
            if item not in batch.items:
                continue
            age = now - batch.started_at
            key = (item.tp, item.offset)
            if age >= threshold and running(batch.id) is False:
                # Queued for a worker all this time (the workers are held elsewhere): it is
                # not what holds the partition up.
                log.info(
                    "%s[%d]@%d holds the partition; its call waits for a worker: left alone",
                    *item.tp,
                    item.offset,
                )
                return
            if age < threshold and key not in self._stall_chances:
                # A new attempt (say, its retry) gets one chance, once per record.
                self._stall_chances.add(key)
                log.info(
                    "%s[%d]@%d holds the partition; its call was handed over %.1fs ago: it gets "
                    "its chance",
                    *item.tp,
                    item.offset,
                    age,
                )
                return
            self._in_flight.pop(batch.id)
            self._deadlines.expire(batch.id)
            self._counters.deadline_exceeded += 1
            error = DeadlineExceeded(
                f"{item.tp[0]}[{item.tp[1]}]@{item.offset} held its partition for longer "
                f"than stall_threshold={threshold}s (on_stall=DEAD_LETTER)"
            )
            # The call is abandoned; its other records (a batch) fail and are retried as usual,
            # and the record holding the partition goes to the dead-letter topic whatever the
            # retry policy says: the stall policy decided.
            others = tuple(i for i in batch.items if i is not item)
            self._abandon(Batch(batch.id, others, batch.started_at), error, now, whole=batch)
            self._count_failure(item, error)
            self._dead_letter_now(item, error, Reason.STALLED)
            return
        if self._retries.find(item.tp, item.offset) is item:
            self._dead_letter_now(item, item.last_failure, Reason.STALLED)
            return
        log.warning(
            "%s[%d]@%d holds the partition but is neither in a handler call nor waiting for "
            "its retry (it waits for a worker): nothing to dead-letter",
            *item.tp,
            item.offset,
        )

    def health(self) -> HealthReport:
        """The progress report of ``pc.health()`` (on the controller thread)."""
        return health_report(
            self.lifecycle,
            partitions=partition_health(
                self._partitions.values(),
                progress=self._progress,
                in_flight=self._in_flight,
                runs=self._runs,
                waiting=self._shards.waiting_by_tp,
                blocked=self._commits.blocked,
                now=self._clock.monotonic(),
            ),
            dead_letter_failures=self._counters.dead_letter_failures,
            deadline_exceeded=self._counters.deadline_exceeded,
            overrunning_calls=self._deadlines.overruns,
            stall_threshold=self._options.stall_threshold,
            failure=self._failure,
            brokers_down_for=self._poller.statistics().brokers_down_for,
        )

    # -- control and close --------------------------------------------------------------------

    def _on_control(self, event: Control) -> None:
        action = event.action
        if action == "statistics":
            event.reply.set_result(self.statistics())
        elif action == "health":
            event.reply.set_result(self.health())
        elif action == "pause":
            if self.lifecycle is Lifecycle.RUNNING:
                self.lifecycle = Lifecycle.PAUSED
            event.reply.set_result(self.lifecycle)
        elif action == "resume":
            if self.lifecycle is Lifecycle.PAUSED:
                self.lifecycle = Lifecycle.RUNNING
                # Nothing could progress while paused: stall clocks start again.
                self._progress.restart_all(self._clock.monotonic())
                self._progress_at = 0.0
            event.reply.set_result(self.lifecycle)
        elif action == "close":
            timeout = self._options.shutdown_timeout if event.timeout is None else event.timeout
            deadline = self._clock.monotonic() + timeout
            if self._close is None:
                self._close = Closing(event.reply, deadline, event.drain)
                if event.drain:
                    self.lifecycle = Lifecycle.DRAINING
                else:
                    self._stop_dispatching()
                return
            # Already closing: a stricter request (no drain, an earlier deadline) takes effect;
            # both are answered when the close finishes.
            if self._close.tighten(drain=event.drain, deadline=deadline):
                self._stop_dispatching()
            self._close.reply.add_done_callback(lambda _: event.reply.set_result(None))
        else:  # pragma: no cover - the facade sends only the actions above
            event.reply.set_exception(ValueError(f"unknown control action {action!r}"))

    def _stop_dispatching(self) -> None:
        """Close without drain: records not started stay for the partition's next owner."""
        self.lifecycle = Lifecycle.CLOSING
        for run in list(self._runs.active.values()):
            self._detach_run(run, drop=True)
        for tp in list(self._partitions):
            self._to_release += self._shards.remove_partition(tp)
            queued = self._runs.take_queued(tp)
            if queued is not None:
                self._to_release += len(queued[1])
        for batch_id in self._runner.cancel_queued():
            batch = self._take_back(batch_id)
            if batch is not None:
                self._to_release += len(batch.items)

    def _close_step(self, now: float) -> bool:
        """Carry out the close's next step; True when the controller may stop."""
        close = self._close
        assert close is not None
        # Records whose outputs are on their way (or held back) are in flight too.
        in_flight = self._in_flight.records + self._pending.records + self._runs.records_out
        step = close.step(
            now,
            time.monotonic(),
            work_left=bool(self._shards.waiting or self._retries or in_flight),
            in_flight=bool(in_flight),
            commit_pending=self._commits.has_pending()
            or (self._gate is not None and not self._gate.open),
            resend_final_commit=lambda: self._send_final_commits(now),
            # Never a blocking join: the poller may be inside a revoke callback waiting for
            # this thread's answer, which the loop keeps giving until the poller has stopped.
            poller_stopped=lambda: self._poller.join(0.0),
        )
        if not close.drain and self.lifecycle is Lifecycle.DRAINING:
            self.lifecycle = Lifecycle.CLOSING
        if step is Step.STOP_RUNNER:
            if in_flight or self._shards.waiting or self._retries:
                log.warning(
                    "closing with %d records in flight, %d waiting and %d waiting for a retry: "
                    "they are not committed and will be processed again",
                    in_flight,
                    self._shards.waiting,
                    len(self._retries),
                )
            # From here on no handler call starts, whatever is still queued in the runner.
            self._runner.stop(timeout=0.0 if in_flight else 1.0)
            self._send_final_commits(now)
        elif step is Step.STOP_POLLER:
            self._poller.send(StopPoller())
        return step is Step.DONE

    def _send_final_commits(self, now: float) -> bool:
        gate = self._gate
        if gate is not None:
            # The transaction commits once the outputs sent are acknowledged (and takes the
            # offsets of their records with it): see _advance_transaction.
            if gate.outputs or any(s.dirty for s in self._partitions.values()):
                gate.wanted = True
                return True
            return False
        commits = self._commits.due(self._partitions.values(), now, final=True)
        self._send_commits(commits, final=True)
        return bool(commits)

    def _emergency_stop(self) -> None:
        """After a failure: stop the workers and the poller without committing."""
        try:
            self._runner.stop(timeout=STOP_TIMEOUT)
        finally:
            self._poller.send(StopPoller())
            deadline = time.monotonic() + STOP_TIMEOUT
            while not self._poller.join(0.05) and time.monotonic() < deadline:
                self._answer_pending_controls()

    def _answer_pending_controls(self) -> None:
        while True:
            try:
                event = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(event, Control):
                if event.action == "statistics":
                    event.reply.set_result(self.statistics())
                elif event.action == "health":
                    event.reply.set_result(self.health())
                else:
                    event.reply.set_result(self.lifecycle)
            elif isinstance(event, PartitionsRevoked):
                event.reply.set_result(None)

    # -- views --------------------------------------------------------------------------------

    def statistics(self) -> Statistics:
        return assemble_statistics(
            self.lifecycle,
            counters=self._counters,
            shards=self._shards,
            in_flight=self._in_flight,
            delivering=self._pending.records,
            retries=len(self._retries),
            pauses=self._pauses,
            commits=self._commits,
            partitions=self._partitions.values(),
            poller=self._poller.statistics(),
            overrunning_calls=self._deadlines.overruns,
            chunk_size=self.chunk_size,
            totals=self._totals,
            runs_out=self._runs.records_out,
        )

    def __repr__(self) -> str:
        return (
            f"<Controller {self.lifecycle.name} partitions={len(self._partitions)} "
            f"waiting={self._shards.waiting} "
            f"in_flight={self._in_flight.records + self._runs.records_out} "
            f"retries={len(self._retries)}>"
        )


def _context_of(item: WorkItem) -> RecordContext:
    return RecordContext(item.message, item.attempts, item.last_failure, item.last_failure_at)
