"""Controller: the loop, the routing of events to their owner, and close (thread
``<name>-controller``).

It is the only thread that changes the engine's state, one event at a time, through parts
that each own one kind of state (docs/architecture.md):

- the ledger (engine/ledger.py): every record held, and what happens to a finished one;
- dispatch (engine/dispatch.py) and runs (engine/runs.py): calls out and their results;
- delivery (engine/delivery.py): outputs, dead letters and the transaction gate;
- overdue (engine/overdue.py): calls past their deadline or holding a stalled partition;
- watches (engine/watches.py): pauses, the stall watch and partition progress;
- commits (engine/commits.py): the committer port, commit timing and the broker's answers;
- rebalance (engine/rebalance.py): the order in which the parts let go of a partition.

Calls go one way: controller -> parts -> ledger -> ``work/``. Parts that decide return what
to do (a command for the poller, a commit to send, a report), and the controller does it.
Other threads only post events (:meth:`Controller.post`); the controller answers through
futures and by sending commands to the poller, commits to the committer and calls to the
runner.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

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
    PollerFailed,
    PositionsReached,
    ProducerFailed,
    RecordsPolled,
    RecordUnreadable,
    Release,
    RunDone,
    StopPoller,
    WorkDone,
    WorkDoneMany,
)
from parallel_consumer.engine import views
from parallel_consumer.engine.closing import STOP_TIMEOUT, Closing, Step
from parallel_consumer.engine.letters import DeadLetters
from parallel_consumer.engine.parts import Parts, PollerPort
from parallel_consumer.errors import InternalError, RetriesExhausted
from parallel_consumer.health import HealthReport
from parallel_consumer.hooks import CallSampling, Hooks, NoHooks, active_hooks
from parallel_consumer.kafka.committers import Committer
from parallel_consumer.kafka.producer import Outputs
from parallel_consumer.options import Options
from parallel_consumer.produce import ProduceResult
from parallel_consumer.runners.base import Handler, Runner
from parallel_consumer.status import Lifecycle, Statistics

__all__ = ["Controller"]

log = logging.getLogger("parallel_consumer")

#: The per-call and per-record hooks: with any of them, no runs (a run calls none).
PER_CALL_HOOKS = frozenset({"on_dispatch", "on_work_done", "on_success"})


class Controller:
    """The engine's single decision maker. See docs/architecture.md."""

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
        self._clock = clock
        self._hooks = hooks or NoHooks()
        active = active_hooks(self._hooks)
        self._per_call_hooks = bool(active & PER_CALL_HOOKS)
        # -- the parts (controller thread only; engine/parts.py wires them) --
        parts = Parts.build(
            options,
            clock=clock,
            runner=runner,
            committer=committer,
            hooks=self._hooks,
            active=active,
            sampling=sampling,
            post=self.post,
        )
        self._parts = parts
        self.ledger = parts.ledger
        self.delivery = parts.delivery
        self.dispatch = parts.dispatch
        self.runs = parts.runs
        self.overdue = parts.overdue
        self.watches = parts.watches
        self.commits = parts.commits
        self.rebalance = parts.rebalance
        self._inbox: queue.SimpleQueue[ControllerEvent] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, name=f"{name or options.name}-controller", daemon=True
        )
        #: Written only by the controller thread; others may read it.
        self.lifecycle = Lifecycle.NEW
        #: Resolved when the controller has stopped: with None, or with the failure.
        self.stopped: Future[None] = Future()
        self._failure: BaseException | None = None
        self._close: Closing | None = None

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
        delivery = self.delivery
        delivery.configure(
            outputs, produces=produces, on_produced=on_produced, letters=dead_letters
        )
        # The runner's capabilities, read once; the ways calls go out, decided once.
        modes = self.dispatch.start(self._runner, per_call_hooks=self._per_call_hooks)
        self.runs.start(self._runner.features.runs, modes)
        self._runner.start(handler, self.post)
        self.lifecycle = Lifecycle.RUNNING
        self.ledger.commits.schedule(self._clock.monotonic())
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
            for revoke, _ in self.delivery.revokes:
                revoke.reply.set_result(None)
            if self.delivery.outputs is not None:
                self.delivery.outputs.close(abort=self._failure is not None)
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
        ledger = self.ledger
        dispatch = self.dispatch
        now = clock.monotonic()
        wait = self._wake_at(now) - now if block else 0.0
        try:
            event: ControllerEvent | None = (
                inbox.get(timeout=clock.block_for(wait)) if wait > 0 else inbox.get_nowait()
            )
        except queue.Empty:
            event = None
        while event is not None:
            self._handle(event)
            if ledger.letters_due:
                self._write_due_letters()
            try:
                event = inbox.get_nowait()
            except queue.Empty:
                event = None
        now = clock.monotonic()
        if ledger.retries and (due := ledger.pop_due_retries(now)):
            ledger.retry_now(self.delivery.resend_letters(due))
        for tp in ledger.commits.take_to_unpark():
            ledger.shards.unpark(tp)
        due_at = dispatch.deadlines.next_at()
        if due_at is not None and now >= due_at:
            self.overdue.expire_calls(now)
        if dispatch.modes.chunks:
            self.overdue.release_stuck()
        if ledger.letters_due:
            self._write_due_letters()
        if self.lifecycle is Lifecycle.RUNNING or self.lifecycle is Lifecycle.DRAINING:
            runs = self.runs
            dispatch.dispatch(now, runs.start_runs() if runs.runs.queued else runs.workers_out())
        elif self.lifecycle is Lifecycle.PAUSED:
            self.rebalance.release_unstarted()  # (a share group: for other members, each turn)
        self.commits.tick(now, self._parts.drained)
        outputs = self.delivery.outputs
        if outputs is not None and outputs.backlog:
            outputs.pump()
        if self.delivery.gate is not None:
            self.rebalance.advance_transaction(now)
        self._watch(now)
        if ledger.letters_due:
            self._write_due_letters()
        return self._close is not None and self._close_step(now)

    def _assert_owner(self) -> None:
        owner = self._thread.ident
        if owner is not None and owner != threading.get_ident():
            raise RuntimeError(
                f"the controller's state belongs to {self._thread.name}; "
                f"{threading.current_thread().name} must post events instead"
            )

    def _wake_at(self, now: float) -> float:
        """When the loop must take a turn even if no event comes: the earliest of what each
        part is waiting for (in the manner of trio's deadline loop)."""
        deadline = self.commits.wake_at(now, self._parts.drained())
        busy = bool(self.ledger.in_flight or self.runs.runs)
        for wake in (
            self.ledger.retries.next_due(),
            self.watches.wake_at(),
            self.dispatch.wake_at(now, busy),
            self.delivery.wake_at(now),
            now + 0.05 if self._close is not None else None,
        ):
            if wake is not None and wake < deadline:
                deadline = wake
        return deadline

    def _handle(self, event: ControllerEvent) -> None:
        if isinstance(event, RunDone):
            self.runs.on_run_done(event)
            return
        if isinstance(event, WorkDoneMany):
            self.dispatch.on_chunk_done(event)
            return
        if isinstance(event, WorkDone):
            self.dispatch.call_done(event)
            return
        if isinstance(event, OutputsDelivered):
            failed = self.delivery.on_delivered(event)
            if failed:
                now = self._clock.monotonic()
                for outcome in failed:
                    self.runs.outputs_failed(outcome, now)
            return
        if isinstance(event, DeadlineExtended):
            self.dispatch.deadlines.extend(event.batch, event.until)
            return
        # Anything else may change the assignment, the lifecycle or the backlog.
        self.watches.pauses.stale = True
        if isinstance(event, RecordsPolled):
            if self.runs.on:
                self.runs.on_records(event)
            else:
                self.ledger.on_records(event)
        elif isinstance(event, CommitResult):
            self.commits.on_result(event.answers)
        elif isinstance(event, PartitionsAssigned):
            self.rebalance.assigned(event)
        elif isinstance(event, PartitionsRevoked):
            self.rebalance.revoked(event)
        elif isinstance(event, PartitionsLost):
            self.rebalance.lost(event)
        elif isinstance(event, PositionsReached):
            self.ledger.positions(event)
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

    def _write_due_letters(self) -> None:
        """Write the dead letters the ledger decided on."""
        for item, error, reason in self.ledger.take_letters_due():
            self.delivery.dead_letter(item, error, reason)

    # -- watches --------------------------------------------------------------------------------

    def _watch(self, now: float) -> None:
        """Carry out what the watches found: pauses, a stall report, stalled partitions."""
        lifecycle = self.lifecycle
        running = lifecycle is Lifecycle.RUNNING
        watching = running or lifecycle is Lifecycle.DRAINING
        seen = self.watches.look(now, running=running, watching=watching)
        if seen.paused is not None:
            self._poller.send(seen.paused)
        release = self.ledger.credit_due()
        if release:
            self._poller.send(Release(release))
        if seen.report is not None:
            ledger = self.ledger
            ledger.counters.stalls += 1
            log.warning("no progress: %s; %r %r", seen.report, ledger.shards, ledger.commits)
            self._hooks.on_stall(seen.report)
        for stall in seen.stalls:
            self.overdue.partition_stalled(stall, now)

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
                self.watches.resumed(self._clock.monotonic())
            event.reply.set_result(self.lifecycle)
        elif action == "close":
            timeout = self._options.shutdown_timeout if event.timeout is None else event.timeout
            deadline = self._clock.monotonic() + timeout
            if self._close is None:
                self._close = Closing(event.reply, deadline, event.drain)
                self.ledger.closing = True
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
        """Close without drain: records not started stay for the partitions' next owner."""
        self.lifecycle = Lifecycle.CLOSING
        self.rebalance.drop_unstarted()

    def _close_step(self, now: float) -> bool:
        """Carry out the close's next step; True when the controller may stop."""
        close = self._close
        assert close is not None
        ledger = self.ledger
        gate = self.delivery.gate
        # Records whose outputs are on their way (or held back) are in flight too.
        in_flight = (
            ledger.in_flight.records + self.delivery.pending.records + self.runs.runs.records_out
        )
        step = close.step(
            now,
            time.monotonic(),
            work_left=bool(ledger.shards.waiting or ledger.retries or in_flight),
            in_flight=bool(in_flight),
            commit_pending=ledger.commits.has_pending() or (gate is not None and not gate.open),
            resend_final_commit=lambda: self.commits.send_final(now),
            # Never a blocking join: the poller may be inside a revoke callback waiting for
            # this thread's answer, which the loop keeps giving until the poller has stopped.
            poller_stopped=lambda: self._poller.join(0.0),
        )
        if not close.drain and self.lifecycle is Lifecycle.DRAINING:
            self.lifecycle = Lifecycle.CLOSING
        if step is Step.STOP_RUNNER:
            if in_flight or ledger.shards.waiting or ledger.retries:
                log.warning(
                    "closing with %d records in flight, %d waiting and %d waiting for a retry: "
                    "they are not committed and will be processed again",
                    in_flight,
                    ledger.shards.waiting,
                    len(ledger.retries),
                )
            # From here on no handler call starts, whatever is still queued in the runner.
            self._runner.stop(timeout=0.0 if in_flight else 1.0)
            self.commits.send_final(now)
        elif step is Step.STOP_POLLER:
            self._poller.send(StopPoller())
        return step is Step.DONE

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

    def health(self) -> HealthReport:
        """The progress report of ``pc.health()`` (on the controller thread)."""
        return views.health(
            self.lifecycle,
            ledger=self.ledger,
            dispatch=self.dispatch,
            runs=self.runs,
            poller=self._poller.statistics(),
            options=self._options,
            failure=self._failure,
            now=self._clock.monotonic(),
        )

    def statistics(self) -> Statistics:
        return views.statistics(
            self.lifecycle,
            ledger=self.ledger,
            delivery=self.delivery,
            dispatch=self.dispatch,
            runs=self.runs,
            watches=self.watches,
            poller=self._poller.statistics(),
        )

    def __repr__(self) -> str:
        ledger = self.ledger
        return (
            f"<Controller {self.lifecycle.name} partitions={len(ledger.partitions)} "
            f"waiting={ledger.shards.waiting} "
            f"in_flight={ledger.in_flight.records + self.runs.runs.records_out} "
            f"retries={len(ledger.retries)}>"
        )
