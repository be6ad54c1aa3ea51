"""Delivery: outputs of ``poll_and_produce`` calls and runs, dead letters, and the transaction
gate, from the moment a call returns (or the ledger gives up on a record) to the broker's
acknowledgement. Owned by the controller thread.

A call's outputs wait here (:class:`~parallel_consumer.work.outputs.PendingOutputs`) until
the broker acknowledged them; its records then settle in the ledger. A dead letter travels the
same way, as a one-record write marked ``Pending.letter`` (:class:`DeadLetters` builds it and
tracks it until written). In the transactional mode the gate holds outputs back while a
transaction commits; :meth:`Delivery.transaction_step` says when to commit or abort and which
revokes may then finish, for the controller to carry out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from parallel_consumer._clock import Clock
from parallel_consumer._events import OutputsDelivered, PartitionsRevoked
from parallel_consumer.context import PollContext, RecordContext
from parallel_consumer.engine.ledger import Ledger
from parallel_consumer.engine.letters import DeadLetters, Letter
from parallel_consumer.errors import AccessDenied, RetriesExhausted
from parallel_consumer.hooks import Hooks
from parallel_consumer.kafka.producer import Outputs
from parallel_consumer.options import ProcessingOrder
from parallel_consumer.produce import ProduceError, ProduceResult, ProducerRecord, outputs_of
from parallel_consumer.work.commit_tracker import OffsetCommit
from parallel_consumer.work.inflight import Batch
from parallel_consumer.work.item import TopicPartition, WorkItem
from parallel_consumer.work.lanes import key_lanes
from parallel_consumer.work.outputs import Pending, PendingOutputs, RunOutputs, TransactionGate
from parallel_consumer.work.partitions import PartitionState
from parallel_consumer.work.runs import Run

__all__ = ["Delivery", "RunOutputsFailed", "TransactionStep"]

log = logging.getLogger("parallel_consumer")

#: A revoke waiting for the transaction that commits its partitions, with the epoch of each
#: partition when it came.
WaitingRevoke = tuple[PartitionsRevoked, dict[TopicPartition, int]]
#: What the producer reports per output of a call: (partition, offset), an error, or None.
Delivered = tuple[tuple[int, int] | BaseException | None, ...]


@dataclass(frozen=True, slots=True)
class RunOutputsFailed:
    """Outputs of a run's records failed: the records whose outputs were all acknowledged are
    settled already; ``failures`` (index in ``pending.messages`` -> error) run again, and the
    partition's records still to run go to the lanes (the runs part carries it out)."""

    pending: RunOutputs
    state: PartitionState
    failures: dict[int, BaseException]


@dataclass(slots=True)
class TransactionStep:
    """What the controller does for the transaction now: abort it, or commit ``commits``
    (None: nothing to commit), then finish ``revokes``."""

    abort: bool = False
    commits: list[OffsetCommit] | None = None
    final: bool = False
    revokes: list[WaitingRevoke] = field(default_factory=list)


class Delivery:
    """Outputs and dead letters on their way, and the transaction gate. See the module doc."""

    def __init__(self, ledger: Ledger, clock: Clock, ordering: ProcessingOrder, hooks: Hooks):
        self._ledger = ledger
        self._clock = clock
        self._ordering = ordering
        self._hooks = hooks
        self.outputs: Outputs | None = None
        #: The handler's return values are outputs (poll_and_produce).
        self.produces = False
        self.on_produced: Callable[[ProduceResult], object] | None = None
        self.pending = PendingOutputs()
        #: The transactional mode's gate (None in the consumer commit modes).
        self.gate: TransactionGate | None = None
        #: Dead letters being written or waiting to be written again (None: dead-lettering off).
        self.letters: DeadLetters | None = None
        #: Revokes waiting for the transaction that commits their partitions (transactional).
        self.revokes: list[WaitingRevoke] = []

    def configure(
        self,
        outputs: Outputs | None,
        *,
        produces: bool,
        on_produced: Callable[[ProduceResult], object] | None,
        letters: DeadLetters | None,
    ) -> None:
        self.outputs = outputs
        self.produces = outputs is not None and produces
        self.on_produced = on_produced
        self.letters = letters
        if outputs is not None and outputs.transactional:
            self.gate = TransactionGate()
            self._ledger.keep_history = True

    def wake_at(self, now: float) -> float | None:
        """Outputs waiting for room in the producer are pumped again soon."""
        if self.outputs is not None and self.outputs.backlog:
            return now + 0.005
        return None

    def in_transit(self) -> bool:
        """Outputs or dead letters are on their way, held back, or waiting to be written."""
        return bool(self.pending) or (self.letters is not None and len(self.letters) > 0)

    # -- outputs of calls -----------------------------------------------------------------------

    def offer(
        self, batch: Batch, errors: Sequence[BaseException | None], value: object, partial: bool
    ) -> Sequence[BaseException | None] | None:
        """A call of a ``poll_and_produce`` handler returned ``value``: None if its outputs
        are on their way now (the records settle once they are acknowledged), else the
        outcomes to settle its records with."""
        try:
            outputs = outputs_of(value)
        except TypeError as exc:
            return (exc,) * len(batch.items)
        if not outputs:
            return errors
        pending = Pending(batch, outputs, errors if partial else None)
        if self.gate is None or self.gate.open:
            self._send(pending)
        else:
            self.pending.queue(pending)
        return None

    def _send(self, pending: Pending) -> None:
        current = self._ledger.current
        for item in pending.batch.items:
            if current(item.tp, item.epoch) is None:
                # Part of the call's input is no longer ours: its outputs cannot be told apart,
                # so none is sent; the records still ours run again.
                error = ProduceError("not produced: the call's partition was revoked meanwhile")
                errors = (error,) * len(pending.batch.items)
                self._settle(pending, errors, self._clock.monotonic())
                return
        assert self.outputs is not None
        self.pending.sending(pending)
        if self.gate is not None:
            self.gate.outputs += len(pending.outputs)
        if not pending.letter:  # (dead letters are counted apart)
            self._ledger.counters.outputs_sent += len(pending.outputs)
        self.outputs.send(pending.batch.id, pending.outputs)

    def _settle(self, pending: Pending, errors: Sequence[BaseException | None], now: float) -> None:
        if pending.letter:
            self._letter_settled(pending.batch, errors[0], now)
        else:
            self._ledger.settle(pending.batch, errors, now)

    def on_delivered(self, event: OutputsDelivered) -> list[RunOutputsFailed]:
        """The producer's reports; returns the runs whose outputs failed (for the runs part)."""
        now = self._clock.monotonic()
        for batch_id, results in event.calls:
            self._delivered(batch_id, results, now)
        failed = []
        for run_id, failures in event.runs:
            outcome = self._run_delivered(run_id, failures)
            if outcome is not None:
                failed.append(outcome)
        return failed

    def _delivered(self, batch_id: int, results: Delivered, now: float) -> None:
        pending = self.pending.delivered(batch_id)
        if pending is None:  # pragma: no cover - every call is reported once
            return
        batch = pending.batch
        for record, result in zip(pending.outputs, results, strict=False):
            self._note_access(record.topic, result)
        failures = [r for r in results if isinstance(r, BaseException)]
        if pending.letter:
            if failures and self.gate is not None:
                self.gate.abort_soon()  # the transaction must not commit without it
            self._letter_settled(batch, failures[0] if failures else None, now)
            return
        counters = self._ledger.counters
        if failures:
            failure = failures[0]
            counters.outputs_failed += len(failures)
            counters.outputs_acknowledged += len(results) - len(failures)
            if self.gate is not None:
                # The transaction may hold the call's other outputs, and its input is retried:
                # it must not commit. Abort it (once the outputs sent so far are settled).
                self.gate.abort_soon()
            self._ledger.settle(batch, (failure,) * len(batch.items), now)
            return
        counters.outputs_acknowledged += len(pending.outputs)
        if self.on_produced is not None:
            self._report_produced(pending, results)
        self._ledger.settle(batch, pending.errors or (None,) * len(batch.items), now)

    def _note_access(self, topic: str, result: object) -> None:
        """Keep the ledger's refusals (a topic refused until one write there succeeds) up to
        date with one output's report; health() shows them."""
        refusals = self._ledger.refusals
        if isinstance(result, AccessDenied):
            if refusals.refused(("write", result.topic or topic), str(result)):
                log.error("Kafka refused access: %s", result)
        elif isinstance(result, tuple):
            refusals.allowed(("write", topic))

    def _report_produced(self, pending: Pending, results: Delivered) -> None:
        assert self.on_produced is not None
        context = PollContext(
            [
                RecordContext(i.message, i.attempts, i.last_failure, i.last_failure_at)
                for i in pending.batch.items
            ]
        )
        for record, result in zip(pending.outputs, results, strict=True):
            assert isinstance(result, tuple)
            try:
                self.on_produced(ProduceResult(context, record, result[0], result[1]))
            except Exception:
                log.error(
                    "on_produced(%r) for the output of %r raised; ignored",
                    record,
                    context,
                    exc_info=True,
                )

    # -- outputs of runs ------------------------------------------------------------------------

    def run_outputs(self, run: Run, state: PartitionState, first: int, upto: int) -> None:
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
            self._ledger.settle_messages(state, messages)
            return
        held: list[object] | None = None
        if self._ordering is ProcessingOrder.KEY:
            held = key_lanes(run.tp, messages)
            self._ledger.shards.hold(held)
        pending = RunOutputs(run.id, run.tp, run.epoch, messages, outputs, owners, held)
        if self.gate is None or self.gate.open:
            self._send_run(pending)
        else:
            self.pending.queue_run(pending)

    def _send_run(self, pending: RunOutputs) -> None:
        if self._ledger.current(pending.tp, pending.epoch) is None:
            # Revoked meanwhile (held back by the gate): none is sent, they run again.
            self._run_outputs_gone(pending)
            return
        assert self.outputs is not None
        self.pending.sending_run(pending)
        count = len(pending.outputs)
        if self.gate is not None:
            self.gate.outputs += count
        self._ledger.counters.outputs_sent += count
        self.outputs.send_run(pending.id, pending.outputs, pending.owners)

    def _run_outputs_gone(self, pending: RunOutputs) -> None:
        """The records of ``pending`` are no longer ours (their partition was revoked)."""
        self._ledger.stale(len(pending.messages))
        if pending.held is not None:
            self._ledger.shards.release(pending.held)

    def _run_delivered(
        self, run_id: int, failures: dict[int, BaseException] | None
    ) -> RunOutputsFailed | None:
        pending = self.pending.run_delivered(run_id)
        if pending is None:  # pragma: no cover - every run is reported once
            return None
        counters = self._ledger.counters
        if failures is None:
            counters.outputs_acknowledged += len(pending.outputs)
            for record in pending.outputs:
                self._ledger.refusals.allowed(("write", record.topic))
        else:
            for error in failures.values():
                self._note_access("?", error)
            failed = sum(1 for owner in pending.owners if owner in failures)
            counters.outputs_failed += failed
            counters.outputs_acknowledged += len(pending.outputs) - failed
            if self.gate is not None:
                # The transaction holds the run's other outputs, and these records run again:
                # it must not commit (see _delivered).
                self.gate.abort_soon()
        state = self._ledger.current(pending.tp, pending.epoch)
        if state is None:
            self._run_outputs_gone(pending)
            return None
        if failures is None:
            self._ledger.settle_messages(state, pending.messages)
            if pending.held is not None:
                self._ledger.shards.release(pending.held)
            return None
        return RunOutputsFailed(pending, state, failures)

    # -- dead letters ---------------------------------------------------------------------------

    def dead_letter(self, item: WorkItem, error: BaseException | None, reason: str) -> None:
        """Write ``item`` to its dead-letter topic now; its offset commits once the broker
        acknowledged the dead letter (in the transactional mode: in the transaction that
        commits the offset). The seam for policies that give up on a record (``decide``, and
        ``on_stall=DEAD_LETTER``).

        Contract: ``item`` belongs to the current assignment and is not in the runner: it has
        just failed, or it waits for its retry (it is taken out of the retry queue here). Its
        lane stays busy until the letter is written (KEY/PARTITION order holds in the
        dead-letter topic too). ``reason`` is a ``dead_letter.Reason`` value. With
        dead-lettering off this raises :class:`RetriesExhausted` (the consumer stops). A write
        that fails leaves the record uncommitted and is tried again (``dead_letter_failures``).
        A record whose dead letter is already on its way is left alone (no second write).
        """
        letters = self.letters
        if letters is None or self.outputs is None:
            raise RetriesExhausted(
                f"{item.tp[0]}[{item.tp[1]}]@{item.offset} is to be dead-lettered ({reason}) "
                "but dead-lettering is off; set Options.dead_letter_topic"
            ) from error
        if letters.sending_for(item):
            return
        self._ledger.retries.remove(item)
        letters.take_waiting(item)  # a letter waiting to be written again is replaced
        self._send_letter(Letter(item, error, reason))

    def _send_letter(self, letter: Letter) -> None:
        assert self.letters is not None
        ledger = self._ledger
        batch_id = ledger.in_flight.new_id()
        batch, record = self.letters.start(letter, batch_id, self._clock.monotonic())
        pending = Pending(batch, [record], letter=True)
        if self.gate is None or self.gate.open:
            self._send(pending)
        else:
            self.pending.queue(pending)

    def _letter_settled(self, batch: Batch, error: BaseException | None, now: float) -> None:
        assert self.letters is not None
        ledger = self._ledger
        letter = self.letters.settled(batch.id)
        item = batch.items[0]
        state = ledger.current(item.tp, item.epoch)
        if letter is None or state is None:
            # Revoked meanwhile: nothing commits for it here; its next owner runs it again
            # and may write a second dead letter (at-least-once).
            ledger.stale_item(item)
            return
        if error is None:
            ledger.counters.dead_lettered += 1
            self.letters.written(letter)
            ledger.finish(item, state)
            self._hooks.on_dead_letter(
                RecordContext(item.message, item.attempts, item.last_failure, item.last_failure_at),
                letter.error,
                letter.reason,
            )
        else:
            ledger.counters.dead_letter_failures += 1
            if ledger.acks is not None:
                # A share group: the record goes back to the broker, never lost; its next
                # delivery fails (or is given up on) again and writes the letter then.
                log.warning(
                    "dead letter of %s[%d]@%d failed, released: %r", *item.tp, item.offset, error
                )
                ledger.release(item)
                return
            ledger.retries.push(item, now + self.letters.failed(letter, error))

    def resend_letters(self, items: list[WorkItem]) -> list[WorkItem]:
        """Of records whose retry is due, write again the dead letters of those waiting for
        one; returns the others (they go back to their lanes)."""
        letters = self.letters
        if letters is None or not letters.waiting:
            return items
        rest = []
        for item in items:
            letter = letters.take_waiting(item)
            if letter is not None:
                self._send_letter(letter)
            else:
                rest.append(item)
        return rest

    # -- the transaction ------------------------------------------------------------------------

    def revoke_later(self, event: PartitionsRevoked) -> None:
        """Transactional mode: the revoked partitions' offsets must commit in the transaction
        that holds their outputs, so the revoke waits for that transaction's commit."""
        assert self.gate is not None
        ledger = self._ledger
        epochs = {tp: ledger.partitions[tp].epoch for tp in event.tps if tp in ledger.partitions}
        self.revokes.append((event, epochs))
        self.gate.wanted = True

    def lost(self) -> None:
        """Partitions were lost: their outputs may be in the open transaction; their offsets
        can no longer commit with them. Abort it: the partitions kept start again from their
        committed offsets."""
        if self.gate is not None and (self.gate.outputs or self.pending):
            self.gate.abort_soon()

    def want_commit(self) -> bool:
        """Transactional mode: a commit is due; True if there is anything to commit."""
        assert self.gate is not None
        if self.gate.outputs or self._ledger.dirty():
            self.gate.wanted = True
            return True
        return False

    def transaction_step(self, now: float) -> TransactionStep | None:
        """Transactional mode: commit (or abort) once wanted and every sent output is
        acknowledged; None while not."""
        gate = self.gate
        assert gate is not None
        if not gate.ready(self.pending.in_delivery):
            return None
        step = TransactionStep(revokes=self.revokes)
        self.revokes = []
        if gate.must_abort:
            # Abort instead of committing; the poller rewinds the partitions it keeps.
            gate.sent()
            step.abort = True
            return step
        step.final = bool(step.revokes)
        commits = self._ledger.commits.due(self._ledger.partitions.values(), now, final=step.final)
        if commits or gate.outputs:
            gate.sent()
            step.commits = commits
        else:
            gate.skipped()
        return step

    def send_held(self) -> None:
        """Let the outputs held back while a transaction committed go, once the gate is open."""
        gate = self.gate
        assert gate is not None
        if gate.open and self.pending.queued:
            for pending in self.pending.take_queued():
                self._send(pending)
        if gate.open and self.pending.queued_runs:
            for outputs in self.pending.take_queued_runs():
                self._send_run(outputs)
