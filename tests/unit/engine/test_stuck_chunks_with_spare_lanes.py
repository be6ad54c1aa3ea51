"""Spare lanes reused as new ones, and stuck chunks: a shard state machine whose spare lanes
are referred to by nothing and serve one lane at a time, and calls hanging past STUCK_AFTER,
failing and bounced by revokes, whose chunks the stuck check reports at once, with every
commit, lane order and call end still right."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict

import pytest
import test_shards_stateful as shards_machine
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from parallel_consumer import NoHooks, Options, PollContext, ProcessingOrder
from parallel_consumer.offsets import decode_offset_map
from parallel_consumer.runners.threads import ThreadRunner
from parallel_consumer.testing.fakes import FakeConsumer
from parallel_consumer.work.shards import shard_key_for

# -- spare lanes ---------------------------------------------------------------------------------


class SpareMachine(shards_machine.Machine):
    """The shard state machine with holds (outputs on their way), adopted calls of detached
    runs, and invariants on the spare list: a spare lane is referred to by nothing (not a lane,
    not ready, not parked), empty, unscheduled, and no object serves two lanes."""

    def __init__(self):
        super().__init__()
        self.held: list[list[object]] = []

    def _held_keys(self):
        return Counter(k for keys in self.held for k in keys)

    def _taken(self, head, most):
        assert head.shard_key not in self._held_keys(), ("a held lane handed out", head)
        super()._taken(head, most)

    @rule(
        tp=st.sampled_from(shards_machine.TPS),
        keys=st.sets(st.sampled_from(shards_machine.KEYS), min_size=1),
    )
    def hold(self, tp, keys):
        lanes = [shard_key_for(self.ordering, tp, k) for k in sorted(keys)]
        self.s.hold(lanes)
        self.held.append(lanes)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data):
        keys = data.draw(st.sampled_from(self.held))
        self.held.remove(keys)
        self.s.release(keys)

    @rule(tp=st.sampled_from(shards_machine.TPS), key=st.sampled_from(shards_machine.KEYS))
    def detached_run(self, tp, key):
        """A run took an idle lane's records (take_idle) and was detached at once: its first
        record is adopted (in flight), the rest goes back to the lane."""
        got = self.s.take_idle((tp[0], tp[1], key))
        if not got:
            return
        first, rest = got[0], got[1:]
        self.s.adopt(first)
        self.given[self.lane(first)].append(first.offset)
        self.chains.append([first])
        if rest:
            self.s.add(tp, rest)

    @invariant()
    def spares_are_free(self):
        s = self.s
        spare = s._spare
        ids = [id(x) for x in spare]
        assert len(ids) == len(set(ids)), "a lane twice in the spare list"
        live = [id(x) for x in s._shards.values()]
        assert len(live) == len(set(live)), "one Shard object serves two lanes"
        for key, sh in s._shards.items():
            assert sh.key == key, ("lane key", sh.key, key)
        ready = {id(x) for x in s._ready}
        parked = {id(x) for lst in s._parked.values() for x in lst}
        for sh in spare:
            assert id(sh) not in set(live), ("a spare is a lane", sh)
            assert id(sh) not in ready, ("a spare is in the ready queue", sh)
            assert id(sh) not in parked, ("a spare is parked", sh)
            assert not sh.queue, ("a spare with records", sh)
            assert not sh.scheduled, ("a scheduled spare", sh)
            assert not sh.parked, ("a parked spare", sh)

    @invariant()
    def structure(self):
        # (the base invariant, with holds counted busy)
        s = self.s
        held = self._held_keys()
        ready_ids = [id(x) for x in s._ready if not x.removed]
        assert len(ready_ids) == len(set(ready_ids))
        for key, sh in s._shards.items():
            expect = (
                sum(
                    1
                    for i in self.out_items()
                    if i.shard_key == key and i.tp == sh.tp and i.epoch == self.epoch[sh.tp]
                )
                + sum(1 for i in self.stale if i.shard_key == key)
                + held.get(key, 0)
            )
            assert sh.busy == expect, ("busy", sh, expect)
            if sh.queue and not sh.busy and not sh.parked:
                assert id(sh) in set(ready_ids), ("lost lane", sh)

    def teardown(self):
        for keys in self.held:
            self.s.release(keys)
        self.held.clear()
        super().teardown()


_examples = int(os.environ.get("SPARE_LANES_EXAMPLES", "300"))
SpareMachine.TestCase.settings = settings(
    max_examples=_examples, stateful_step_count=80, deadline=None
)
TestSpareLanes = SpareMachine.TestCase


# -- the stuck check handles its reports at once -------------------------------------------------


class _Ends(NoHooks):
    """Every call handed out (on_dispatch) ends once (on_work_done)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.dispatched: Counter[int] = Counter()
        self.ended: Counter[int] = Counter()

    def on_dispatch(self, batch, context):
        with self.lock:
            self.dispatched[batch] += 1

    def on_work_done(self, batch, errors, duration):
        with self.lock:
            self.ended[batch] += 1


@pytest.mark.parametrize("ordering", [ProcessingOrder.KEY, ProcessingOrder.UNORDERED])
@pytest.mark.parametrize("bounce", [False, True])
def test_stuck_chunks_with_failures_revokes_and_close_keep_every_guarantee(
    harness, cluster, wait_until, monkeypatch, ordering, bounce
):
    """Calls of ~2 ms (chains in KEY order, bundles when unordered), some hanging past
    STUCK_AFTER (the stuck check reports their chunk's finished calls at once and moves the
    rest), some failing once (retry_delay=0), partitions bounced meanwhile. Checked: every
    commit covers only records that succeeded before it was sent; per key, a record starts only
    after every earlier record of its key succeeded (KEY); at most max_concurrency calls at
    once; every call handed out ends exactly once for the hooks; nothing runs after close;
    everything is committed in the end."""
    partitions, per_partition, keys = 2, 300, 12
    cluster.create_topic("t", partitions)
    for p in range(partitions):
        for o in range(per_partition):
            cluster.produce("t", b"v", key=b"k%d" % (o % keys), partition=p)
    lock = threading.Lock()
    succeeded: set[tuple[int, int]] = set()
    by_key: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    for p in range(partitions):
        for o in range(per_partition):
            by_key[(p, b"k%d" % (o % keys))].append(o)
    problems: list[str] = []
    running = [0, 0]  # now, most
    closed = threading.Event()

    original_commit = FakeConsumer.commit

    def checked_commit(self, offsets=None, asynchronous=True):
        with lock:
            done = set(succeeded)
        for tp in offsets or []:
            decoded = decode_offset_map(tp.offset, tp.metadata or "")
            finished = set(range(tp.offset))
            finished |= set(range(decoded.base, decoded.highest_seen + 1)) - set(decoded.incomplete)
            missing = sorted(o for o in finished if (tp.partition, o) not in done)
            if missing:
                problems.append(f"commit of t[{tp.partition}]@{tp.offset} covers {missing[:5]}")
        return original_commit(self, offsets, asynchronous)

    monkeypatch.setattr(FakeConsumer, "commit", checked_commit)
    reported: list[int] = []
    original_release = ThreadRunner.release_stuck

    def counted_release(self, older_than, report=None):
        def counting(event):
            reported.append(len(event.calls))
            report(event)

        return original_release(self, older_than, None if report is None else counting)

    monkeypatch.setattr(ThreadRunner, "release_stuck", counted_release)

    def handle(ctx: PollContext) -> None:
        if closed.is_set():
            problems.append(f"handler called after close: {ctx.offset}")
        p, o = ctx.partition, ctx.offset
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
            if ordering is ProcessingOrder.KEY:
                earlier = [e for e in by_key[(p, ctx.key)] if e < o]
                not_done = [e for e in earlier if (p, e) not in succeeded]
                if not_done:
                    problems.append(f"t[{p}]@{o} started before {not_done[:3]} of its key")
        try:
            if o % 37 == 5 and ctx.attempts == 0:
                time.sleep(0.045)  # past STUCK_AFTER: its chunk is stuck
            else:
                time.sleep(0.002)
            if o % 23 == 7 and ctx.attempts == 0:
                raise RuntimeError("transient")
            with lock:
                succeeded.add((p, o))
        finally:
            with lock:
                running[0] -= 1

    hooks = _Ends()
    limit = 4
    pc = harness.make(
        Options(ordering=ordering, max_concurrency=limit, retry_delay=0, commit_interval=0.05),
        hooks=hooks,
    )
    pc.poll(handle)
    if bounce:
        consumer = None
        wait_until(lambda: harness.consumers, timeout=10)
        consumer = harness.consumers[0]
        for i in range(12):
            time.sleep(0.06)
            tp = ("t", i % partitions)
            consumer.rebalance(revoke=[tp], assign=[tp])
    wait_until(
        lambda: all(
            (cluster.committed("g", "t", p) or (0, None))[0] == per_partition
            for p in range(partitions)
        ),
        timeout=60,
    )
    stats = pc.statistics()
    pc.close()
    closed.set()
    time.sleep(0.05)
    assert stats.chains + stats.bundles > 0, "neither chains nor bundles: the path is not run"
    assert sum(reported) > 0, f"the stuck check reported nothing: {reported}"
    assert not problems, problems[:10]
    assert running[1] <= limit, f"{running[1]} calls at once, limit {limit}"
    twice = {b: n for b, n in hooks.ended.items() if n > 1}
    assert not twice, f"calls that ended twice: {sorted(twice)[:10]}"
    never = set(hooks.dispatched) - set(hooks.ended)
    assert not never, f"calls handed out that never ended: {sorted(never)[:10]}"
    assert all((p, o) in succeeded for p in range(partitions) for o in range(per_partition))
