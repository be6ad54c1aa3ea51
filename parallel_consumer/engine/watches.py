"""Watches: back-pressure (which partitions to pause), the whole engine's stall watch, and each
partition's progress (docs/health.md). Owned by the controller thread.

A watch decides and returns what to do: a :class:`SetPaused` command for the poller, a
:class:`StallReport`, the partitions found stalled. The controller carries it out; the
watches read the ledger and act on nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from parallel_consumer._events import SetPaused
from parallel_consumer.engine.delivery import Delivery
from parallel_consumer.engine.dispatch import Dispatch
from parallel_consumer.engine.ledger import Ledger
from parallel_consumer.engine.runs import RunDispatch
from parallel_consumer.hooks import StallReport
from parallel_consumer.options import Options, ProcessingOrder
from parallel_consumer.work.backpressure import Pauses
from parallel_consumer.work.item import TopicPartition
from parallel_consumer.work.progress import Stall
from parallel_consumer.work.stall import StallWatch

__all__ = ["Seen", "Watches"]


@dataclass(slots=True)
class Seen:
    """What the watches found in one turn, for the controller to act on."""

    #: The partitions to pause from now on (None: no change).
    paused: SetPaused | None = None
    #: Records waited with nothing running for too long.
    report: StallReport | None = None
    #: Partitions whose lowest unfinished record has held them up too long.
    stalls: list[Stall] = field(default_factory=list)


#: Nothing found (the common turn: no allocation).
NOTHING = Seen()


class Watches:
    """Pauses, the stall watch and the progress watch's timing. See the module docstring."""

    def __init__(
        self,
        options: Options,
        *,
        ledger: Ledger,
        delivery: Delivery,
        dispatch: Dispatch,
        runs: RunDispatch,
    ) -> None:
        self._ledger = ledger
        self._delivery = delivery
        self._dispatch = dispatch
        self._runs = runs
        self.pauses = Pauses(
            options.buffer_limit,
            options.fetch_batch_size,
            partition_order=options.ordering is ProcessingOrder.PARTITION,
        )
        self.stall = StallWatch()
        #: When to observe every partition's progress next (None: nothing to watch).
        self.progress_at: float | None = 0.0
        self._progress_every = min(1.0, (options.stall_threshold or 10.0) / 10)

    def wake_at(self) -> float | None:
        """When a watch needs a turn of the loop even if no event comes: a paused partition
        resumes once its backlog drained, a stall is reported."""
        wakes = [
            w
            for w in (self.pauses.wake_at(), self.stall.wake_at(), self.progress_at)
            if w is not None
        ]
        return min(wakes) if wakes else None

    def look(self, now: float, *, running: bool, watching: bool) -> Seen:
        """One turn's look: pauses (``running``: not paused by the user), the engine's stall
        and partition progress (``watching``: running or draining)."""
        ledger = self._ledger
        paused = None
        if self.pauses.due(now, self._starving):
            paused = self.pause(now, self._backlog(), running=running, starving=self._starving())
        runs = self._runs.runs
        report = self.stall_report(
            now,
            stalled=bool(
                watching
                and ledger.shards.waiting
                and not ledger.in_flight
                and not runs
                and not self._delivery.pending
                and not ledger.retries
                and not self._dispatch.deadlines.overruns  # hung calls hold every worker
            ),
            in_flight=ledger.in_flight.records + runs.records_out,
        )
        stalls: list[Stall] = []
        if self.progress_at is not None and now >= self.progress_at:
            stalls = self.progress(now, watching=watching)
        elif ledger.moved:
            stalls = self.progress(now, watching=watching, only=ledger.moved)
        ledger.moved.clear()
        if paused is None and report is None and not stalls:
            return NOTHING
        return Seen(paused, report, stalls)

    def _starving(self) -> bool:
        """Workers are idle while records wait: every waiting record is behind a busy lane.
        (Records queued for runs wait for their partition's run by design: one run of a
        partition at a time is what keeps its order, and it is no sign of crowding.)"""
        dispatch = self._dispatch
        shards = self._ledger.shards
        return (
            len(self._ledger.in_flight)
            - dispatch.chains.extra
            - dispatch.bundles.extra
            + self._runs.workers_out()
            < dispatch.call_limit()
            and shards.waiting > self._runs.runs.queued_records()
            and not shards.has_ready()
        )

    def _backlog(self) -> Mapping[TopicPartition, int]:
        """Records per partition waiting to finish: in the lanes, and (not settled) in runs,
        chains and bundles out."""
        backlog = self._ledger.shards.waiting_by_tp
        active = self._runs.runs.active
        chained = self._dispatch.chains.by_tp
        bundled = self._dispatch.bundles.by_tp
        if active or chained or bundled:
            backlog = dict(backlog)
            for tp, run in active.items():
                backlog[tp] = backlog.get(tp, 0) + len(run) - run.settled
            for held in (chained, bundled):
                for tp, count in held.items():
                    backlog[tp] = backlog.get(tp, 0) + count
        return backlog

    # -- back-pressure --------------------------------------------------------------------------

    def pause(
        self,
        now: float,
        backlog: Mapping[TopicPartition, int],
        *,
        running: bool,
        starving: bool,
    ) -> SetPaused | None:
        """The partitions to pause now (None: no change), from each one's ``backlog``."""
        wanted = self.pauses.update(
            now, backlog, self._ledger.partitions.keys(), running=running, starving=starving
        )
        return None if wanted is None else SetPaused(wanted)

    # -- the engine's stall ---------------------------------------------------------------------

    def stall_report(self, now: float, *, stalled: bool, in_flight: int) -> StallReport | None:
        """A report when records have waited with nothing running for too long (``stalled``
        says whether that is so now)."""
        idle_for = self.stall.observe(now, stalled=stalled)
        if idle_for is None:
            return None
        ledger = self._ledger
        return StallReport(
            waiting=ledger.shards.waiting,
            retry_waiting=len(ledger.retries),
            in_flight=in_flight,
            paused_partitions=len(self.pauses.paused),
            blocked_partitions=len(ledger.commits.blocked),
            idle_for=idle_for,
        )

    # -- partition progress ---------------------------------------------------------------------

    def progress(
        self, now: float, *, watching: bool, only: Collection[TopicPartition] | None = None
    ) -> list[Stall]:
        """Observe the progress of every partition (or ``only`` those; none unless
        ``watching``); returns the partitions found stalled."""
        ledger = self._ledger
        progress = ledger.progress
        stalls: list[Stall] = []
        if watching:
            partitions = ledger.partitions
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
        every = self._progress_every
        if only is None:
            wake = progress.wake_at()
            if progress.watching:
                periodic = now + every
                wake = periodic if wake is None else min(wake, periodic)
            self.progress_at = wake
        elif self.progress_at is None or self.progress_at > now + every:
            self.progress_at = now + every
        return stalls

    def resumed(self, now: float) -> None:
        """Nothing could progress while paused: stall clocks start again."""
        self._ledger.progress.restart_all(now)
        self.progress_at = 0.0
