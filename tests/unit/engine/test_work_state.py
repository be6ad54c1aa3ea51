"""Pure work state: partition bookkeeping, shards and pause decisions (no threads)."""

from __future__ import annotations

from confluent_kafka import Message

from parallel_consumer.options import ProcessingOrder
from parallel_consumer.work.backpressure import partition_cap, partitions_to_pause
from parallel_consumer.work.item import WorkItem
from parallel_consumer.work.partitions import PartitionState
from parallel_consumer.work.shards import ShardMap, shard_key_for

TP = ("t", 0)


def msgs(*offsets: int, key: bytes | None = None) -> list[Message]:
    return [Message(topic="t", partition=0, offset=o, key=key) for o in offsets]


def item(offset: int, key: bytes | None = b"k", tp=TP, ordering=ProcessingOrder.KEY) -> WorkItem:
    message = Message(topic=tp[0], partition=tp[1], offset=offset, key=key)
    return WorkItem(message, tp, shard_key_for(ordering, tp, key), epoch=1)


class TestPartitionState:
    def test_commit_offset_is_lowest_incomplete_else_next_after_highest_succeeded(self):
        state = PartitionState(TP, 1)
        state.accept(msgs(0, 1, 2, 3))
        assert state.offset_to_commit() == 0
        state.succeeded(1)
        state.succeeded(0)
        assert state.offset_to_commit() == 2
        state.succeeded(3)
        state.succeeded(2)
        assert state.offset_to_commit() == 4

    def test_restored_finished_offsets_are_skipped(self):
        state = PartitionState(
            TP, 1, committed_offset=3, restored_incomplete=[3, 6], restored_highest=7
        )
        fresh = state.accept(msgs(3, 4, 5, 6, 7, 8))
        assert [m.offset() for m in fresh] == [3, 6, 8]
        assert list(state.incomplete) == [3, 6, 8]

    def test_first_poll_above_expected_forgets_unfinished_below_it(self):
        # retention removed 3..9: the restored 3 and 6 no longer exist
        state = PartitionState(
            TP, 1, committed_offset=3, restored_incomplete=[3, 6, 12], restored_highest=13
        )
        fresh = state.accept(msgs(10, 11, 12, 14))
        assert [m.offset() for m in fresh] == [12, 14]
        assert state.offset_to_commit() == 12

    def test_first_poll_below_expected_resets_the_state(self):
        # the offset was rewound to 0: the old map no longer applies, everything runs
        state = PartitionState(
            TP, 1, committed_offset=5, restored_incomplete=[5, 7], restored_highest=8
        )
        fresh = state.accept(msgs(0, 1, 2))
        assert [m.offset() for m in fresh] == [0, 1, 2]
        assert list(state.incomplete) == [0, 1, 2]
        assert state.offset_to_commit() == 0

    def test_read_position_past_trailing_markers_moves_the_commit_when_nothing_is_unfinished(self):
        state = PartitionState(TP, 1)
        state.accept(msgs(0, 1, 2))
        state.succeeded(0)
        state.read_to(5)  # 3 and 4 are transaction markers / aborted records
        assert state.offset_to_commit() == 1  # 1 and 2 are still unfinished
        state.succeeded(1)
        state.succeeded(2)
        assert state.offset_to_commit() == 5
        state.commit_sent(5, "")
        state.commit_acknowledged(5, "", ok=True)
        assert not state.dirty
        state.read_to(5)  # the same position again changes nothing
        assert not state.dirty

    def test_records_delivered_twice_are_registered_once(self):
        state = PartitionState(TP, 1)
        assert len(state.accept(msgs(0, 1, 2))) == 3
        assert [m.offset() for m in state.accept(msgs(2, 3))] == [3]

    def test_work_finished_during_a_commit_keeps_the_partition_dirty(self):
        state = PartitionState(TP, 1)
        state.accept(msgs(0, 1))
        state.succeeded(0)
        state.commit_sent(1, "")
        state.succeeded(1)  # finished while the commit is in flight
        assert state.commit_acknowledged(1, "", ok=True)
        assert state.committed_offset == 1
        assert state.dirty

    def test_acknowledged_commit_of_current_state_cleans(self):
        state = PartitionState(TP, 1)
        state.accept(msgs(0))
        state.succeeded(0)
        state.commit_sent(1, "")
        assert state.commit_acknowledged(1, None, ok=True)  # callback without metadata
        assert not state.dirty

    def test_failed_commit_keeps_dirty(self):
        state = PartitionState(TP, 1)
        state.accept(msgs(0))
        state.succeeded(0)
        state.commit_sent(1, "")
        assert state.commit_acknowledged(1, "", ok=False)
        assert state.dirty
        assert state.committed_offset is None


class TestShardMap:
    def test_key_order_hands_out_only_the_head_of_each_key(self):
        shards = ShardMap(ProcessingOrder.KEY)
        a0, a1, b0 = item(0, b"a"), item(1, b"a"), item(2, b"b")
        for i in (a0, a1, b0):
            shards.add(i.tp, [i])
        assert shards.take({}) is a0
        assert shards.take({}) is b0
        assert shards.take({}) is None  # a1 waits for a0
        shards.finished(a0)
        assert shards.take({}) is a1

    def test_retry_goes_back_to_the_front_and_blocks_its_key_meanwhile(self):
        shards = ShardMap(ProcessingOrder.KEY)
        a0, a1 = item(0, b"a"), item(1, b"a")
        shards.add(a0.tp, [a0])
        shards.add(a1.tp, [a1])
        assert shards.take({}) is a0
        shards.retry_later(a0)
        assert shards.take({}) is None
        shards.retry_now(a0)
        assert shards.take({}) is a0

    def test_round_robin_across_shards(self):
        shards = ShardMap(ProcessingOrder.UNORDERED)
        tp1 = ("t", 1)
        items0 = [item(o, tp=TP, ordering=ProcessingOrder.UNORDERED) for o in range(3)]
        items1 = [item(o, tp=tp1, ordering=ProcessingOrder.UNORDERED) for o in range(3)]
        for i in items0 + items1:
            shards.add(i.tp, [i])
        taken = [shards.take({}) for _ in range(6)]
        assert [t.tp[1] for t in taken if t] == [0, 1, 0, 1, 0, 1]

    def test_blocked_partition_runs_only_holes_until_unparked(self):
        shards = ShardMap(ProcessingOrder.KEY)
        low, high = item(3, b"a"), item(9, b"b")
        shards.add(low.tp, [low])
        shards.add(high.tp, [high])
        blocked = {TP: 5}
        assert shards.take(blocked) is low
        assert shards.take(blocked) is None
        shards.unpark(TP)
        assert shards.take({}) is high

    def test_a_due_retry_below_the_limit_wakes_a_parked_shard(self):
        # UNORDERED: one shard per partition; the hole 3 fails while 9 waits above the limit
        shards = ShardMap(ProcessingOrder.UNORDERED)
        hole = item(3, ordering=ProcessingOrder.UNORDERED)
        above = item(9, ordering=ProcessingOrder.UNORDERED)
        shards.add(TP, [hole, above])
        blocked = {TP: 5}
        assert shards.take(blocked) is hole
        shards.retry_later(hole)
        assert shards.take(blocked) is None  # 9 is above the limit: the shard parks
        shards.retry_now(hole)
        assert shards.take(blocked) is hole

    def test_empty_shards_are_dropped_and_revoke_forgets_waiting(self):
        shards = ShardMap(ProcessingOrder.KEY)
        a0 = item(0, b"a")
        shards.add(a0.tp, [a0])
        shards.add(TP, [item(1, b"b")])
        taken = shards.take({})
        assert taken is not None
        shards.finished(taken)
        assert len(shards) == 1
        assert shards.remove_partition(TP) == 1
        assert shards.waiting == 0
        assert shards.take({}) is None


class TestBackpressure:
    def test_pause_at_cap_while_crowding_and_resume_only_at_half(self):
        assigned = {("t", 0), ("t", 1)}
        waiting = {("t", 0): 100, ("t", 1): 10}
        assert partitions_to_pause(waiting, assigned, set(), 100, crowding=False) == set()
        paused = partitions_to_pause(waiting, assigned, set(), 100, crowding=True)
        assert paused == {("t", 0)}
        # between half and cap a paused partition stays paused, crowding or not
        waiting[("t", 0)] = 60
        assert partitions_to_pause(waiting, assigned, paused, 100, crowding=False) == {("t", 0)}
        waiting[("t", 0)] = 50
        assert partitions_to_pause(waiting, assigned, paused, 100, crowding=True) == set()

    def test_partition_cap_is_a_fair_share_but_at_least_one_fetch(self):
        assert partition_cap(10_000, 4, 500) == 2500
        assert partition_cap(10_000, 100, 500) == 500
        assert partition_cap(300, 100, 500) == 300
