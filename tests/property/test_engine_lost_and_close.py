"""The controller state machine (test_controller_state_machine.py) with two more ways for a
partition or the engine to end: a partition lost without a final commit (``PartitionsLost``),
and a close (with or without drain) in the middle of anything, after which the machine lets
every call still running end and checks what the group committed.

Invariants on top of the base machine's: the poller never holds more than
``max_buffered_records``; after a close, every record the group's commit marks finished did
succeed (or was dead-lettered), every record polled is either committed or left for the next
owner (never counted finished without having run), and the close answers its caller.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule
from test_controller_state_machine import KEYS, ControllerMachine

from parallel_consumer._events import Control, PartitionsLost, WorkDone
from parallel_consumer.options import ProcessingOrder


class LostAndCloseMachine(ControllerMachine):
    closed = False

    @precondition(lambda self: not self.closed)
    @rule(tp=st.sampled_from([("t", 0), ("t", 1)]))
    def lose(self, tp: tuple[str, int]) -> None:
        """The partition is lost (session timeout, fencing): no final commit; its calls may
        still run and report late."""
        if tp not in self.epoch:
            return
        self.controller.post(PartitionsLost((tp,)))
        self.step()
        # Commits queued for it before are refused by the broker from now on.
        del self.epoch[tp]
        del self.position[tp]
        self.step()

    @precondition(lambda self: not self.closed)
    @rule(
        drain=st.booleans(),
        outcome=st.sampled_from(["ok", "fail"]),
        now=st.integers(min_value=0, max_value=4),
    )
    def close(self, drain: bool, outcome: str, now: int) -> None:
        """close(drain=...) while calls run: the machine ends every call still running with
        ``outcome`` and settles outputs and dead letters, as the runner and producer would,
        until the close answers. (Only one draw in five closes: the machine runs longer.)"""
        if now:
            return
        reply: Future[Any] = Future()
        self.controller.post(Control("close", reply, drain, 5.0))
        self.step()
        for _ in range(400):
            if self.stopped:
                break
            if self.runner.run_states:
                self.run_call(0, "ok")
            elif getattr(self.runner, "chains", None):
                self.chain_step(0, outcome, False)
            elif self.runner.calls:
                batch, records = self.runner.calls.pop(0)
                error = self.call_ended(batch, records, outcome)
                value = self.value_of(records) if error is None else None
                now = self.clock.monotonic()
                self.controller.post(WorkDone(batch, (error,) * len(records), value, now))
                self.step()
            elif self.outputs.sent:
                self.settle_dead_letter(0, True)
            elif self.outputs.produced:
                self.settle_outputs(0, set())
            else:
                self.clock.advance(0.5)
                self.step()
                self.run_poller_commands()
                self.step()
        # (stepped by hand, the controller says it stopped; its thread would answer the reply)
        assert self.stopped, f"close did not finish: {self.controller!r}"
        self.run_poller_commands()
        self.closed = True

    stopped = False

    def step(self) -> None:
        if self.closed or self.stopped:
            return
        self.stopped = self.controller.run_once(block=False)
        self.run_poller_commands(only_releases=True)

    @precondition(lambda self: not self.closed)
    @rule(tp=st.sampled_from([("t", 0), ("t", 1)]))
    def revoke(self, tp: tuple[str, int]) -> None:
        super().revoke(tp)

    @precondition(lambda self: not self.closed)
    @rule(tp=st.sampled_from([("t", 0), ("t", 1)]))
    def assign(self, tp: tuple[str, int]) -> None:
        super().assign(tp)

    @precondition(lambda self: not self.closed)
    @rule(
        tp=st.sampled_from([("t", 0), ("t", 1)]),
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6),
    )
    def poll(self, tp: tuple[str, int], keys: list[bytes | None]) -> None:
        super().poll(tp, keys)

    @precondition(lambda self: self.bundled and not self.closed)
    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=6, max_size=6))
    def poll_burst(self, keys: list[bytes | None]) -> None:
        # (a closed consumer's poller has stopped: nothing is fetched any more)
        super().poll_burst(keys)

    @precondition(lambda self: not self.closed)
    @rule()
    def finish_everything(self) -> None:
        super().finish_everything()

    @invariant()
    def poller_holds_at_most_max_buffered_records(self) -> None:
        assert self.poller.credit.held <= self.options.max_buffered_records


class KeyLostAndClose(LostAndCloseMachine):
    ordering = ProcessingOrder.KEY


class PartitionLostAndClose(LostAndCloseMachine):
    ordering = ProcessingOrder.PARTITION


class UnorderedLostAndClose(LostAndCloseMachine):
    ordering = ProcessingOrder.UNORDERED


class KeyLostAndCloseWithRuns(LostAndCloseMachine):
    ordering = ProcessingOrder.KEY
    batch_size = 1


class KeyLostAndCloseWithChains(LostAndCloseMachine):
    ordering = ProcessingOrder.KEY
    batch_size = 1
    chains = True


class KeyLostAndCloseProducing(LostAndCloseMachine):
    ordering = ProcessingOrder.KEY
    batch_size = 1
    produce = True


class UnorderedLostAndCloseWithBundles(LostAndCloseMachine):
    ordering = ProcessingOrder.UNORDERED
    batch_size = 1
    bundled = True
    runner_runs = False


class KeyLostAndCloseWithDeadlines(LostAndCloseMachine):
    ordering = ProcessingOrder.KEY
    processing_timeout = 1.5


_settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestKeyOrderLostAndClose = _settings(KeyLostAndClose).TestCase
TestPartitionOrderLostAndClose = _settings(PartitionLostAndClose).TestCase
TestUnorderedLostAndClose = _settings(UnorderedLostAndClose).TestCase
TestKeyOrderWithRunsLostAndClose = _settings(KeyLostAndCloseWithRuns).TestCase
TestKeyOrderWithChainsLostAndClose = _settings(KeyLostAndCloseWithChains).TestCase
TestKeyOrderProducingLostAndClose = _settings(KeyLostAndCloseProducing).TestCase
TestUnorderedWithBundlesLostAndClose = _settings(UnorderedLostAndCloseWithBundles).TestCase
TestKeyOrderWithDeadlinesLostAndClose = _settings(KeyLostAndCloseWithDeadlines).TestCase


def test_a_retry_due_after_a_close_without_drain_returns_its_credit() -> None:
    """A call fails while a close without drain waits for it: its record waits for a retry,
    but the close has already dropped its lane. When the retry comes due the record must leave
    the engine with its credit returned (it is not committed, the next owner runs it), not
    vanish with the poller still counting it as held."""
    machine = KeyLostAndClose()
    machine.assign(("t", 0))
    machine.poll(("t", 0), [b"a"])
    machine.close(drain=False, outcome="fail", now=0)
    machine.credit_matches_what_the_engine_holds()
