"""A hypothesis state machine over the real controller, stepped by hand (no threads).

Rules: poll, complete ok, fail, revoke, assign, let the poller run its commands, advance the
clock, and acknowledge or fail a dead letter (a record's second failure, or a KeyError, which
is non-retryable, dead-letters it). With short calls the controller hands out runs
(work/runs.py; batched unless ``batch_size=1``): a worker starts and ends their calls one by
one, and the controller may detach a run in the middle (what its stuck check does). The
model keeps the log, what succeeded (non-stale results only) and what the group
committed; it plays the poller's part as the real one does: it takes credit for every record it
hands over and gives it back on ``Release``, runs commands (commits) only when the poller would,
in order, and drops commits of partitions it no longer holds in that epoch. The invariants are
ARCHITECTURE.md's: never commit above an incomplete record, never lose one, at most one record
in flight per key (KEY), stale results never change state, and the credit bound: the poller
never holds more than the limit, never a negative count, and exactly what the engine holds.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Message
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from parallel_consumer._events import (
    Assignment,
    Commit,
    OutputsDelivered,
    PartitionsAssigned,
    PartitionsRevoked,
    PollerCommand,
    RecordsPolled,
    Release,
    RunDone,
    WorkDone,
    WorkDoneMany,
)
from parallel_consumer.context import PollContext
from parallel_consumer.dead_letter import read_dead_letter
from parallel_consumer.engine.controller import Controller
from parallel_consumer.engine.letters import DeadLetters
from parallel_consumer.errors import ProduceError
from parallel_consumer.kafka.committers import Committer, ConsumerCommitter
from parallel_consumer.offsets import decode_offset_map
from parallel_consumer.options import Options, ProcessingOrder, StallPolicy
from parallel_consumer.produce import ProducerRecord
from parallel_consumer.runners.base import RunnerFeatures
from parallel_consumer.status import PollerStatistics
from parallel_consumer.testing.clock import FakeClock
from parallel_consumer.work import sizing
from parallel_consumer.work.commit_tracker import CommitAnswer
from parallel_consumer.work.credit import Credit
from parallel_consumer.work.runs import Run

TPS = [("t", 0), ("t", 1)]
KEYS = [b"a", b"b", b"c", None]


class FakeRunner:
    def __init__(self, capacity: int, epoch_of: Callable[[tuple[str, int]], int | None]) -> None:
        self.capacity = capacity
        self.backlog = 1
        self._epoch_of = epoch_of
        #: Calls not yet completed: (batch id, [(tp, offset, key, epoch at dispatch)]).
        self.calls: list[tuple[int, list[tuple[tuple[str, int], int, object, int | None]]]] = []
        self.chunks = 0
        #: Per call handed out in a chunk: its chunk (the calls of one chunk hold one worker
        #: until every one of them ended).
        self.chunk_of: dict[int, int] = {}
        #: Runs handed out and not reported: [run, the message whose call is in progress or
        #: None, the partition's epoch when it was handed out].
        self.run_states: list[list[Any]] = []
        self.runs_handed_out = 0

    #: The thread runner's answer (runs need no per-call hooks).
    runs = True

    @property
    def features(self) -> RunnerFeatures:
        return RunnerFeatures(chunks=self, runs=self)

    def take_finished(self, first: int) -> list[Any]:
        return []

    def submit_run(self, run: Run) -> None:
        self.runs_handed_out += 1
        self.run_states.append([run, None, self._epoch_of(run.tp)])

    def release_stuck(self, older_than: float, report: object) -> int:
        return 0

    def start(self, handler: Callable[[PollContext], object], done: Callable[..., None]) -> None:
        pass

    #: Called with each record handed out at the head of its lane (tp, offset, lane, epoch):
    #: the machine checks that the lane's records before it are finished.
    lane_head: Callable[[tuple[str, int], int, object, int | None], None] | None = None

    def submit(self, batch: int, context: PollContext, *, head: bool = True) -> None:
        records = []
        for r in context:
            tp = (r.topic, r.partition)
            lane = (*tp, r.key) if ControllerMachine.current_ordering is ProcessingOrder.KEY else tp
            records.append((tp, r.offset, lane, self._epoch_of(tp)))
            if head and self.lane_head is not None:
                self.lane_head(*records[-1])
        self.calls.append((batch, records))

    def submit_chunk(self, calls: list[tuple[int, PollContext]]) -> None:
        """A chunk (adaptive dispatch): its calls complete one by one or together."""
        self.chunks += 1
        for batch, context in calls:
            self.chunk_of[batch] = self.chunks
            self.submit(batch, context)

    def workers_held(self) -> int:
        """Workers (or backlog slots) the calls not ended hold, as the runner sees them: one
        per single call, one per chunk with a call not ended."""
        chunks = set()
        singles = 0
        for batch, _ in self.calls:
            chunk = self.chunk_of.get(batch)
            if chunk is None:
                singles += 1
            else:
                chunks.add(chunk)
        return singles + len(chunks)

    def cancel_queued(self) -> list[int]:
        return []

    def cancel(self, batch: int, error: BaseException | None = None) -> None:
        """Like a thread: the call runs on until the test completes it (its result is late)."""

    def stop(self, timeout: float) -> bool:
        return True


class FakeChainRunner(FakeRunner):
    """A runner that also takes chains (a lane's consecutive records, each started only once
    the one before it succeeded); the machine plays their worker (``chain_step``)."""

    def __init__(self, capacity: int, epoch_of: Callable[[tuple[str, int]], int | None]) -> None:
        super().__init__(capacity, epoch_of)
        #: Chains not reported yet: {"calls": calls not started (the first is the current
        #: one), "results": results not reported yet}.
        self.chains: list[dict[str, list[Any]]] = []
        self.chains_handed_out = 0

    @property
    def features(self) -> RunnerFeatures:
        return RunnerFeatures(chunks=self, runs=self, chains=self)

    def submit_chain(self, calls: list[tuple[int, PollContext]]) -> None:
        self.chains_handed_out += 1
        before = len(self.calls)
        for index, (batch, context) in enumerate(calls):
            # (only the first is a lane's head; the others follow it in the lane, in order)
            self.submit(batch, context, head=index == 0)
        offsets = [records[0][1] for _, records in self.calls[before:]]
        lanes = {records[0][2] for _, records in self.calls[before:]}
        assert offsets == sorted(offsets), f"a chain out of order: {offsets}"
        assert len(lanes) == 1, f"a chain of several lanes: {lanes}"
        chain_calls = self.calls[before:]
        del self.calls[before:]
        self.chains.append({"first": [calls[0][0]], "calls": chain_calls, "results": []})

    def take_back_chain(self, first: int) -> tuple[list[Any], list[int]]:
        """The engine ends chain ``first`` (its partition was revoked, or its current call
        hangs): the results not reported yet, and the calls not started but the current one
        (in progress: it reports on its own; the machine plays it as started)."""
        for chain in self.chains:
            if chain["first"][0] == first:
                results, chain["results"] = chain["results"], []
                rest = [b for b, _ in chain["calls"][1:]]
                del chain["calls"][1:]
                return results, rest
        return [], []


class FakeOutputs:
    """The library's producer: sends wait until a rule settles them. Dead letters, and (for
    poll_and_produce) the outputs of calls and runs: each output's value names its record
    (topic, partition, offset and the epoch the call ran in)."""

    transactional = False
    backlog = False

    def __init__(self, epoch_of: Callable[[tuple[str, int]], int | None]) -> None:
        self._epoch_of = epoch_of
        #: Dead letters sent and not yet settled: (batch id, (tp, offset), epoch when sent).
        self.sent: list[tuple[int, tuple[str, int], int, int | None]] = []
        #: Outputs sent and not settled: (call id or None, run id or None, owners, records,
        #: failed): per output its record (tp, offset, epoch) and whether its call failed the
        #: record with PollContext.fail (acknowledged, it is still not done); owners[i] the
        #: record index of output i.
        self.produced: list[tuple[int | None, int | None, list[int], list[Any], list[bool]]] = []
        #: Per lane: the record whose outputs are on their way (KEY and PARTITION).
        self.lanes_out: dict[object, tuple[tuple[str, int], int]] = {}
        #: Records (tp, offset, epoch) that had the output of a call that failed them sent.
        self.sent_failed: set[Any] = set()

    def _sending(self, call: int | None, run: int | None, outputs: list[Any], owners: list[int]):
        records = [decode_output(o.value) for o in outputs]
        failed = [failed_call(o.value) for o in outputs]
        self.sent_failed.update(r for r, f in zip(records, failed, strict=True) if f)
        ordering = ControllerMachine.current_ordering
        if ordering is not ProcessingOrder.UNORDERED:
            mine: dict[object, tuple[tuple[str, int], int]] = {}
            for (tp, offset, _), output in zip(records, outputs, strict=True):
                lane = (*tp, output.key) if ordering is ProcessingOrder.KEY else tp
                other = self.lanes_out.get(lane)
                # One record per lane has outputs on their way: if they fail, it is retried
                # before the lane's next record produces (whatever its partition's epoch).
                assert other is None, f"{tp}@{offset} produces while {other} of {lane} does"
                assert mine.setdefault(lane, (tp, offset)) == (tp, offset), (
                    f"two records of {lane} produce together: {mine[lane]} and {offset}"
                )
            self.lanes_out.update(mine)
        self.produced.append((call, run, owners, records, failed))

    def send_run(self, run: int, outputs: list[Any], owners: list[int]) -> None:
        self._sending(None, run, list(outputs), list(owners))

    def send(self, batch: int, outputs: list[Any]) -> None:
        if outputs[0].topic != "dlq":  # (a call's outputs, not a dead letter)
            self._sending(batch, None, list(outputs), [0] * len(outputs))
            return
        [record] = outputs
        info = read_dead_letter(record.headers)
        assert info is not None
        tp = (info.topic, info.partition)
        self.sent.append((batch, tp, info.offset, self._epoch_of(tp)))

    def pump(self) -> None:
        pass

    def close(self, *, abort: bool) -> None:
        pass


def encode_output(
    tp: tuple[str, int], offset: int, epoch: int | None, *, failed: bool = False
) -> bytes:
    """An output's value: its record, the epoch its call ran in, and whether the call failed
    the record (PollContext.fail: the output is produced, the record is not done)."""
    return b"%s,%d,%d,%d,%d" % (
        tp[0].encode(),
        tp[1],
        offset,
        -1 if epoch is None else epoch,
        failed,
    )


def decode_output(value: bytes) -> tuple[tuple[str, int], int, int | None]:
    topic, partition, offset, epoch, _ = value.split(b",")
    return (topic.decode(), int(partition)), int(offset), None if epoch == b"-1" else int(epoch)


def failed_call(value: bytes) -> bool:
    return value.endswith(b",1")


class FakePoller:
    def __init__(self, limit: int) -> None:
        self.commands: list[PollerCommand] = []
        self.credit = Credit(limit, fetch_batch=4)

    def send(self, command: PollerCommand) -> None:
        self.commands.append(command)

    def join(self, timeout: float) -> bool:
        return True

    def statistics(self) -> PollerStatistics:
        held = self.credit.held
        limit = self.credit.limit
        return PollerStatistics(held, limit, limit - held, 0, 0, None, None)


class ControllerMachine(RuleBasedStateMachine):
    ordering = ProcessingOrder.KEY
    current_ordering = ProcessingOrder.KEY
    #: Options.processing_timeout: calls past it are abandoned (overruns) and their records
    #: retried while the call runs on; its late result must change nothing.
    processing_timeout: float | None = None
    #: Options.batch_size: runs (once calls are short) carry batches unless it is 1.
    batch_size = 2
    #: The runner takes chains, and calls start at a millisecond (batch_size 1 only).
    chains = False
    #: The runner takes runs (for very short calls) too.
    runner_runs = True
    #: Calls start at a millisecond (batch_size 1, no chains): with many records ready the
    #: controller hands out bundles (several calls of different lanes to one worker).
    bundled = False
    #: A poll_and_produce handler: each successful call returns an output per record, and
    #: a record is done once its outputs are acknowledged (rule settle_outputs).
    produce = False
    #: Exactly-once: outputs, dead letters and offsets commit in one transaction (see
    #: test_engine_transactions.py).
    transactional = False
    #: Options.stall_threshold and on_stall (see test_engine_stall_policy.py).
    stall_threshold: float | None = 60.0
    on_stall = StallPolicy.WARN

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.options = Options(
            ordering=self.ordering,
            max_concurrency=3,
            batch_size=self.batch_size,
            commit_interval=1.0,
            retry_delay=0.5,
            max_retries=1,  # a record's second failure dead-letters it
            non_retryable=(KeyError,),  # and so does its first KeyError
            dead_letter_topic="dlq",
            max_metadata_bytes=64,  # small, so the "blocked" path is exercised too
            spill_offset_maps=False,
            max_buffered_records=24,  # small, so the credit bound is reached often
            processing_timeout=self.processing_timeout,
            stall_threshold=self.stall_threshold,
            on_stall=self.on_stall,
        )
        ControllerMachine.current_ordering = self.ordering
        runner_class = FakeChainRunner if self.chains else FakeRunner
        self.runner = runner_class(self.options.max_concurrency, lambda tp: self.epoch.get(tp))
        self.runner.runs = self.runner_runs
        self.runner.lane_head = self.check_lane_head
        #: Per partition: where its current assignment started reading.
        self.start: dict[tuple[str, int], int] = {}
        self.poller = FakePoller(self.options.buffer_limit)
        self.controller = Controller(
            self.options,
            runner=self.runner,
            poller=self.poller,
            committer=self.committer(),
            clock=self.clock,
        )
        # (the time per call follows real time; here the machine's clock)
        self.controller.dispatch.service_clock = self.clock.monotonic
        self.outputs = FakeOutputs(lambda tp: self.epoch.get(tp))
        self.outputs.transactional = self.transactional
        self.controller.start(
            lambda ctx: None,
            thread=False,
            outputs=self.outputs,  # type: ignore[arg-type]
            produces=self.produce,
            dead_letters=DeadLetters(self.options, "g"),
        )
        if self.chains or self.bundled:
            # Calls of a millisecond from the start: lanes go out in chains, and calls in
            # bundles when many records are ready (here: as many as the bundles would hold,
            # not twice that, so that the few records of the machine make bundles often).
            self.controller.dispatch.observe_service(0.002)
            self.controller.dispatch.bundle_ready = 1
        elif self.batch_size == 1:
            # Calls measured short from the start: the controller hands out runs at once (a
            # slow completion, took=1.0, sends it back to the lanes, a fast one to runs).
            self.controller.dispatch.observe_service(1e-6)
        #: The largest chunk size the controller used so far (calls dispatched under it may
        #: still be in flight after it shrank).
        self.chunked = self.controller.dispatch.chunk_size
        self.log: dict[tuple[str, int], list[bytes | None]] = {tp: [] for tp in TPS}
        self.position: dict[tuple[str, int], int] = {}
        self.epoch: dict[tuple[str, int], int] = {}
        self.next_epoch = 0
        self.done: dict[tuple[str, int], set[int]] = {tp: set() for tp in TPS}
        self.committed: dict[tuple[str, int], tuple[int, str]] = {}

    # -- helpers --

    def committer(self) -> Committer:
        return ConsumerCommitter(self.poller, self.options.commit_mode)

    def check_lane_head(
        self, tp: tuple[str, int], offset: int, lane: object, epoch: int | None
    ) -> None:
        """A record handed out at the head of its lane: every record of its lane before it
        (read in this assignment) has finished. Stale calls of an earlier assignment are not
        checked (their lane may have moved on)."""
        if self.ordering is ProcessingOrder.UNORDERED or epoch is None:
            return
        if self.epoch.get(tp) != epoch:
            return
        key_order = self.ordering is ProcessingOrder.KEY
        log = self.log[tp]
        done = self.done[tp]
        for o in range(self.start[tp], offset):
            if (not key_order or (*tp, log[o]) == lane) and o not in done:
                raise AssertionError(
                    f"{tp}@{offset} handed out while {o} of its lane is not finished"
                )

    def step(self) -> None:
        self.controller.run_once(block=False)
        # Credit comes back at once: the poller would run a Release before its next fetch.
        self.run_poller_commands(only_releases=True)

    def run_poller_commands(self, *, only_releases: bool = False) -> None:
        """What the poller does before each consume(): run the queued commands, in order."""
        kept = []
        for command in self.poller.commands:
            if isinstance(command, Release):
                self.poller.credit.give_back(command.count)
            elif isinstance(command, Commit) and not only_releases:
                answers = []
                for commit in command.offsets:
                    if self.epoch.get(commit.tp) == commit.epoch:
                        self.store(commit.tp, commit.offset, commit.metadata)
                        answers.append(CommitAnswer(commit))
                    else:
                        answers.append(CommitAnswer(commit, "no longer assigned"))
                command.reply.set_result(tuple(answers))
            elif only_releases:
                kept.append(command)
        self.poller.commands = kept

    def call_ended(self, batch: int, records: list[Any], outcome: str) -> BaseException | None:
        """Call ``batch`` ended with ``outcome`` ("ok", "fail" or "poison"): note its records
        done if it succeeded (a late result, of a call past its deadline, counts for nothing,
        whatever it says); returns the call's error."""
        if outcome == "ok":
            if not self.overrun(batch) and not self.produce:
                for tp, offset, _, epoch in records:
                    if self.epoch.get(tp) == epoch:
                        self.done[tp].add(offset)
            return None
        return KeyError("poison") if outcome == "poison" else RuntimeError("x")

    def overrun(self, batch: int) -> bool:
        """The call ran past its deadline: its records went on without it."""
        return batch in self.controller.dispatch.deadlines._overruns

    def store(self, tp: tuple[str, int], offset: int, metadata: str) -> None:
        previous = self.committed.get(tp)
        assert previous is None or offset >= previous[0] or tp not in self.epoch, (
            f"{tp}: the group's offset moved back from {previous[0]} to {offset}"
        )
        self.committed[tp] = (offset, metadata)

    # -- rules --

    @rule(tp=st.sampled_from(TPS), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6))
    def poll(self, tp: tuple[str, int], keys: list[bytes | None]) -> None:
        credit = self.poller.credit
        if tp not in self.epoch or not credit.can_fetch():
            return
        keys = keys[: credit.available]
        start = self.position[tp]
        log = self.log[tp]
        messages = []
        for i, key in enumerate(keys):
            offset = start + i
            if offset == len(log):
                log.append(key)
            messages.append(Message(topic=tp[0], partition=tp[1], offset=offset, key=log[offset]))
        self.position[tp] = start + len(keys)
        credit.take(len(messages))
        self.controller.post(RecordsPolled({tp: (self.epoch[tp], messages)}))
        self.step()

    @precondition(lambda self: self.bundled)
    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=6, max_size=6))
    def poll_burst(self, keys: list[bytes | None]) -> None:
        """(Machines with bundles) the poller fetches for every partition, several times
        over, while no call ends: records pile up, as behind a hundred busy workers."""
        for _ in range(2):
            for tp in TPS:
                self.poll(tp, keys)

    @rule()
    def poller_runs(self) -> None:
        self.run_poller_commands()
        self.step()

    @precondition(lambda self: self.runner.calls)
    @rule(
        index=st.integers(min_value=0),
        outcome=st.sampled_from(["ok", "fail", "poison"]),
        took=st.sampled_from([0.0, 1e-6, 1.0]),
    )
    def complete(self, index: int, outcome: str, took: float = 0.0) -> None:
        if self.bundled and took:
            took = 0.002  # (calls stay at a millisecond until calls_turn says otherwise)
        batch, records = self.runner.calls.pop(index % len(self.runner.calls))
        error = self.call_ended(batch, records, outcome)
        now = self.clock.monotonic()
        value = self.value_of(records) if error is None else None
        self.controller.post(WorkDone(batch, (error,) * len(records), value, now, took=took))
        self.step()

    def value_of(self, records: list[Any]) -> Any:
        """What a poll_and_produce handler returns for a call: an output per record."""
        if not self.produce:
            return None
        return [
            ProducerRecord(
                "out", encode_output(tp, offset, epoch), key=lane[2] if len(lane) == 3 else None
            )
            for tp, offset, lane, epoch in records
        ]

    @precondition(lambda self: len(self.runner.calls) >= 2)
    @rule(
        count=st.integers(min_value=2, max_value=5),
        failing=st.sets(st.integers(min_value=0, max_value=4)),
        fast=st.booleans(),
    )
    def complete_chunk(self, count: int, failing: set[int], fast: bool) -> None:
        """Several calls end together, as a worker reports a chunk; ``fast`` calls make the
        controller hand out chunks (adaptive dispatch), slow ones make it go back to one."""
        results = []
        for position in range(min(count, len(self.runner.calls))):
            batch, records = self.runner.calls.pop(0)
            ok = position not in failing
            if ok and not self.overrun(batch) and not self.produce:
                for tp, offset, _, epoch in records:
                    if self.epoch.get(tp) == epoch:
                        self.done[tp].add(offset)
            error = None if ok else RuntimeError("handler failed")
            now = self.clock.monotonic()
            value = self.value_of(records) if ok else None
            results.append((batch, (error,) * len(records), value, now, False))
        service = 0.002 if self.bundled else 1e-6 if fast else 1.0
        self.controller.post(WorkDoneMany(results, service))
        self.step()

    @precondition(lambda self: self.runner.run_states)
    @rule(
        index=st.integers(min_value=0),
        outcome=st.sampled_from(["ok", "ok", "fail"]),
    )
    def run_call(self, index: int, outcome: str) -> None:
        """The worker of a run: it ends the call in progress (ok, or failed: then it reports
        the run), or starts the next call, or reports the run when nothing is left to start.
        The call in progress is held as its records (a batch of them in a batched run)."""
        states = self.runner.run_states
        state = states[index % len(states)]
        run, current, epoch = state
        if current is None:
            try:
                taken = run.pending.popleft()
            except IndexError:
                self._report_run(state, None)
                return
            state[1] = list(taken) if run.batched else [taken]
            return
        if outcome == "fail":
            self._report_run(state, RuntimeError("handler failed"))
            return
        state[1] = None
        if run.outputs is not None:
            assert self.produce
            (message,) = current
            run.outputs.append(
                ProducerRecord(
                    "out", encode_output(run.tp, message.offset(), epoch), key=message.key()
                )
            )
        run.done += len(current)
        if self.epoch.get(run.tp) == epoch and not self.produce:
            self.done[run.tp].update(message.offset() for message in current)

    @precondition(
        lambda self: self.produce and any(s[1] is not None for s in self.runner.run_states)
    )
    @rule(index=st.integers(min_value=0))
    def run_call_fails_with_output(self, index: int) -> None:
        """poll_and_produce: the call in progress of a run failed its record with
        PollContext.fail and returned an output. The output is produced at once (or, in the
        transactional mode, held back while the gate is closed), and the failure applies once it
        is acknowledged."""
        states = [s for s in self.runner.run_states if s[1] is not None]
        state = states[index % len(states)]
        run, (current,), epoch = state
        assert run.outputs is not None
        value = encode_output(run.tp, current.offset(), epoch, failed=True)
        run.outputs.append(ProducerRecord("out", value, key=current.key()))
        # (a detached run's call abandoned past its deadline: its late result counts for nothing)
        abandoned = run.adopted is not None and self.overrun(run.adopted[1])
        self._report_run(state, RuntimeError("failed with PollContext.fail"))
        if self.epoch.get(run.tp) == epoch and not abandoned:
            owed = (run.tp, current.offset(), epoch)
            if owed in self.outputs.sent_failed:
                return
            # (transactional mode: a commit is wanted, and the gate holds outputs back until
            # it is answered; the output must then wait among the queued ones)
            delivery = self.controller.delivery
            held = [
                decode_output(output.value)
                for pending in delivery.pending.queued
                for output in pending.outputs
            ]
            assert delivery.gate is not None, f"{owed}: the output of a failed call was not sent"
            assert not delivery.gate.open, f"{owed}: not sent while the gate was open"
            assert owed in held, f"{owed}: the output of a failed call was neither sent nor held"

    def _report_run(self, state: list[Any], error: BaseException | None) -> None:
        self.runner.run_states.remove(state)
        run, current = state[0], state[1]
        errors = None
        if run.batched and error is not None:
            errors = (error,) * len(current)
        self.controller.post(
            RunDone(run, run.done, error, self.clock.monotonic(), 1e-6, errors=errors)
        )
        self.step()

    @precondition(lambda self: getattr(self.runner, "chains", None))
    @rule(
        index=st.integers(min_value=0),
        outcome=st.sampled_from(["ok", "ok", "fail", "poison"]),
        early=st.booleans(),
    )
    def chain_step(self, index: int, outcome: str, early: bool) -> None:
        """The worker of a chain ends its current call: ok (then the next starts, or the chain
        reports), or failed (the chain reports, and its calls not started come back). With
        ``early``, the stuck check reports the finished calls of a chain still running."""
        chains = self.runner.chains  # type: ignore[attr-defined]
        chain = chains[index % len(chains)]
        batch, records = chain["calls"].pop(0)
        error = self.call_ended(batch, records, outcome)
        ok = error is None
        chain["results"].append(
            (batch, (error,) * len(records), None, self.clock.monotonic(), False)
        )
        unstarted: list[int] = []
        if not ok:
            unstarted = [b for b, _ in chain["calls"]]
            chain["calls"] = []
        if not chain["calls"] and unstarted and early:
            # The stuck check took the failed result before the worker gave the rest back:
            # two reports, the failure first (its retry may be back in the lane meanwhile).
            chains.remove(chain)
            self.controller.post(WorkDoneMany(chain["results"], 0.002))
            self.step()
            self.clock.advance(0.5)  # (the machine's retry_delay: the retry is due)
            self.step()
            self.controller.post(WorkDoneMany([], 0.002, unstarted))
            self.step()
        elif not chain["calls"]:
            chains.remove(chain)
            self.controller.post(WorkDoneMany(chain["results"], 0.002, unstarted))
            self.step()
        elif early:
            results, chain["results"] = chain["results"], []
            self.controller.post(WorkDoneMany(results, 0.002))
            self.step()

    @precondition(lambda self: self.controller.runs.runs.active)
    @rule(index=st.integers(min_value=0))
    def detach_run(self, index: int) -> None:
        """The controller's stuck check finds a run whose call takes long: the run is
        detached (its records not started go to the lanes)."""
        active = list(self.controller.runs.runs.active.values())
        self.controller.runs.detach(active[index % len(active)], drop=False)
        self.step()

    @precondition(lambda self: self.outputs.sent)
    @rule(index=st.integers(min_value=0), ok=st.booleans())
    def settle_dead_letter(self, index: int, ok: bool) -> None:
        """The broker acknowledges a dead letter (its record is then done), or it fails (the
        record stays unfinished and its letter is written again later)."""
        batch, tp, offset, epoch = self.outputs.sent.pop(index % len(self.outputs.sent))
        if ok and self.epoch.get(tp) == epoch:
            self.done[tp].add(offset)
        result: Any = (0, 0) if ok else ProduceError("dead-letter topic unavailable")
        self.controller.post(OutputsDelivered(((batch, (result,)),)))
        self.step()

    @precondition(lambda self: self.outputs.produced)
    @rule(index=st.integers(min_value=0), failing=st.sets(st.integers(0, 5), max_size=2))
    def settle_outputs(self, index: int, failing: set[int]) -> None:
        """The broker acknowledges the outputs of a call or a run, but those of the records
        numbered in ``failing`` (a call's records fail together); the records whose outputs
        all arrived are done."""
        produced = self.outputs.produced
        call, run, owners, records, failed_calls = produced.pop(index % len(produced))
        for (tp, offset, _), output_lane in zip(records, self._lanes(records), strict=True):
            if self.outputs.lanes_out.get(output_lane) == (tp, offset):
                del self.outputs.lanes_out[output_lane]
        failed = {owner for owner in owners if owner in failing}
        if call is not None and failed:
            failed = set(owners)
        for owner, record, failed_call_ in zip(owners, records, failed_calls, strict=True):
            tp, offset, epoch = record
            if owner in failed or failed_call_:
                continue
            if self.epoch.get(tp) == epoch:
                self.done[tp].add(offset)
        error = ProduceError("not delivered")
        if call is not None:
            results = tuple(error if o in failed else (0, 0) for o in owners)
            self.controller.post(OutputsDelivered(((call, results),)))
        else:
            failures = dict.fromkeys(failed, error) or None
            self.controller.post(OutputsDelivered((), ((run, failures),)))
        self.step()

    def _lanes(self, records: list[Any]) -> list[object]:
        lanes = []
        for tp, offset, _ in records:
            key = self.log[tp][offset] if offset < len(self.log[tp]) else None
            lanes.append((*tp, key) if self.ordering is ProcessingOrder.KEY else tp)
        return lanes

    @rule(tp=st.sampled_from(TPS))
    def revoke(self, tp: tuple[str, int]) -> None:
        if tp not in self.epoch:
            return
        reply: Future[Any] = Future()
        self.controller.post(PartitionsRevoked((tp,), reply))
        self.controller.run_once(block=False)
        assert reply.done()
        # Inside the revoke callback the poller runs what was queued, the final commit last,
        # while the partition is still its own; then it lets go.
        self.run_poller_commands()
        del self.epoch[tp]
        del self.position[tp]
        self.step()

    @rule(tp=st.sampled_from(TPS))
    def bounce(self, tp: tuple[str, int]) -> None:
        """Revoked and assigned straight back (a rebalance that keeps the partition here) while
        its calls may still run."""
        if tp in self.epoch:
            self.revoke(tp)
            self.assign(tp)

    @rule(tp=st.sampled_from(TPS))
    def assign(self, tp: tuple[str, int]) -> None:
        if tp in self.epoch:
            return
        self.run_poller_commands()  # commits queued before the assignment run first
        self.next_epoch += 1
        self.epoch[tp] = self.next_epoch
        offset, metadata = self.committed.get(tp, (None, None))
        self.position[tp] = 0 if offset is None else offset
        self.start[tp] = self.position[tp]
        self.controller.post(
            PartitionsAssigned((Assignment(tp, self.next_epoch, offset, metadata),))
        )
        self.step()

    @rule(speed=st.sampled_from(["slow", "fast", "millisecond"]))
    def calls_turn(self, speed: str) -> None:
        """The handler's calls turn slow (the controller goes back to one call per hand-over
        and to lanes), fast (chunks and runs) or to a millisecond (chains, if the runner takes
        them): reports over several of the controller's windows, since the measure rises at
        most 1.6x per window."""
        took = {"slow": 1.0, "fast": 1e-6, "millisecond": 0.002}[speed]
        for _ in range(12):
            self.clock.advance(sizing.STUCK_CHECK_EVERY)
            self.controller.dispatch.observe_service(took)
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
        for _ in range(400):
            if self.runner.run_states:
                self.run_call(0, "ok")
            elif getattr(self.runner, "chains", None):
                self.chain_step(0, "ok", False)
            elif self.runner.calls:
                self.complete(0, "ok")
            elif self.outputs.sent:
                self.settle_dead_letter(0, True)
            elif self.outputs.produced:
                self.settle_outputs(0, set())
            else:
                self.clock.advance(1.0)
                self.step()
                self.run_poller_commands()
            stats = self.controller.statistics()
            if (
                not self.runner.calls
                and not self.runner.run_states
                and not getattr(self.runner, "chains", None)
                and not self.outputs.sent
                and not self.outputs.produced
                and stats.waiting == 0
                and stats.retry_waiting == 0
                and stats.delivering == 0
            ):
                break
        self.clock.advance(1.0)
        self.step()
        self.run_poller_commands()
        self.step()
        self.run_poller_commands()
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
        for batch, records in self.runner.calls:
            if self.overrun(batch):
                continue  # abandoned calls may overlap their record's retry (at-least-once)
            # Stale calls count too: a lane of a revoked and re-assigned partition must not run
            # beside a call of the earlier assignment that is still running.
            for _, _, lane, _ in records:
                lanes[lane] = lanes.get(lane, 0) + 1
        # A run holds the lanes of its call in progress and of its records not started (they
        # run one after another, so a lane may appear in it several times).
        for run, current, _ in self.runner.run_states:
            held = set()
            pending = [m for b in run.pending for m in b] if run.batched else list(run.pending)
            # (the call in progress of a detached run, abandoned as above, runs on unheld)
            abandoned = run.adopted is not None and self.overrun(run.adopted[1])
            for message in [*(() if abandoned else current or ()), *pending]:
                tp = (message.topic(), message.partition())
                held.add((*tp, message.key()) if self.ordering is ProcessingOrder.KEY else tp)
            for lane in held:
                lanes[lane] = lanes.get(lane, 0) + 1
        # A chain holds the lane of its calls not finished (one lane: they run in turn).
        for chain in getattr(self.runner, "chains", ()):
            held = {
                lane
                for batch, records in chain["calls"]
                if not self.overrun(batch)  # (abandoned, as above)
                for _, _, lane, _ in records
            }
            for lane in held:
                lanes[lane] = lanes.get(lane, 0) + 1
        if self.ordering is not ProcessingOrder.UNORDERED:
            assert all(count == 1 for count in lanes.values()), lanes

    @invariant()
    def in_flight_stays_within_capacity(self) -> None:
        # With deadlines nothing waits inside the runner, and abandoned calls still running
        # hold their worker: never more calls than workers.
        # Adaptive dispatch (no deadlines): a chunk of calls per worker and backlog slot, run
        # one after another on that worker, never two at once.
        backlog = self.runner.backlog if self.processing_timeout is None else 0
        self.chunked = max(self.chunked, self.controller.dispatch.chunk_size)
        # A chain takes one worker (or backlog slot), whatever its length; so does a bundle.
        chains = len(getattr(self.runner, "chains", ()))
        # A bundle (a chunk of long calls) too: its calls beyond the first hold no worker.
        bundles = self.controller.dispatch.bundles
        calls = len(self.runner.calls) - bundles.extra
        assert calls + chains <= (self.runner.capacity + backlog) * self.chunked
        assert bundles.extra >= 0
        assert sum(bundles.by_tp.values()) == len(bundles._of)
        if self.chunked == 1:
            # No chunks of short calls so far, perhaps bundles: never more workers than the
            # call limit, as the runner counts them.
            assert self.runner.workers_held() + chains <= self.runner.capacity + backlog
        # A run takes one worker (or backlog slot).
        assert len(self.runner.run_states) <= self.runner.capacity + backlog

    @invariant()
    def credit_matches_what_the_engine_holds(self) -> None:
        credit = self.poller.credit
        assert 0 <= credit.held <= credit.limit
        unreturned = sum(c.count for c in self.poller.commands if isinstance(c, Release))
        assert credit.held == self.controller.statistics().held + unreturned + (
            self.controller.ledger.to_release
        )


class PartitionMachine(ControllerMachine):
    ordering = ProcessingOrder.PARTITION


class UnorderedMachine(ControllerMachine):
    ordering = ProcessingOrder.UNORDERED


class KeyMachine(ControllerMachine):
    ordering = ProcessingOrder.KEY


class KeyMachineWithDeadlines(ControllerMachine):
    ordering = ProcessingOrder.KEY
    processing_timeout = 1.5


class PartitionMachineWithDeadlines(ControllerMachine):
    ordering = ProcessingOrder.PARTITION
    processing_timeout = 1.5


class KeyMachineWithRuns(ControllerMachine):
    ordering = ProcessingOrder.KEY
    batch_size = 1


class PartitionMachineWithRuns(ControllerMachine):
    ordering = ProcessingOrder.PARTITION
    batch_size = 1


class UnorderedMachineWithRuns(ControllerMachine):
    ordering = ProcessingOrder.UNORDERED
    batch_size = 1


class KeyMachineWithChains(ControllerMachine):
    ordering = ProcessingOrder.KEY
    batch_size = 1
    chains = True


class KeyMachineWithChainsOnly(ControllerMachine):
    ordering = ProcessingOrder.KEY
    batch_size = 1
    chains = True
    runner_runs = False


class PartitionMachineWithChains(ControllerMachine):
    ordering = ProcessingOrder.PARTITION
    batch_size = 1
    chains = True


class UnorderedMachineWithBundles(ControllerMachine):
    ordering = ProcessingOrder.UNORDERED
    batch_size = 1
    bundled = True
    runner_runs = False


class UnorderedMachineProducingInBundles(ControllerMachine):
    ordering = ProcessingOrder.UNORDERED
    batch_size = 1
    bundled = True
    runner_runs = False
    produce = True


class KeyMachineProducing(ControllerMachine):
    """poll_and_produce: runs produce (RunOutputs) and calls produce; outputs fail at random."""

    ordering = ProcessingOrder.KEY
    batch_size = 1
    produce = True


class UnorderedMachineProducing(ControllerMachine):
    ordering = ProcessingOrder.UNORDERED
    batch_size = 1
    produce = True


class PartitionMachineProducing(ControllerMachine):
    ordering = ProcessingOrder.PARTITION
    batch_size = 1
    produce = True


_settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestKeyOrder = _settings(KeyMachine).TestCase
TestPartitionOrder = _settings(PartitionMachine).TestCase
TestUnordered = _settings(UnorderedMachine).TestCase
TestKeyOrderWithDeadlines = _settings(KeyMachineWithDeadlines).TestCase
TestPartitionOrderWithDeadlines = _settings(PartitionMachineWithDeadlines).TestCase
TestKeyOrderWithRuns = _settings(KeyMachineWithRuns).TestCase
TestPartitionOrderWithRuns = _settings(PartitionMachineWithRuns).TestCase
TestUnorderedWithRuns = _settings(UnorderedMachineWithRuns).TestCase
TestKeyOrderWithChains = _settings(KeyMachineWithChains).TestCase
TestKeyOrderWithChainsOnly = _settings(KeyMachineWithChainsOnly).TestCase
TestPartitionOrderWithChains = _settings(PartitionMachineWithChains).TestCase
TestUnorderedWithBundles = _settings(UnorderedMachineWithBundles).TestCase
TestUnorderedProducingInBundles = _settings(UnorderedMachineProducingInBundles).TestCase
_producing = settings(max_examples=300, stateful_step_count=50, deadline=None)
TestKeyOrderProducing = _producing(KeyMachineProducing).TestCase
TestUnorderedProducing = _producing(UnorderedMachineProducing).TestCase
TestPartitionOrderProducing = _settings(PartitionMachineProducing).TestCase
