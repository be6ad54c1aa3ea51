"""Dispatch: handing records to the runner as single calls, chunks, chains and bundles, and
taking their results back. Owned by the controller thread.

Each pass (:meth:`Dispatch.dispatch`) takes records from the ledger's lanes up to the call
limit and hands them out: one record a call on the hot path, ``batch_size`` records a call in
batches; chunks of very short calls (one hand-over for many), chains of a lane's next records
and bundles of different lanes' calls, as the sizing rules (work/sizing.py) say from the
measured time per call. Results (:meth:`Dispatch.work_done`, :meth:`Dispatch.on_chunk_done`)
go to delivery when the call returned outputs, else to the ledger. The part owns the chains
and bundles out, the calls' deadlines and the measured time per call. Runs are engine/runs.py.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence

from parallel_consumer._clock import Clock
from parallel_consumer._events import DeadlineExtended, WorkDone, WorkDoneMany
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.engine.delivery import Delivery
from parallel_consumer.engine.ledger import Ledger
from parallel_consumer.engine.sampling import Samples
from parallel_consumer.errors import DeadlineExceeded
from parallel_consumer.hooks import CallSampling, Hooks
from parallel_consumer.options import Options
from parallel_consumer.runners.base import (
    CallCancelled,
    ChainRunner,
    ChunkRunner,
    ManyRunner,
    Runner,
)
from parallel_consumer.work import sizing
from parallel_consumer.work.chains import Bundles, Chains
from parallel_consumer.work.deadlines import Deadlines
from parallel_consumer.work.inflight import Batch
from parallel_consumer.work.item import TopicPartition, WorkItem
from parallel_consumer.work.service import ServiceTime
from parallel_consumer.work.sizing import Modes

__all__ = ["Dispatch"]

log = logging.getLogger("parallel_consumer")

#: Before start: no chunks, runs, chains or bundles.
NO_MODES = Modes(False, False, False, False, 1, False, 1)


class Dispatch:
    """Calls out and their results. See the module docstring."""

    def __init__(
        self,
        options: Options,
        *,
        clock: Clock,
        ledger: Ledger,
        delivery: Delivery,
        runner: Runner,
        hooks: Hooks,
        active: frozenset[str],
        sampling: CallSampling | None,
        post: Callable[[DeadlineExtended], None],
    ) -> None:
        self._options = options
        self._clock = clock
        self._ledger = ledger
        self._delivery = delivery
        self._post = post
        # The per-call hooks, None unless implemented: skipped on the hot path.
        self._on_dispatch = hooks.on_dispatch if "on_dispatch" in active else None
        self.work_done_hook = hooks.on_work_done if "on_work_done" in active else None
        #: Metrics' sample of calls (engine/sampling.py).
        self.samples = Samples(sampling)
        self.runner = runner
        self._chunker: ChunkRunner | None = None
        self._chainer: ChainRunner | None = None
        self._many: ManyRunner | None = None
        #: Whether the runner can tell that a call has started (None: it cannot).
        self.running: Callable[[int], bool] | None = None
        #: The ways calls go out (work/sizing.py), decided at start.
        self.modes = NO_MODES
        #: Time per call as the runners report it. Its windows are real time (they are about
        #: threads and pauses, not the engine's clock); tests may replace service_clock.
        self.service_time = ServiceTime(sizing.STUCK_CHECK_EVERY)
        self.service_clock: Callable[[], float] = time.monotonic
        #: Calls per hand-over to the runner: 1, or more for calls much shorter than a thread
        #: hop (adaptive dispatch; only runners that run chunks, and no deadlines).
        self.chunk_size = 1
        #: Chunks were handed to the runner since nothing was last in flight.
        self.chunks_out = False
        #: Chains out (CHAINS). A chain holds one worker however many of its calls are in
        #: flight: the call limit counts ``chains.extra`` out of the in-flight table.
        self.chains = Chains()
        #: Bundles out (BUNDLES), counted like chains: one worker each.
        self.bundles = Bundles()
        self.bundle_ready = sizing.BUNDLE_READY
        #: Deadlines of calls in flight, and calls still running past theirs (docs/deadlines.md).
        self.deadlines = Deadlines()
        self.timeout = options.processing_timeout

    def start(self, runner: Runner, *, per_call_hooks: bool) -> Modes:
        """Use ``runner``: decide once, from its features, the ways calls go out."""
        features = runner.features
        options = self._options
        delivery = self._delivery
        modes = sizing.decide_modes(
            can_chunk=features.chunks is not None,
            # (Not on a share group: a run's calls carry no record's attempts, which there
            # come from the broker's delivery count.)
            can_run=features.runs is not None and not options.share_group,
            can_chain=features.chains is not None,
            ordering=options.ordering,
            batch_size=options.batch_size,
            buffer_limit=options.buffer_limit,
            slots=runner.capacity + runner.backlog,
            deadlines=options.processing_timeout is not None,
            per_call_hooks=per_call_hooks,
            produces=delivery.produces,
            transactional=delivery.gate is not None,
            on_produced=delivery.on_produced is not None,
        )
        self.runner = runner
        self._chunker = features.chunks if modes.chunks else None
        self._chainer = features.chains if modes.chains else None
        self._many = features.many
        self.running = features.running
        self.modes = modes
        return modes

    def _submit_chunk(self, calls: list[tuple[int, PollContext]]) -> None:
        assert self._chunker is not None
        self._chunker.submit_chunk(calls)

    def _submit_many(self, calls: list[tuple[int, PollContext]]) -> None:
        assert self._many is not None
        self._many.submit_many(calls)

    def _chains_runner(self) -> ChainRunner:
        assert self._chainer is not None
        return self._chainer

    def dispatch(self, now: float, runs_out: int) -> None:
        """Hand out calls up to the call limit, less the ``runs_out`` workers runs hold."""
        take = self._ledger.shards.take
        blocked = self._ledger.commits.blocked
        in_flight = self._ledger.in_flight
        chunk = self.chunk_size
        limit = self.call_limit() - runs_out
        capacity = limit * chunk + self.chains.extra + self.bundles.extra
        batch_size = self._options.batch_size
        submit = self.runner.submit
        # Single calls (not chunks or chains) for a runner that takes many at once
        # (submit_many), in order.
        single: list[tuple[int, PollContext]] | None = [] if self._many is not None else None
        on_dispatch = self._on_dispatch
        timeout = self.timeout
        # Chains: calls not short enough for chunks, and not so long that one lane's next
        # records run later on a busy worker than they would on another (CHAIN_SECONDS).
        chain = 1
        if self.modes.chains and chunk == 1:
            chain = sizing.chain_length(self.service_time.value, self.modes.chain_most)
            if chain > 1 and len(self._ledger.shards) <= sizing.LONGEST_FIRST_LANES * capacity:
                # Calls of milliseconds over few lanes for the workers, where the longest
                # lane sets the end of a burst: serve the longest lanes first.
                take = self._ledger.shards.take_longest
                backlog = self.runner.backlog
                if len(self._ledger.shards) <= limit + backlog:
                    # So few lanes that the runner's backlog would hold every one not
                    # running: no lane would be left to choose from (see
                    # LONGEST_FIRST_BACKLOG).
                    capacity -= max(0, backlog - sizing.LONGEST_FIRST_BACKLOG)
        # Bundles: calls too long for chunks, and many more records ready than the workers
        # can start (see BUNDLES).
        bundle = self.bundle_size(limit) if chunk == 1 and self.modes.bundles else 1
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
                    self._ledger.shards.take_following(item, chain - 1, blocked)
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
                    self.deadlines.started(batch.id, now + timeout)
                    context = PollContext(
                        records, keep_alive=functools.partial(self._keep_alive, batch.id)
                    )
            if on_dispatch is not None:
                on_dispatch(batch.id, context)
            if chunk == 1:
                if after:
                    capacity += len(after)
                    if single:  # (the calls before it go first)
                        self._submit_many(single)
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
                self._submit_chunk(calls)
                self.chunks_out = True
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
            self._submit_many(single)
        if calls:
            if len(calls) == 1:
                submit(*calls[0])
            else:
                self._submit_chunk(calls)
                self.chunks_out = True

    def bundle_size(self, limit: int) -> int:
        """Calls per bundle in this dispatch pass (:func:`sizing.bundle_size`)."""
        ledger = self._ledger
        return sizing.bundle_size(
            self.service_time.value,
            bundle_most=self.modes.bundle_most,
            ready=ledger.shards.ready_count(ledger.commits.blocked) // self._options.batch_size,
            ready_factor=self.bundle_ready,
            limit=limit,
        )

    def _submit_bundle(
        self, calls: list[tuple[int, PollContext, tuple[TopicPartition, ...]]]
    ) -> None:
        """Calls of different lanes (each with the partitions of its records), run one after
        another on one worker (a chunk: see ``ThreadRunner.submit_chunk``, which also hands
        the rest of a stuck one to other workers); the call limit counts the bundle as one
        worker until its calls are over."""
        self.bundles.start([(call, tps) for call, _, tps in calls])
        self._ledger.counters.bundles += 1
        chunk = [(call, context) for call, context, _ in calls]
        self._submit_chunk(chunk)
        self.chunks_out = True

    def _submit_chain(
        self, first: int, context: PollContext, after: Sequence[WorkItem], now: float
    ) -> None:
        """Hand call ``first`` and the records ``after`` it in its lane to one worker as a
        chain: each record a call of its own in the in-flight table, started only once the
        one before it succeeded."""
        calls = [(first, context)]
        on_dispatch = self._on_dispatch
        for item in after:
            batch = self._ledger.in_flight.add((item,), now)
            follower = PollContext.of_one(
                RecordContext(item.message, item.attempts, item.last_failure, item.last_failure_at)
            )
            if on_dispatch is not None:
                on_dispatch(batch.id, follower)
            calls.append((batch.id, follower))
        tps = (after[0].tp,)
        self.chains.start([(call, tps) for call, _ in calls])
        self._ledger.counters.chains += 1
        self._chains_runner().submit_chain(calls)
        self.chunks_out = True

    def put_back(self, batch_ids: Sequence[int]) -> None:
        """Calls of a chain that never started (a call before them failed): their records go
        back to the front of their lane, as if never taken."""
        items: list[WorkItem] = []
        on_work_done = self.work_done_hook
        for batch_id in batch_ids:
            batch = self.take_back(batch_id)
            if batch is None:  # taken back meanwhile (close, the stall policy)
                continue
            if on_work_done is not None:
                # (every call handed out ends for the hooks, this one without running)
                error = CallCancelled("not started: a call before it in its chain failed or hung")
                on_work_done(batch_id, (error,) * len(batch.items), 0.0)
            for item in batch.items:
                if self._ledger.current(item.tp, item.epoch) is None:
                    # Its partition was revoked meanwhile: as for a stale result.
                    self._ledger.counters.stale += 1
                    self._ledger.to_release += 1
                    self._ledger.shards.stale_done(item)
                else:
                    items.append(item)
        if items and self._ledger.dropping:
            # (a close without drain took the records not started away; these leave too)
            self._ledger.to_release += len(items)
        elif items:
            self._ledger.shards.put_back(items)

    def recall_chain(self, chain: int) -> None:
        """Chain ``chain`` ends for the engine now: the calls it finished are settled (a
        revoke's final commit covers them) and its calls not started go back to their lane
        (a revoked partition's: released, like its waiting records). The call its worker is in
        reports on its own."""
        results, rest = self._chains_runner().take_back_chain(chain)
        if results:
            self.on_chunk_done(WorkDoneMany(results, 0.0))
        if rest:
            self.put_back(rest)

    def settle_bundled(self, tp: TopicPartition) -> None:
        """Report now the finished calls of every bundle with a call of ``tp``: a revoke's final
        commit must cover them (their worker would report them with the bundle's last call,
        too late). Their worker reports the rest."""
        if self._chunker is None or not self.bundles:
            return
        for bundle in self.bundles.of_partition(tp):
            results = self._chunker.take_finished(bundle)
            if results:
                self.on_chunk_done(WorkDoneMany(results, 0.0))

    def recall_chains(self, tp: TopicPartition) -> None:
        for chain in self.chains.of_partition(tp):
            self.recall_chain(chain)

    def take_back(self, batch_id: int) -> Batch | None:
        """A call the runner gave back before it started (close, or a chain's call behind a
        failed or hung one): it is over, and never reports. Its batch, if still in flight."""
        self.chains.over(batch_id)
        self.bundles.over(batch_id)
        # (a call the stall policy gave up on before it started is over too)
        self.deadlines.forget_overrun(batch_id)
        self.deadlines.ended(batch_id)
        return self._ledger.in_flight.pop(batch_id)

    def observe_service(self, took: float) -> None:
        """Adaptive dispatch: follow the time per call (:class:`ServiceTime`); calls much
        shorter than a thread hop go out in chunks (one hop for many calls), longer ones one by
        one, so that no call waits behind another on a worker while other workers are idle."""
        if not self.modes.chunks:
            return
        service = self.service_time.observe(took, self.service_clock())
        self.chunk_size = sizing.chunk_size_for(service)

    def release_stuck(self) -> None:
        """Hand the calls not started of stuck chunks to other workers (see Overdue)."""
        assert self._chunker is not None
        # (the finished calls it reports are handled now, not posted: a revoke handled before
        # them would leave them out of its final commit)
        moved = self._chunker.release_stuck(sizing.STUCK_AFTER, self.on_chunk_done)
        if moved:
            log.debug("%d calls of stuck chunks handed to other workers", moved)

    def call_done(self, event: WorkDone) -> None:
        """One call's report."""
        if event.took:
            self.observe_service(event.took)
        if self.bundles and event.batch in self.bundles:
            # A call of a stuck bundle that another worker ran reports alone; it began there,
            # not at the bundle's hand-out.
            self.bundles.over(event.batch)
            if event.took:
                self._ledger.in_flight.began(event.batch, event.finished_at - event.took)
        self.work_done(event.batch, event.errors, event.value, event.finished_at, event.partial)

    def wake_at(self, now: float, busy: bool) -> float | None:
        """When dispatch needs a turn of the loop: a call's deadline, or (chunks handed out,
        and calls or runs still ``busy``) the next look for stuck ones, as a chunk reports
        only when it ends."""
        wake = self.deadlines.next_at()
        if self.chunks_out:
            if busy:
                check = now + sizing.STUCK_CHECK_EVERY
                wake = check if wake is None else min(wake, check)
            else:
                self.chunks_out = False
        return wake

    def on_chunk_done(self, event: WorkDoneMany) -> None:
        if event.service:  # (0.0: not measured, as for the asyncio runner's reports)
            self.observe_service(event.service)
        work_done = self.work_done
        chains = self.chains
        bundles = self.bundles
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
                    self._ledger.in_flight.began(batch_id, began)
            work_done(batch_id, errors, value, finished_at, partial)
        if event.unstarted:
            # (after the failed call's outcome: its record waits for its retry at the front
            # of its lane, and these go back behind it)
            self.put_back(event.unstarted)

    def call_limit(self) -> int:
        """How many calls may be in flight. With deadlines there is no backlog inside the
        runner (a call's deadline measures the call, not a wait for a worker), and calls
        past their deadline that still run hold a worker each."""
        runner = self.runner
        backlog = runner.backlog if self.timeout is None else 0
        return runner.capacity + backlog - self.deadlines.overruns

    def _keep_alive(self, batch: int, seconds: float) -> None:
        # Runs on the handler's thread (or the process pool's): it only posts.
        self._post(DeadlineExtended(batch, self._clock.monotonic() + seconds))

    def work_done(
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
        for a call metrics saw already (a run's, see Samples.run)."""
        deadlines = self.deadlines
        if self.timeout is not None and deadlines.finished_late(batch_id, finished_at):
            # It ended after its deadline, before the controller noticed the deadline passed:
            # a late result like any other (it must not count), but the call is over.
            batch = self._ledger.in_flight.pop(batch_id)
            deadlines.ended(batch_id)
            if batch is None:  # pragma: no cover - a watched call is in flight
                return
            self._ledger.counters.deadline_exceeded += 1
            self._ledger.counters.late_results += 1
            error = DeadlineExceeded(
                f"the handler call ended after its deadline (processing_timeout="
                f"{self.timeout:g}s); its result is ignored"
            )
            self._ledger.settle(batch, (error,) * len(batch.items), finished_at)
            return
        if deadlines.ended(batch_id):
            # The call ran past its deadline and its records went on without it.
            self._ledger.counters.late_results += 1
            log.info("the late result of handler call %d is ignored", batch_id)
            return
        batch = self._ledger.in_flight.pop(batch_id)
        if batch is None:
            return  # taken back from the runner on close
        if self.work_done_hook is not None:
            self.work_done_hook(batch.id, errors, finished_at - batch.started_at)
        if sample and self.samples.sampling is not None:
            self.samples.call(batch, errors, finished_at)
        if self._delivery.produces and (partial or not any(errors)):
            # Outputs belong to the call: a record it failed with PollContext.fail is retried
            # (or dead-lettered) on its own, once the call's outputs are acknowledged.
            outcome = self._delivery.offer(batch, errors, value, partial)
            if outcome is None:
                return
            errors = outcome
        self._ledger.settle(batch, errors, finished_at)
