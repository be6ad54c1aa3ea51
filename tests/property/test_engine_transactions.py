"""The controller state machine in the transactional mode (exactly-once): outputs, dead letters
and offsets commit in one transaction, or none of them does.

The model plays the poller's part of ``kafka/transactions.py``: a ``Transact`` commits the open
transaction with the offsets of partitions still held in that epoch; ``Transact(abort=True)``
aborts it, and then every partition kept starts again from its committed offset under a new
epoch (posted as assigned before the answer). A record counts as finished for the group only
once the transaction holding its outputs (or its dead letter) committed. A revoke waits, as the
poller does inside its callback, until the controller answers it; meanwhile the producer
acknowledges what was sent.

Invariant on top of the base machine's: the group's committed offset (and the offset map)
never marks finished a record whose outputs did not commit in a transaction.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule
from test_controller_state_machine import TPS, ControllerMachine
from test_engine_lost_and_close import LostAndCloseMachine

from parallel_consumer._events import (
    Assignment,
    PartitionsAssigned,
    PartitionsRevoked,
    Release,
    Transact,
)
from parallel_consumer.kafka.committers import Committer, TransactionalCommitter
from parallel_consumer.offsets import decode_offset_map
from parallel_consumer.options import ProcessingOrder
from parallel_consumer.work.commit_tracker import CommitAnswer


class TransactionDone(set[int]):
    """A partition's finished records as the machine sees them: ``add`` (outputs or dead
    letter acknowledged) puts a record in the open transaction; membership counts those too
    (the engine may run the lane's next record); :attr:`committed` holds those whose
    transaction committed."""

    def __init__(self) -> None:
        super().__init__()
        self.committed: set[int] = set()

    def commit(self) -> None:
        self.committed |= self

    def abort(self) -> None:
        self.clear()
        self.update(self.committed)


class TransactionalMachine(ControllerMachine):
    transactional = True
    produce = True
    batch_size = 1

    def __init__(self) -> None:
        super().__init__()
        self.done = {tp: TransactionDone() for tp in TPS}
        self.aborts = 0

    def committer(self) -> Committer:
        return TransactionalCommitter(self.poller)

    def run_poller_commands(self, *, only_releases: bool = False) -> None:
        kept = []
        for command in self.poller.commands:
            if isinstance(command, Release):
                self.poller.credit.give_back(command.count)
            elif isinstance(command, Transact) and not only_releases:
                self.transact(command)
            elif only_releases or not isinstance(command, Transact):
                kept.append(command)
        self.poller.commands = kept

    def transact(self, command: Transact) -> None:
        live = [c for c in command.offsets if self.epoch.get(c.tp) == c.epoch]
        dropped = [
            CommitAnswer(c, "no longer assigned")
            for c in command.offsets
            if self.epoch.get(c.tp) != c.epoch
        ]
        if command.abort:
            self.aborts += 1
            for done in self.done.values():
                assert isinstance(done, TransactionDone)
                done.abort()
            self.rewind()
            failed = [CommitAnswer(c, "transaction aborted") for c in live]
            command.reply.set_result((*dropped, *failed))
            return
        for commit in live:
            self.store(commit.tp, commit.offset, commit.metadata)
        for done in self.done.values():
            assert isinstance(done, TransactionDone)
            done.commit()
        command.reply.set_result((*dropped, *(CommitAnswer(c) for c in live)))

    def rewind(self) -> None:
        """After an abort: every partition held starts again from its committed offset."""
        if not self.epoch:
            return
        self.next_epoch += 1
        assignments = []
        for tp in list(self.epoch):
            self.epoch[tp] = self.next_epoch
            offset, metadata = self.committed.get(tp, (None, None))
            self.position[tp] = 0 if offset is None else offset
            self.start[tp] = self.position[tp]
            assignments.append(Assignment(tp, self.next_epoch, offset, metadata))
        self.controller.post(PartitionsAssigned(tuple(assignments)))

    @rule(tp=st.sampled_from(TPS))
    def revoke(self, tp: tuple[str, int]) -> None:
        """The poller waits in its revoke callback, running the controller's commands (the
        transaction that commits the partition's offsets), while the producer acknowledges
        what was sent."""
        if tp not in self.epoch:
            return
        reply: Future[Any] = Future()
        self.controller.post(PartitionsRevoked((tp,), reply))
        for _ in range(200):
            self.controller.run_once(block=False)
            self.run_poller_commands()
            if reply.done():
                break
            if self.outputs.sent:
                self.settle_dead_letter(0, True)
            elif self.outputs.produced:
                self.settle_outputs(0, set())
            else:
                self.clock.advance(0.1)
        assert reply.done(), f"the revoke of {tp} was never answered: {self.controller!r}"
        self.run_poller_commands()
        del self.epoch[tp]
        del self.position[tp]
        self.step()

    @invariant()
    def commits_never_pass_an_unfinished_record(self) -> None:
        for tp, (offset, metadata) in self.committed.items():
            done = self.done[tp]
            assert isinstance(done, TransactionDone)
            committed = done.committed
            missing = [o for o in range(min(offset, len(self.log[tp]))) if o not in committed]
            assert not missing, f"{tp} committed {offset} but {missing} never committed outputs"
            if metadata:
                decoded = decode_offset_map(offset, metadata)
                for o in range(offset, decoded.highest_seen + 1):
                    if o not in decoded.incomplete:
                        assert o in committed, f"{tp} map marks {o} finished, outputs uncommitted"


class KeyTransactional(TransactionalMachine):
    ordering = ProcessingOrder.KEY


class PartitionTransactional(TransactionalMachine):
    ordering = ProcessingOrder.PARTITION


class UnorderedTransactional(TransactionalMachine):
    ordering = ProcessingOrder.UNORDERED


class KeyTransactionalCalls(TransactionalMachine):
    """Calls of two records (no runs)."""

    ordering = ProcessingOrder.KEY
    batch_size = 2


class KeyTransactionalLostAndClose(LostAndCloseMachine, TransactionalMachine):
    """Partitions lost (the open transaction aborts if it holds outputs) and a close at any
    point (its final transaction commits what finished)."""

    ordering = ProcessingOrder.KEY


class UnorderedTransactionalLostAndClose(LostAndCloseMachine, TransactionalMachine):
    ordering = ProcessingOrder.UNORDERED


_settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestKeyOrderTransactional = _settings(KeyTransactional).TestCase
TestPartitionOrderTransactional = _settings(PartitionTransactional).TestCase
TestUnorderedTransactional = _settings(UnorderedTransactional).TestCase
TestKeyOrderTransactionalCalls = _settings(KeyTransactionalCalls).TestCase
TestKeyOrderTransactionalLostAndClose = _settings(KeyTransactionalLostAndClose).TestCase
TestUnorderedTransactionalLostAndClose = _settings(UnorderedTransactionalLostAndClose).TestCase
