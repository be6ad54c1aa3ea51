"""The controller state machine with ``on_stall=DEAD_LETTER``: a partition whose lowest
unfinished record holds it up for ``stall_threshold`` dead-letters that record (abandoning its
call, whose late result must then change nothing), at any point among polls, failures,
retries, revokes, runs and chains. The base machine's invariants hold throughout: nothing
committed past an unfinished record, one live call per lane, the credit bound."""

from __future__ import annotations

from hypothesis import settings
from test_controller_state_machine import ControllerMachine

from parallel_consumer.options import ProcessingOrder, StallPolicy


class StallPolicyMachine(ControllerMachine):
    stall_threshold = 1.5
    on_stall = StallPolicy.DEAD_LETTER

    def overrun(self, batch: int) -> bool:
        """A call the stall policy abandoned counts as past its deadline (its record went on
        to the dead-letter topic without it)."""
        return batch in self.controller.dispatch.deadlines._overruns


class KeyStallPolicy(StallPolicyMachine):
    ordering = ProcessingOrder.KEY


class PartitionStallPolicy(StallPolicyMachine):
    ordering = ProcessingOrder.PARTITION


class UnorderedStallPolicy(StallPolicyMachine):
    ordering = ProcessingOrder.UNORDERED


class KeyStallPolicyWithRuns(StallPolicyMachine):
    ordering = ProcessingOrder.KEY
    batch_size = 1


class KeyStallPolicyWithChains(StallPolicyMachine):
    ordering = ProcessingOrder.KEY
    batch_size = 1
    chains = True


class KeyStallPolicyProducing(StallPolicyMachine):
    ordering = ProcessingOrder.KEY
    batch_size = 1
    produce = True


class KeyStallPolicyWithDeadlines(StallPolicyMachine):
    ordering = ProcessingOrder.KEY
    processing_timeout = 1.0


_settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestKeyOrderStallPolicy = _settings(KeyStallPolicy).TestCase
TestPartitionOrderStallPolicy = _settings(PartitionStallPolicy).TestCase
TestUnorderedStallPolicy = _settings(UnorderedStallPolicy).TestCase
TestKeyOrderWithRunsStallPolicy = _settings(KeyStallPolicyWithRuns).TestCase
TestKeyOrderWithChainsStallPolicy = _settings(KeyStallPolicyWithChains).TestCase
TestKeyOrderProducingStallPolicy = _settings(KeyStallPolicyProducing).TestCase
TestKeyOrderWithDeadlinesStallPolicy = _settings(KeyStallPolicyWithDeadlines).TestCase


def test_the_stall_policy_never_fails_a_record_of_an_earlier_assignment() -> None:
    """A partition is revoked and assigned straight back while a call of its first assignment
    still runs (a chain's current call, here). Records of the new assignment wait behind that
    stale call's lane, the partition stalls, and on_stall=DEAD_LETTER looks for the record at
    its lowest unfinished offset: it must find the new assignment's record (waiting in its
    lane: left alone), not the stale call's record of the same offset, which is no longer ours
    (abandoning it counts a failure, calls on_failure and tries a dead letter for a record of
    an assignment that is over)."""
    machine = KeyStallPolicyWithChains()
    machine.assign(("t", 0))
    machine.poll(("t", 0), [b"a", b"a"])
    machine.bounce(("t", 0))
    machine.poll(("t", 0), [b"a"])
    machine.calls_turn("slow")
    machine.advance(2.0)
    statistics = machine.controller.statistics()
    assert statistics.records_failed == 0, statistics
    assert statistics.deadline_exceeded == 0, statistics
