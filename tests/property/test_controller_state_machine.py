"""A hypothesis state machine over the real controller, stepped by hand (no threads).

Rules: poll, complete ok, fail, revoke, assign, commit, advance the clock. The model keeps the
log, what succeeded (non-stale results only) and what the group committed; the invariants are
ARCHITECTURE.md's: never commit above an incomplete record, never lose one, at most one record
in flight per key (KEY), and stale results never change state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Message
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from parallel_consumer._controller import Controller
from parallel_consumer._events import (
    Assignment,
    Commit,
    CommitResult,
    PartitionsAssigned,
    PartitionsRevoked,
    PollerCommand,
    RecordsPolled,
    WorkDone,
)
from parallel_consumer.commit import ConsumerCommitter
from parallel_consumer.context import PollContext
from parallel_consumer.offsets import decode_offset_map
from parallel_consumer.options import Options, ProcessingOrder
from parallel_consumer.testing.clock import FakeClock
from parallel_consumer.work.item import WorkItem

TPS = [("t", 0), ("t", 1)]
KEYS = [b"a", b"b", b"c", None]


class FakeRunner:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.backlog = 1
        self.calls: list[Sequence[WorkItem]] = []

    def start(self, handler: Callable[[PollContext], object], done: Callable[..., None]) -> None:
        pass

    def submit(self, items: Sequence[WorkItem], context: PollContext) -> None:
        self.calls.append(items)

    def stop(self, timeout: float) -> bool:
        return True


class FakePoller:
    def __init__(self) -> None:
        self.commands: list[PollerCommand] = []

    def send(self, command: PollerCommand) -> None:
        self.commands.append(command)

    def join(self, timeout: float) -> bool:
        return True


class ControllerMachine(RuleBasedStateMachine):
    ordering = ProcessingOrder.KEY

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.options = Options(
            ordering=self.ordering,
            max_concurrency=3,
            batch_size=2,
            commit_interval=1.0,
            retry_delay=0.5,
            max_metadata_bytes=64,  # small, so the "blocked" path is exercised too
        )
        self.runner = FakeRunner(self.options.max_concurrency)
        self.poller = FakePoller()
        self.controller = Controller(
            self.options,
            runner=self.runner,
            poller=self.poller,
            committer=ConsumerCommitter(self.poller, self.options.commit_mode),
            clock=self.clock,
        )
        self.controller.start(lambda ctx: None, thread=False)
        self.log: dict[tuple[str, int], list[bytes | None]] = {tp: [] for tp in TPS}
        self.position: dict[tuple[str, int], int] = {}
        self.epoch: dict[tuple[str, int], int] = {}
        self.next_epoch = 0
        self.done: dict[tuple[str, int], set[int]] = {tp: set() for tp in TPS}
        self.committed: dict[tuple[str, int], tuple[int, str]] = {}

    # -- helpers --

    def step(self) -> None:
        self.controller.run_once(block=False)
        self.apply_commands()

    def apply_commands(self) -> None:
        commands, self.poller.commands = self.poller.commands, []
        for command in commands:
            if isinstance(command, Commit):
                results = []
                for tp, offset, metadata in command.offsets:
                    self.store(tp, offset, metadata)
                    results.append((tp, offset, metadata, None))
                self.controller.post(CommitResult(tuple(results)))

    def store(self, tp: tuple[str, int], offset: int, metadata: str) -> None:
        self.committed[tp] = (offset, metadata)

    # -- rules --

    @rule(tp=st.sampled_from(TPS), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6))
    def poll(self, tp: tuple[str, int], keys: list[bytes | None]) -> None:
        if tp not in self.epoch:
            return
        start = self.position[tp]
        log = self.log[tp]
        messages = []
        for i, key in enumerate(keys):
            offset = start + i
            if offset == len(log):
                log.append(key)
            messages.append(Message(topic=tp[0], partition=tp[1], offset=offset, key=log[offset]))
        self.position[tp] = start + len(keys)
        self.controller.post(RecordsPolled({tp: (self.epoch[tp], messages)}, len(messages)))
        self.step()

    @precondition(lambda self: self.runner.calls)
    @rule(index=st.integers(min_value=0), ok=st.booleans())
    def complete(self, index: int, ok: bool) -> None:
        items = self.runner.calls.pop(index % len(self.runner.calls))
        if ok:
            for item in items:
                if self.epoch.get(item.tp) == item.epoch:
                    self.done[item.tp].add(item.offset)
        error = None if ok else RuntimeError("handler failed")
        self.controller.post(WorkDone(items, error, self.clock.monotonic()))
        self.step()

    @rule(tp=st.sampled_from(TPS))
    def revoke(self, tp: tuple[str, int]) -> None:
        if tp not in self.epoch:
            return
        reply: Future[Any] = Future()
        self.controller.post(PartitionsRevoked((tp,), reply))
        self.step()
        for rtp, offset, metadata in reply.result(timeout=0):
            self.store(rtp, offset, metadata)
        del self.epoch[tp]
        del self.position[tp]

    @rule(tp=st.sampled_from(TPS))
    def assign(self, tp: tuple[str, int]) -> None:
        if tp in self.epoch:
            return
        self.next_epoch += 1
        self.epoch[tp] = self.next_epoch
        offset, metadata = self.committed.get(tp, (None, None))
        self.position[tp] = 0 if offset is None else offset
        self.controller.post(
            PartitionsAssigned((Assignment(tp, self.next_epoch, offset, metadata),))
        )
        self.step()

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 2.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.step()

    @rule()
    def finish_everything(self) -> None:
        """Complete every call successfully until nothing is left; then the commit of every
        assigned partition covers every polled record (nothing lost, nothing left unfinished):
        its offset is at least the read position and its map marks nothing below it unfinished.
        """
        for _ in range(200):
            if self.runner.calls:
                self.complete(0, True)
            else:
                self.clock.advance(1.0)
                self.step()
            stats = self.controller.statistics()
            if not self.runner.calls and stats.waiting == 0 and stats.retry_waiting == 0:
                break
        self.clock.advance(1.0)
        self.step()
        for tp in self.epoch:
            if self.position[tp] == 0:
                continue
            offset, metadata = self.committed[tp]
            assert offset >= self.position[tp], (tp, self.committed[tp], self.position[tp])
            unfinished = decode_offset_map(offset, metadata).incomplete if metadata else ()
            assert all(o >= self.position[tp] for o in unfinished), (tp, unfinished)

    # -- invariants --

    @invariant()
    def commits_never_pass_an_unfinished_record(self) -> None:
        for tp, (offset, metadata) in self.committed.items():
            done = self.done[tp]
            missing = [o for o in range(min(offset, len(self.log[tp]))) if o not in done]
            assert not missing, f"{tp} committed {offset} but {missing} never succeeded"
            if metadata:
                decoded = decode_offset_map(offset, metadata)
                for o in range(offset, decoded.highest_seen + 1):
                    if o not in decoded.incomplete:
                        assert o in done, f"{tp} map marks {o} finished but it never succeeded"

    @invariant()
    def at_most_one_live_record_in_flight_per_lane(self) -> None:
        lanes: dict[object, int] = {}
        for items in self.runner.calls:
            for item in items:
                if self.epoch.get(item.tp) != item.epoch:
                    continue  # stale: its partition was revoked; the result will be dropped
                lanes[item.shard_key] = lanes.get(item.shard_key, 0) + 1
        if self.ordering is not ProcessingOrder.UNORDERED:
            assert all(count == 1 for count in lanes.values()), lanes

    @invariant()
    def in_flight_stays_within_capacity(self) -> None:
        assert len(self.runner.calls) <= self.runner.capacity + self.runner.backlog


class PartitionMachine(ControllerMachine):
    ordering = ProcessingOrder.PARTITION


class UnorderedMachine(ControllerMachine):
    ordering = ProcessingOrder.UNORDERED


class KeyMachine(ControllerMachine):
    ordering = ProcessingOrder.KEY


_settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestKeyOrder = _settings(KeyMachine).TestCase
TestPartitionOrder = _settings(PartitionMachine).TestCase
TestUnordered = _settings(UnorderedMachine).TestCase
