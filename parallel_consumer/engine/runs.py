"""Runs: a partition's records handed to one worker in offset order, while calls are very
short (docs/performance.md#runs). Owned by the controller thread.

Polled records go to runs (:meth:`RunDispatch.on_records`) unless their lane has records in
the lanes; a run that fails, turns slow or is taken back hands its records not started to the
lanes (:meth:`RunDispatch.to_lanes`), where they go on like any record. A detached run's call
in progress becomes a single call of the in-flight table (``adopted``). Calls go one way:
this part uses dispatch (the call limit, the measured time per call, the result of an
adopted call), delivery (a run's outputs) and the ledger; none of them uses it.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from parallel_consumer._clock import Clock
from parallel_consumer._events import RecordsPolled, RunDone
from parallel_consumer.engine.delivery import Delivery, RunOutputsFailed
from parallel_consumer.engine.dispatch import Dispatch
from parallel_consumer.engine.ledger import Ledger
from parallel_consumer.options import Options, ProcessingOrder
from parallel_consumer.runners.base import CallCancelled, RunRunner
from parallel_consumer.work import sizing
from parallel_consumer.work.item import TopicPartition, WorkItem
from parallel_consumer.work.lanes import key_lanes
from parallel_consumer.work.partitions import PartitionState
from parallel_consumer.work.runs import Run, Runs, cut_batches
from parallel_consumer.work.sizing import Modes

__all__ = ["RunDispatch"]

log = logging.getLogger("parallel_consumer")


class RunDispatch:
    """Runs queued and out, and the calls of detached runs. See the module docstring."""

    def __init__(
        self,
        options: Options,
        *,
        clock: Clock,
        ledger: Ledger,
        delivery: Delivery,
        dispatch: Dispatch,
    ) -> None:
        self._options = options
        self._clock = clock
        self._ledger = ledger
        self._delivery = delivery
        self._dispatch = dispatch
        self._runner: RunRunner | None = None
        #: Runs of consecutive records (work/runs.py).
        self.runs = Runs()
        self.modes = dispatch.modes
        #: Calls of detached runs, now single calls in the in-flight table: batch id -> run.
        self.adopted: dict[int, Run] = {}

    def start(self, runner: RunRunner | None, modes: Modes) -> None:
        self._runner = runner if modes.runs else None
        self.modes = modes

    @property
    def on(self) -> bool:
        return self._runner is not None

    def _submit_run(self, run: Run) -> None:
        assert self._runner is not None
        self._runner.submit_run(run)

    def on_records(self, event: RecordsPolled) -> None:
        """Register polled records: in runs where they may go, else in their lanes."""
        ledger = self._ledger
        for tp, (epoch, messages) in event.batches.items():
            fresh = ledger.accept(tp, epoch, messages)
            if fresh:
                fresh = self.divert(tp, epoch, fresh)
            if fresh:
                ledger.add(tp, epoch, fresh)

    def divert(self, tp: TopicPartition, epoch: int, fresh: list[Any]) -> list[Any]:
        """Queue for runs what of ``fresh`` may go to them; return the records for the lanes.

        A record goes to a run unless its lane has records (waiting, running or waiting for a
        retry): each lane's records are all in runs or all in lanes, in offset order either
        way. A partition with records queued for runs keeps queuing them (behind those), even
        after calls turned long: the queue goes to the lanes as a whole when it is next due
        (:meth:`start_runs`)."""
        runs = self.runs
        shards = self._ledger.shards
        if not runs.busy(tp) and (
            not self._short()
            or tp in self._ledger.commits.blocked
            # (transactional: records that failed before an abort keep their attempts in the
            # lanes, see _recall_failures; runs start again once commits passed them)
            or (self._ledger.history and any(k[0] == tp for k in self._ledger.history))
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
            has_lane = shards.has_lane
            take_idle = shards.take_idle
            to_run, to_lanes = list[Any](), list[Any]()
            for message, key in zip(fresh, key_lanes(tp, fresh), strict=True):
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
            self._ledger.counters.registered += len(to_run) - len(taken)
        return to_lanes

    def to_lanes(
        self, tp: TopicPartition, messages: Sequence[Any] = (), *, counted: bool = False
    ) -> None:
        """Put ``messages`` (records of a run that left it, in offset order), then the records
        queued for runs of ``tp``, into their lanes. ``counted``: ``messages`` count as waiting
        already."""
        state = self._ledger.partitions[tp]
        epoch = state.epoch
        queued = self.runs.take_queued(tp)
        rest = list(messages)
        if counted and rest:
            self._ledger.shards.count_waiting(tp, -len(rest))
        if queued is not None:
            self._ledger.shards.count_waiting(tp, -len(queued[1]))
            rest.extend(queued[1])
        if rest:
            self._ledger.shards.add(tp, self._ledger.items(tp, epoch, rest))

    def _record_service(self) -> float | None:
        """The measured time per record: per call, over ``batch_size`` records a call."""
        service = self._dispatch.service_time.value
        batch_size = self._options.batch_size
        return service / batch_size if service and batch_size > 1 else service

    def _short(self) -> bool:
        """Calls are short enough for runs: a record takes at most a thread hop over
        RUN_FROM_CHUNK (with batches: the call over its records)."""
        if self._options.batch_size == 1:
            return self._dispatch.chunk_size >= sizing.RUN_FROM_CHUNK
        service = self._record_service()
        return service is not None and sizing.chunk_size_for(service) >= sizing.RUN_FROM_CHUNK

    def start_runs(self) -> int:
        """Hand out a run for each partition with records queued and none out, as far as
        the call limit allows; returns how many runs are out."""
        runs = self.runs
        queued = runs.queued
        limit = self._dispatch.call_limit()
        short = self._short()
        blocked = self._ledger.commits.blocked
        longest = sizing.run_length(self._record_service())
        sampling = self._dispatch.samples.sampling
        timed = sampling.slow_after if sampling is not None else None
        distinct = self.modes.produce_runs and self._options.ordering is ProcessingOrder.KEY
        batch_size = self._options.batch_size
        by_key = self._options.ordering is ProcessingOrder.KEY
        for tp in list(queued):
            if tp in runs.active:
                continue
            if not short or tp in blocked:
                self.to_lanes(tp)
                continue
            if len(self._ledger.in_flight) + self.workers_out() >= limit:
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
            batches = None
            if batch_size > 1:
                lanes = key_lanes(tp, messages) if by_key else None
                batches = cut_batches(messages, batch_size, lanes)
            run = runs.start(tp, epoch, messages, timed=timed, batches=batches)
            if self.modes.produce_runs:
                run.outputs = []
            self._ledger.counters.runs += 1
            self._ledger.shards.count_waiting(tp, -len(messages))
            self._submit_run(run)
            self._dispatch.chunks_out = True
        return self.workers_out()

    def _distinct_keys(self, tp: TopicPartition, messages: deque[Any], most: int) -> int:
        """How many of ``messages`` from the first may run as one run of poll_and_produce in
        KEY order: up to the first whose key has outputs on their way (held, see RunOutputs)
        or appears before it in the run. A run's records then produce for distinct keys, so
        a failed output retries its record before any later record of its key runs."""
        is_held = self._ledger.shards.is_held
        seen: set[object] = set()
        add = seen.add
        for index, lane in enumerate(key_lanes(tp, list(itertools.islice(messages, most)))):
            if lane in seen or is_held(lane):
                return index
            add(lane)
        return min(most, len(messages))

    def workers_out(self) -> int:
        """Workers that runs hold, beside the calls of the in-flight table: one per run out,
        but for a detached run whose call in progress is in that table already (adopted): a
        hung call must hold one slot of the call limit, not two."""
        out = len(self.runs.out)
        if self.adopted:
            # (an adopted call abandoned by the stall policy counts as an overrun instead)
            in_flight = self._ledger.in_flight
            overrun = self._dispatch.deadlines.is_overrun
            out -= sum(1 for b in self.adopted if b in in_flight or overrun(b))
        return out

    def on_run_done(self, event: RunDone) -> None:
        run = event.run
        self.runs.ended(run)
        if event.service:
            self._dispatch.observe_service(event.service)
        if run.adopted is not None:
            # Detached: its records were settled or went to the lanes then, but for the call
            # that was in progress, which is a single call of the in-flight table now.
            indices, batch_id = run.adopted
            self.adopted.pop(batch_id, None)
            index = indices.start
            value = None
            partial = False
            errors: tuple[BaseException | None, ...]
            if event.ok >= indices.stop:
                errors = (None,) * len(indices)
                if run.outputs is not None:
                    value = run.outputs[index]
            elif event.error is not None:
                errors = event.errors or (event.error,)
                partial = event.errors is not None and None in event.errors
                if run.outputs is not None and len(run.outputs) > index:
                    # It failed its record with PollContext.fail, and returned outputs
                    value, partial = run.outputs[index], True
            else:
                cancelled = CallCancelled("the runner stopped before the call started")
                errors = (cancelled,) * len(indices)
            self._dispatch.work_done(batch_id, errors, value, event.finished_at, partial)
            return
        if run.detached:
            return
        tp = run.tp
        state = self._ledger.current(tp, run.epoch)
        if state is None:  # pragma: no cover - forget detaches
            self._ledger.stale(len(run) - run.settled)
            return
        if event.samples and self._dispatch.samples.sampling is not None:
            self._dispatch.samples.run(run, event)
        ok = event.ok
        self.settle_run(run, state, ok)
        if ok == len(run):
            return
        # The run ended early: a call failed, or the runner stopped. The failed record and all
        # after it go to the lanes (the failed one busy in its lane, so that the records of
        # its key wait behind it), where failures are handled as for any record.
        error = event.error
        rest = run.messages[ok:]
        if error is None:
            self.to_lanes(tp, rest)
            return
        if event.errors is not None:
            self._batch_failed(run, state, event.errors, event.finished_at)
            return
        item = self._ledger.item_of(tp, run.epoch, rest[0])
        self._ledger.shards.adopt(item)
        self.to_lanes(tp, rest[1:])
        if run.outputs is not None and len(run.outputs) > ok:
            # The call failed its record with PollContext.fail and returned outputs: they are
            # produced, and the failure applies once they are acknowledged, as for any call.
            batch = self._ledger.in_flight.add((item,), self._clock.monotonic())
            self._dispatch.work_done(
                batch.id, (error,), run.outputs[ok], event.finished_at, True, sample=False
            )
            return
        self._ledger.failed(item, error, event.finished_at)

    def _batch_failed(
        self,
        run: Run,
        state: PartitionState,
        errors: tuple[BaseException | None, ...],
        now: float,
    ) -> None:
        """A batch of a batched run failed (``errors``: its records' outcomes, from record
        ``run.settled``): the records it did not fail are finished; those it failed, busy in
        their lanes, and every record after the batch go to the lanes, as for a run whose
        call failed. (In KEY order a batch holds distinct keys: finishing a record after a
        failed one of the batch overtakes nothing of its key.)"""
        ledger = self._ledger
        tp, first = run.tp, run.settled
        batch = run.messages[first : first + len(errors)]
        run.settled = first + len(batch)
        good = [m for m, e in zip(batch, errors, strict=True) if e is None]
        if good:
            ledger.settle_messages(state, good)
        failed = []
        for message, error in zip(batch, errors, strict=True):
            if error is not None:
                item = ledger.item_of(tp, run.epoch, message)
                ledger.shards.adopt(item)
                failed.append((item, error))
        self.to_lanes(tp, run.messages[run.settled :])
        for item, error in failed:
            ledger.failed(item, error, now)

    def settle_run(self, run: Run, state: PartitionState, upto: int) -> None:
        """The calls of ``run`` from its last settled one up to ``upto`` succeeded: their
        records are finished, or (poll_and_produce) finish once their outputs are
        acknowledged."""
        first = run.settled
        if upto <= first:
            return
        run.settled = upto
        if run.outputs is None:
            self._ledger.settle_messages(state, run.messages[first:upto])
        else:
            self._delivery.run_outputs(run, state, first, upto)

    def detach(self, run: Run, *, drop: bool) -> None:
        """Take back the records ``run`` has not started: they go to the lanes (or, with
        ``drop``, stay for the partition's next owner: a close without drain). The call in
        progress becomes a single call of the in-flight table; finished records are settled."""
        detached = self.runs.detach(run)
        state = self._ledger.current(run.tp, run.epoch)
        if state is None:  # pragma: no cover - forget detaches
            return
        self.settle_run(run, state, detached.finished.stop)
        if detached.running is not None:
            self.adopt(run, detached.running, lane=True)
        if drop:
            self._ledger.to_release += len(detached.drained)
        else:
            self.to_lanes(run.tp, detached.drained)

    def adopt(self, run: Run, indices: range, *, lane: bool) -> tuple[WorkItem, ...]:
        """The call of ``run``'s records ``indices`` (one, or a batch) is in progress while the
        run is detached: make it a call of the in-flight table (their lanes busy, with
        ``lane``)."""
        items = tuple(self._ledger.item_of(run.tp, run.epoch, run.messages[i]) for i in indices)
        for item in items:
            if lane:
                self._ledger.shards.adopt(item)
            else:
                item.in_flight = True
        now = self._clock.monotonic()
        if run.timed is not None and run.call_started:
            # (metrics measure the call from its start, not from now)
            now -= max(0.0, time.perf_counter() - run.call_started)
        batch = self._ledger.in_flight.add(items, now)
        run.adopted = (indices, batch.id)
        self.adopted[batch.id] = run
        return items

    def check(self, real_now: float) -> None:
        """Detach runs whose current call takes long (it hangs), or whose calls turned slow:
        their records not started go to the lanes, and other workers.

        Each look judges the run on what happened since the previous look: stuck if no call
        ended for STUCK_AFTER, slow if the calls that ended since the previous look took more
        than RUN_SLOW_CALL each (once the run is STUCK_AFTER old). A run is detached when a
        later look agrees with an earlier one. A pause of the whole process (a full garbage
        collection takes 20-50 ms, and so can a thread starved of the GIL) makes one look find
        every run slow, and the next finds them fast again."""
        stuck_after, slow_call = sizing.STUCK_AFTER, sizing.RUN_SLOW_CALL
        for run in list(self.runs.active.values()):
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
            stuck = real_now - run.progress_at > stuck_after
            slow = real_now - started > stuck_after and window > slow_call * max(1, calls)
            if not (stuck or slow):
                run.slow_since = 0.0
                continue
            if not run.slow_since:
                run.slow_since = real_now
                continue
            if real_now - run.slow_since < sizing.STUCK_CHECK_EVERY / 2:
                continue  # (the same look, or one right after it)
            log.debug("%r detached: its calls are no longer short", run)
            self._ledger.counters.runs_detached += 1
            self.detach(run, drop=False)

    def outputs_failed(self, outcome: RunOutputsFailed, now: float) -> None:
        """A failed output retries its record, in its lane; everything of the partition still
        to run goes to the lanes (after its run out, if any), where the records of its key
        wait behind it: the rule of a run that failed (see on_run_done)."""
        ledger = self._ledger
        pending, state, failures = outcome.pending, outcome.state, outcome.failures
        tp = pending.tp
        run = self.runs.active.get(tp)
        if run is not None and run.epoch == state.epoch:
            self.detach(run, drop=False)
        good = [m for i, m in enumerate(pending.messages) if i not in failures]
        if good:
            ledger.settle_messages(state, good)
        items = []
        for index, error in failures.items():
            item = ledger.item_of(tp, pending.epoch, pending.messages[index])
            ledger.shards.adopt(item)  # (before the holds end: its lane stays busy)
            items.append((item, error))
        self.to_lanes(tp)
        if pending.held is not None:
            ledger.shards.release(pending.held)
        for item, error in items:
            ledger.failed(item, error, now)

    def settle_for_revoke(self, tp: TopicPartition, state: PartitionState) -> None:
        """The calls its worker finished of ``tp``'s run succeeded: the revoke's final commit
        covers them (their report would come too late). Read once: the count only grows. (Not
        those of poll_and_produce: their outputs are not acknowledged.)"""
        run = self.runs.active.get(tp)
        if run is not None and run.epoch == state.epoch and run.outputs is None:
            before = run.settled
            self.settle_run(run, state, min(run.done, len(run.messages)))
            self.runs.settled_early(run.settled - before)

    def forget(self, tp: TopicPartition) -> None:
        """``tp`` is no longer ours (already out of the ledger's partitions)."""
        ledger = self._ledger
        run = self.runs.active.get(tp)
        if run is not None:
            # Its records finished since the revoke settled the rest are not settled (the
            # partition is gone); the call in progress is held by the ledger like any call in
            # flight of the partition.
            detached = self.runs.detach(run)
            run.settled = detached.finished.stop
            ledger.counters.stale += len(detached.finished)
            ledger.to_release += len(detached.finished) + len(detached.drained)
            if detached.running is not None:
                self.adopt(run, detached.running, lane=False)
        self.drop_queued(tp)

    def drop_queued(self, tp: TopicPartition) -> None:
        """The records queued for runs of ``tp`` stay for the partition's next owner."""
        queued = self.runs.take_queued(tp)
        if queued is not None:
            self._ledger.to_release += len(queued[1])

    def stop(self) -> None:
        """Close without drain: every run is taken back, its records not started dropped."""
        for run in list(self.runs.active.values()):
            self.detach(run, drop=True)
