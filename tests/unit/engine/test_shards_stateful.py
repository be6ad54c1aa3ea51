"""ShardMap as a state machine: ``take_longest`` and ``take`` mixed with every other
operation (chains, retries, put-backs, blocked partitions, revokes with stale calls, runs),
checked after each step against a model: no lane lost or scheduled twice, counts exact, one
record out per lane, nothing beside a stale call of its lane, blocked limits kept; drained at
the end, every record ran exactly once in lane order."""

from __future__ import annotations

from collections import defaultdict

from confluent_kafka import Message
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from parallel_consumer.options import ProcessingOrder
from parallel_consumer.work.item import WorkItem
from parallel_consumer.work.shards import ShardMap, shard_key_for

TPS = [("t", 0), ("t", 1)]
KEYS = [b"a", b"b", b"c", b"d"]


class Machine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.ordering = ProcessingOrder.KEY
        self.s = ShardMap(self.ordering)
        self.next_offset = dict.fromkeys(TPS, 0)
        self.epoch = dict.fromkeys(TPS, 1)
        self.blocked: dict = {}
        self.chains: list[list[WorkItem]] = []  # first item running, rest not started
        self.retry_wait: list[WorkItem] = []
        self.to_put_back: list[list[WorkItem]] = []
        self.stale: list[WorkItem] = []
        self.outside = 0  # records counted waiting outside lanes (runs)
        self.runs: list[WorkItem] = []
        self.added: dict[tuple, list[int]] = defaultdict(list)  # (tp, epoch, key) -> offsets
        self.done: dict[tuple, list[int]] = defaultdict(list)
        self.given: dict[tuple, list[int]] = defaultdict(list)

    def lane(self, i: WorkItem):
        return (i.tp, i.epoch, i.shard_key)

    def out_items(self):
        for c in self.chains:
            yield from c
        yield from self.retry_wait
        for c in self.to_put_back:
            yield from c

    @rule(tp=st.sampled_from(TPS), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6))
    def add(self, tp, keys):
        items = []
        for k in keys:
            o = self.next_offset[tp]
            self.next_offset[tp] += 1
            m = Message(topic=tp[0], partition=tp[1], offset=o, key=k)
            it = WorkItem(m, tp, shard_key_for(self.ordering, tp, k), epoch=self.epoch[tp])
            items.append(it)
            self.added[self.lane(it)].append(o)
        self.s.add(tp, items)

    def _taken(self, head, most):
        assert head is not None
        # one lane out at a time, for the current epoch (stale ones hold the lane too)
        for o in self.out_items():
            assert o.shard_key != head.shard_key or o.epoch != head.epoch, ("two out", head, o)
        for o in self.stale:
            assert o.shard_key != head.shard_key, ("beside stale", head, o)
        if self.blocked.get(head.tp) is not None:
            assert head.offset < self.blocked[head.tp]
        after = self.s.take_following(head, most, self.blocked) if most else []
        chain = [head, *after]
        for i in chain:
            self.given[self.lane(i)].append(i.offset)
        self.chains.append(chain)

    @rule(longest=st.booleans(), most=st.integers(0, 3))
    def take(self, longest, most):
        head = (self.s.take_longest if longest else self.s.take)(self.blocked)
        if head is not None:
            self._taken(head, most)

    @precondition(lambda self: self.chains)
    @rule(data=st.data())
    def finish_first(self, data):
        c = data.draw(st.sampled_from(self.chains))
        item = c.pop(0)
        self.done[self.lane(item)].append(item.offset)
        self.s.finished(item)
        if not c:
            self.chains.remove(c)

    @precondition(lambda self: self.chains)
    @rule(data=st.data())
    def fail_first(self, data):
        c = data.draw(st.sampled_from(self.chains))
        self.chains.remove(c)
        item = c.pop(0)
        self.s.retry_later(item)
        self.retry_wait.append(item)
        if c:
            self.to_put_back.append(c)

    @precondition(lambda self: self.to_put_back)
    @rule(data=st.data())
    def put_back(self, data):
        c = data.draw(st.sampled_from(self.to_put_back))
        self.to_put_back.remove(c)
        self.s.put_back(c)

    @precondition(lambda self: self.retry_wait)
    @rule(data=st.data())
    def retry_now(self, data):
        item = data.draw(st.sampled_from(self.retry_wait))
        self.retry_wait.remove(item)
        self.s.retry_now(item)

    @rule(tp=st.sampled_from(TPS), raise_by=st.integers(0, 5))
    def block(self, tp, raise_by):
        if tp in self.blocked:
            self.blocked[tp] += raise_by
            self.s.unpark(tp)
        else:
            done = [o for (t, e, _), os in self.done.items() if t == tp for o in os]
            self.blocked[tp] = max(done, default=0)

    @precondition(lambda self: self.blocked)
    @rule(data=st.data())
    def unblock(self, data):
        tp = data.draw(st.sampled_from(sorted(self.blocked)))
        del self.blocked[tp]
        self.s.unpark(tp)

    @rule(tp=st.sampled_from(TPS))
    def revoke_and_reassign(self, tp):
        # pending put_backs of tp first (as the controller's recall does)
        for c in [c for c in self.to_put_back if c[0].tp == tp]:
            self.to_put_back.remove(c)
            self.s.put_back(c)
        # recall chains: the running call stays, the rest goes back
        for c in [c for c in self.chains if c[0].tp == tp]:
            if len(c) > 1:
                rest = c[1:]
                del c[1:]
                self.s.put_back(rest)
        self.s.remove_partition(tp)
        self.blocked.pop(tp, None)
        self.retry_wait = [i for i in self.retry_wait if i.tp != tp]
        for c in [c for c in self.chains if c[0].tp == tp]:
            self.chains.remove(c)
            self.s.hold_for_stale(c[0])
            self.stale.append(c[0])
        old = self.epoch[tp]
        for lane in [k for k in self.added if k[0] == tp and k[1] == old]:
            self.added.pop(lane)
            self.done.pop(lane, None)
            self.given.pop(lane, None)
        self.epoch[tp] += 1

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def stale_ends(self, data):
        item = data.draw(st.sampled_from(self.stale))
        self.stale.remove(item)
        self.s.stale_done(item)

    @rule(tp=st.sampled_from(TPS), key=st.sampled_from(KEYS))
    def to_run(self, tp, key):
        got = self.s.take_idle((tp[0], tp[1], key))
        if got:
            for i in got:
                self.given[self.lane(i)].append(i.offset)
                self.done[self.lane(i)].append(i.offset)

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def structure(self):
        s = self.s
        ready_ids = [id(x) for x in s._ready if not x.removed]
        assert len(ready_ids) == len(set(ready_ids)), "a lane twice in the ready deque"
        parked = {id(x) for lst in s._parked.values() for x in lst}
        total = 0
        for key, sh in s._shards.items():
            assert not sh.removed
            in_ready = id(sh) in set(ready_ids)
            assert sh.parked == (id(sh) in parked), ("parked flag", sh)
            assert sh.scheduled == (in_ready or sh.parked), ("scheduled flag", sh, in_ready)
            if sh.queue and not sh.busy and not sh.parked:
                assert in_ready, ("lost lane", sh)
            offs = [i.offset for i in sh.queue]
            assert offs == sorted(offs)
            total += len(sh.queue)
            expect_busy = sum(
                1
                for i in self.out_items()
                if i.shard_key == key and i.tp == sh.tp and i.epoch == self.epoch[sh.tp]
            ) + sum(1 for i in self.stale if i.shard_key == key)
            assert sh.busy == expect_busy, ("busy", sh, expect_busy)
        assert s.waiting == total, (s.waiting, total)
        for tp in TPS:
            n = sum(len(sh.queue) for sh in s._shards.values() if sh.tp == tp)
            assert s.waiting_by_tp.get(tp, 0) == n

    def teardown(self):
        # drain: everything of the current epochs runs once, in lane order
        s = self.s
        for c in list(self.to_put_back):
            s.put_back(c)
        self.to_put_back.clear()
        for i in self.retry_wait:
            s.retry_now(i)
        self.retry_wait.clear()
        for i in self.stale:
            s.stale_done(i)
        self.stale.clear()
        self.blocked.clear()
        for tp in TPS:
            s.unpark(tp)
        for _ in range(10000):
            for c in self.chains:
                for i in c:
                    self.done[self.lane(i)].append(i.offset)
                    s.finished(i)
            self.chains.clear()
            head = s.take_longest({})
            if head is None:
                break
            self._taken(head, 2)
        assert s.waiting == 0, s
        assert len(s) == 0, s._shards
        for lane, offs in self.added.items():
            assert self.done[lane] == offs, (lane, offs, self.done[lane])
            # given in order, with repeats only for retries / put backs (non-decreasing runs)


Machine.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
TestShards = Machine.TestCase
