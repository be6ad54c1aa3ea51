"""Overdue calls: chunks and runs whose calls turned slow or hang (their calls not started
go to other workers), a call past its deadline (``processing_timeout``, docs/deadlines.md) or a
record that holds its stalled partition (``on_stall=DEAD_LETTER``, docs/health.md) is
abandoned, its records failed through the ledger's usual path. Owned by the controller thread;
it uses dispatch (the call, its deadline, its chain), runs (whether the call is a detached
run's), delivery (the dead letter) and the ledger.
"""

from __future__ import annotations

import logging
import time

from parallel_consumer.dead_letter import Reason
from parallel_consumer.engine.delivery import Delivery
from parallel_consumer.engine.dispatch import Dispatch
from parallel_consumer.engine.ledger import Ledger
from parallel_consumer.engine.runs import RunDispatch
from parallel_consumer.errors import DeadlineExceeded
from parallel_consumer.health import PartitionStall, stalled_error
from parallel_consumer.hooks import Hooks
from parallel_consumer.options import Options, StallPolicy
from parallel_consumer.work import sizing
from parallel_consumer.work.inflight import Batch
from parallel_consumer.work.item import WorkItem
from parallel_consumer.work.progress import Stall

__all__ = ["Overdue"]

log = logging.getLogger("parallel_consumer")


class Overdue:
    """Abandons calls that ran too long, and applies ``on_stall``. Holds no state."""

    def __init__(
        self,
        options: Options,
        *,
        ledger: Ledger,
        delivery: Delivery,
        dispatch: Dispatch,
        runs: RunDispatch,
        hooks: Hooks,
    ) -> None:
        self._options = options
        self._hooks = hooks
        #: When to look for stuck chunks and runs next (time.monotonic(): it is about real
        #: threads, not the engine's clock).
        self.next_stuck_check = 0.0
        self._ledger = ledger
        self._delivery = delivery
        self._dispatch = dispatch
        self._runs = runs

    def release_stuck(self) -> None:
        """Every STUCK_CHECK_EVERY (chunks on): detach runs whose calls turned slow or hang,
        and hand the calls not started of stuck chunks to other workers."""
        real_now = time.monotonic()
        if real_now < self.next_stuck_check:
            return
        self.next_stuck_check = real_now + sizing.STUCK_CHECK_EVERY
        if self._runs.runs.active:
            self._runs.check(time.perf_counter())
        self._dispatch.release_stuck()

    def expire_calls(self, now: float) -> None:
        for batch_id in self._dispatch.deadlines.expired(now):
            batch = self._ledger.in_flight.pop(batch_id)
            if batch is None:  # pragma: no cover - a watched call is in flight
                self._dispatch.deadlines.forget_overrun(batch_id)
                continue
            assert self._dispatch.timeout is not None
            self._ledger.counters.deadline_exceeded += 1
            error = DeadlineExceeded(
                f"the handler call ran past its deadline (processing_timeout="
                f"{self._dispatch.timeout:g}s) and was abandoned"
            )
            self.abandon(batch, error, now)

    def abandon(
        self, batch: Batch, error: BaseException, now: float, *, whole: Batch | None = None
    ) -> None:
        """Fail ``batch``'s records now (``batch`` is already out of the in-flight table and
        an overrun in the dispatch's deadlines) and ask the runner to end the call. Whatever
        the call reports later is ignored: the records go on through the normal failure path.
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
        dispatch = self._dispatch
        if dispatch.work_done_hook is not None:
            dispatch.work_done_hook(call.id, (error,) * len(call.items), now - call.started_at)
        if dispatch.samples.sampling is not None:
            # (its duration so far: longer than the deadline, possibly than slow_after)
            dispatch.samples.call(call, (error,) * len(call.items), now)
        # The asyncio runner cancels the task, the process runner replaces the worker process;
        # a thread runs on (it holds a worker until it returns: see Dispatch.call_limit). A
        # detached run's call is on a thread: it runs on.
        if call.id not in self._runs.adopted:
            dispatch.runner.cancel(call.id, error)
        chain = self._dispatch.chains.chain_of(call.id)
        if chain is not None:
            # The records chained behind it must not wait for a call that may never return:
            # they go back to their lane (which stays busy until this record is settled).
            self._dispatch.recall_chain(chain)
        if batch.items:
            self._ledger.settle(batch, (error,) * len(batch.items), now)

    def stalled_record(self, item: WorkItem, now: float) -> None:
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
        runner_running = self._dispatch.running
        adopted = self._runs.adopted

        def running(batch_id: int) -> bool | None:
            # (a detached run's call is running; None: the runner cannot tell)
            if batch_id in adopted:
                return True
            return None if runner_running is None else runner_running(batch_id)

        for batch in self._ledger.in_flight:
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
            if age < threshold and key not in self._ledger.stall_chances:
                # A new attempt (say, its retry) gets one chance, once per record.
                self._ledger.stall_chances.add(key)
                log.info(
                    "%s[%d]@%d holds the partition; its call was handed over %.1fs ago: it gets "
                    "its chance",
                    *item.tp,
                    item.offset,
                    age,
                )
                return
            self._ledger.in_flight.pop(batch.id)
            self._dispatch.deadlines.expire(batch.id)
            self._ledger.counters.deadline_exceeded += 1
            error = DeadlineExceeded(
                f"{item.tp[0]}[{item.tp[1]}]@{item.offset} held its partition for longer "
                f"than stall_threshold={threshold}s (on_stall=DEAD_LETTER)"
            )
            # The call is abandoned; its other records (a batch) fail and are retried as usual,
            # and the record holding the partition goes to the dead-letter topic whatever the
            # retry policy says: the stall policy decided.
            others = tuple(i for i in batch.items if i is not item)
            self.abandon(Batch(batch.id, others, batch.started_at), error, now, whole=batch)
            self._ledger.count_failure(item, error)
            self._delivery.dead_letter(item, error, Reason.STALLED)
            return
        if self._ledger.retries.find(item.tp, item.offset) is item:
            self._delivery.dead_letter(item, item.last_failure, Reason.STALLED)
            return
        log.warning(
            "%s[%d]@%d holds the partition but is neither in a handler call nor waiting for "
            "its retry (it waits for a worker): nothing to dead-letter",
            *item.tp,
            item.offset,
        )

    def partition_stalled(self, stall: Stall, now: float) -> None:
        """A partition's lowest unfinished record held it up for ``stall_threshold``: report
        it, and apply ``on_stall`` (STOP raises; DEAD_LETTER abandons the record's call)."""
        policy = self._options.on_stall
        topic, partition = stall.tp
        self._ledger.counters.partition_stalls += 1
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
            item = self._ledger.blocking_item(stall.tp, stall.offset)
            if item is not None:
                self.stalled_record(item, now)
            # If the record holds the partition again, that is a new episode.
            self._ledger.progress.restart(stall.tp, now)
