"""Pure work state: partition bookkeeping, shards and pause decisions (no threads)."""

from __future__ import annotations

from confluent_kafka import Message

from parallel_consumer.options import ProcessingOrder
from parallel_consumer.work.backpressure import partition_cap, partitions_to_pause
from parallel_consumer.work.commit_tracker import CommitAnswer, CommitTracker, OffsetCommit
from parallel_consumer.work.item import WorkItem
from parallel_consumer.work.lanes import shard_key_for
from parallel_consumer.work.partitions import PartitionState
from parallel_consumer.work.shards import ShardMap

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
        state.acknowledged(5, state.version)
        assert not state.dirty
        state.read_to(5)  # the same position again changes nothing
        assert not state.dirty

    def test_records_delivered_twice_are_registered_once(self):
        state = PartitionState(TP, 1)
        assert len(state.accept(msgs(0, 1, 2))) == 3
        assert [m.offset() for m in state.accept(msgs(2, 3))] == [3]

    def test_restored_offsets_compacted_away_between_two_batches_are_forgotten(self):
        # Given a restored map {2, 5} and record 5 deleted by compaction
        state = PartitionState(
            TP, 1, committed_offset=2, restored_incomplete=[2, 5], restored_highest=6
        )
        # When the batches are [2, 3, 4] and [6, 7, 8] (5 falls between them)
        state.accept(msgs(2, 3, 4))
        state.succeeded(2)
        state.accept(msgs(6, 7, 8))
        for offset in (7, 8):
            state.succeeded(offset)
        # Then 5 is no longer unfinished: the commit moves past it
        assert list(state.incomplete) == []
        assert state.offset_to_commit() == 9

    def test_restored_offsets_the_client_read_past_are_forgotten(self):
        # Given a restored map {2, 5}; record 5 and everything after it were deleted
        state = PartitionState(
            TP, 1, committed_offset=2, restored_incomplete=[2, 5], restored_highest=6
        )
        state.accept(msgs(2, 3))
        state.succeeded(2)
        # When the client reports having read up to 7 without delivering 5
        state.read_to(7)
        # Then the commit can reach the read position
        assert state.offset_to_commit() == 7


class TestCommitTracker:
    def _finished(self, *offsets: int, epoch: int = 1) -> PartitionState:
        state = PartitionState(TP, epoch)
        state.accept(msgs(*offsets))
        for offset in offsets:
            state.succeeded(offset)
        return state

    def test_work_finished_during_a_commit_keeps_the_partition_dirty(self):
        state = PartitionState(TP, 1)
        state.accept(msgs(0, 1))
        state.succeeded(0)
        tracker = CommitTracker(4096)
        [commit] = tracker.due([state], now=0.0)
        state.succeeded(1)  # finished while the commit is in flight
        assert tracker.answered(state, CommitAnswer(commit))
        assert state.committed_offset == 1
        assert state.dirty

    def test_acknowledged_commit_of_current_state_cleans(self):
        state = self._finished(0)
        tracker = CommitTracker(4096)
        [commit] = tracker.due([state], now=0.0)
        assert commit == OffsetCommit(TP, 1, 1, "")
        assert tracker.answered(state, CommitAnswer(commit))
        assert not state.dirty
        assert not tracker.has_pending()

    def test_failed_commit_keeps_dirty(self):
        state = self._finished(0)
        tracker = CommitTracker(4096)
        [commit] = tracker.due([state], now=0.0)
        assert tracker.answered(state, CommitAnswer(commit, "timed out"))
        assert state.dirty
        assert state.committed_offset is None

    def test_an_answer_for_an_older_epoch_never_matches(self):
        # Given the same offset committed in epoch 1, then again after a reassignment (epoch 2)
        tracker = CommitTracker(4096)
        old = self._finished(0, epoch=1)
        [old_commit] = tracker.due([old], now=0.0)
        tracker.forget(TP)
        new = self._finished(0, epoch=2)
        [new_commit] = tracker.due([new], now=0.0)
        # When the old epoch's answer arrives
        matched = tracker.answered(new, CommitAnswer(old_commit))
        # Then it does not clean the new assignment
        assert not matched
        assert new.dirty
        assert tracker.has_pending(TP)
        assert tracker.answered(new, CommitAnswer(new_commit))

    def test_the_same_commit_is_not_sent_twice_while_pending(self):
        state = self._finished(0)
        tracker = CommitTracker(4096)
        assert len(tracker.due([state], now=0.0)) == 1
        assert tracker.due([state], now=1.0) == []
        assert len(tracker.due([state], now=1.0, final=True)) == 1

    def test_a_large_map_blocks_until_the_holes_finish(self):
        # Given every other offset of 0..400 finished: a map too large for 16 bytes
        state = PartitionState(TP, 1)
        state.accept(msgs(*range(400)))
        for offset in range(1, 400, 2):
            state.succeeded(offset)
        tracker = CommitTracker(16)
        tracker.plan(state)
        assert TP in tracker.blocked
        # When the holes finish
        for offset in range(0, 400, 2):
            state.succeeded(offset)
            tracker.after_success(state)
        # Then the partition is unblocked, once
        assert TP not in tracker.blocked
        assert TP in tracker.take_to_unpark()
        assert tracker.take_to_unpark() == []


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

    def test_a_chain_takes_the_records_behind_the_head_and_holds_the_lane(self):
        shards = ShardMap(ProcessingOrder.KEY)
        a = [item(o, b"a") for o in (0, 2, 4, 6)]
        b0 = item(1, b"b")
        shards.add(TP, [a[0], b0, a[1], a[2], a[3]])
        head = shards.take({})
        assert head is a[0]
        # up to `most` records behind it, of its lane only, in order
        assert shards.take_following(head, 2, {}) == [a[1], a[2]]
        assert shards.waiting == 2  # (b0 and a[3])
        assert shards.take({}) is b0
        assert shards.take({}) is None  # lane a is held by the chain
        # finishing the head does not free the lane while the chain holds records of it
        shards.finished(a[0])
        assert shards.take({}) is None
        shards.finished(a[1])
        shards.finished(a[2])
        assert shards.take({}) is a[3]

    def test_a_chain_stops_at_a_blocked_partitions_limit(self):
        shards = ShardMap(ProcessingOrder.PARTITION)
        records = [item(o, None, ordering=ProcessingOrder.PARTITION) for o in range(5)]
        shards.add(TP, records)
        head = shards.take({})
        assert shards.take_following(head, 10, {TP: 3}) == records[1:3]
        assert shards.take_following(head, 10, {}) == records[3:]
        assert ShardMap(ProcessingOrder.UNORDERED).take_following(head, 3, {}) == []

    def test_records_put_back_go_behind_the_failed_one_in_lane_order(self):
        # Given a chain a0, a1, a2 whose first call failed; a3 waits in the lane
        shards = ShardMap(ProcessingOrder.KEY)
        a = [item(o, b"a") for o in range(4)]
        shards.add(TP, a)
        head = shards.take({})
        chain = shards.take_following(head, 2, {})
        shards.retry_later(head)  # (the failed record waits for its retry)
        # When the records it never started are put back
        shards.put_back(chain)
        # Then the lane waits for the retry, and then runs a0, a1, a2, a3 in order
        assert shards.waiting == 3
        assert shards.take({}) is None
        shards.retry_now(head)
        order = []
        while (next_ := shards.take({})) is not None:
            order.append(next_)
            shards.finished(next_)
        assert order == a

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

    def test_unordered_retries_go_back_in_offset_order_so_holes_are_not_parked(self):
        # Given UNORDERED records 10, 20 and 95 that all ran and failed
        shards = ShardMap(ProcessingOrder.UNORDERED)
        hole10, hole20, high = (item(o, ordering=ProcessingOrder.UNORDERED) for o in (10, 20, 95))
        shards.add(TP, [hole10, hole20, high])
        for i in (hole10, hole20, high):
            assert shards.take({}) is i
            shards.retry_later(i)
        # And the holes are due first, while the workers are busy, then 95
        shards.retry_now(hole20)
        shards.retry_now(hole10)
        shards.retry_now(high)
        # When the partition is blocked with limit 50
        blocked = {TP: 50}
        # Then the holes still run (95 must not head the queue and park it), then 95 parks
        assert [shards.take(blocked), shards.take(blocked)] == [hole10, hole20]
        assert shards.take(blocked) is None

    def test_unordered_retries_due_in_any_order_run_in_offset_order(self):
        shards = ShardMap(ProcessingOrder.UNORDERED)
        a, b, c = (item(o, ordering=ProcessingOrder.UNORDERED) for o in (1, 2, 3))
        shards.add(TP, [a, b, c])
        assert [shards.take({}) for _ in range(2)] == [a, b]
        shards.retry_later(a)
        shards.retry_later(b)
        shards.retry_now(a)  # a is due first, b later
        shards.retry_now(b)
        assert [shards.take({}) for _ in range(3)] == [a, b, c]

    def test_a_lane_held_by_a_stale_call_waits_for_it_and_is_dropped_when_empty(self):
        # Given key a's call of an earlier assignment still running after a revoke
        shards = ShardMap(ProcessingOrder.KEY)
        old = item(0, b"a")
        shards.add(TP, [old])
        assert shards.take({}) is old
        shards.remove_partition(TP)
        shards.hold_for_stale(old)
        # When the partition's new assignment brings record 0 of key a again
        new = item(0, b"a")
        shards.add(TP, [new])
        # Then it waits for the stale call, runs after it, and the lane is dropped once empty
        assert shards.take({}) is None
        shards.stale_done(old)
        assert shards.take({}) is new
        shards.finished(new)
        assert len(shards) == 0

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


class TestChains:
    def test_a_chain_holds_one_worker_and_its_partitions_backlog_until_its_calls_are_over(self):
        from parallel_consumer.work.chains import Chains

        chains = Chains()
        chains.start([(7, (TP,)), (8, (TP,)), (9, (TP,))])
        assert (chains.extra, chains.by_tp, 8 in chains) == (2, {TP: 3}, True)
        # The first call ends at 1.0: it began at the hand-out (None); the next began at 1.0
        assert chains.ended(7, 1.0) is None
        assert chains.ended(8, 1.5) == 1.0
        assert (chains.extra, chains.by_tp) == (0, {TP: 1})
        # The last one comes back unstarted: nothing of the chain is left
        chains.over(9)
        assert (chains.extra, chains.by_tp, bool(chains)) == (0, {}, False)
        assert chains.ended(9, 2.0) is None  # (no longer a chain's call)


class TestSpareLanes:
    """KEY order with many keys makes and drops a lane per record; dropped lanes are reused."""

    def test_a_lane_made_from_a_dropped_one_starts_afresh(self):
        shards = ShardMap(ProcessingOrder.KEY)
        first = item(0, b"a")
        shards.add(TP, [first])
        assert shards.take({}) is first
        dropped = shards._shards[first.shard_key]
        dropped.passed = 5
        shards.finished(first)  # lane a is dropped, and kept
        # Lane b is held (its outputs are on their way) before it exists
        second = item(1, b"b")
        shards.hold([second.shard_key])
        shards.add(TP, [second])
        lane = shards._shards[second.shard_key]
        assert lane is dropped
        assert (lane.key, lane.busy, lane.passed, lane.removed) == (second.shard_key, 1, 0, False)
        assert shards.take({}) is None  # held
        shards.release([second.shard_key])
        assert shards.take({}) is second

    def test_a_lane_dropped_while_in_the_ready_queue_is_not_reused(self):
        shards = ShardMap(ProcessingOrder.KEY)
        waiting = item(0, b"a")
        shards.add(TP, [waiting])  # lane a is in the ready queue
        assert shards.take_idle(waiting.shard_key) == [waiting]  # dropped while still there
        [stale] = shards._ready
        assert stale.removed
        assert not shards._spare
        second = item(1, b"b")
        shards.add(TP, [second])
        assert shards._shards[second.shard_key] is not stale
        assert shards.take({}) is second
        assert shards.take({}) is None


class TestCommitTrackerSpill:
    def _holes(self, tracker: CommitTracker) -> PartitionState:
        # every other offset of 0..400 finished: a map too large for 16 bytes
        state = PartitionState(TP, 1)
        state.accept(msgs(*range(400)))
        for offset in range(1, 400, 2):
            state.succeeded(offset)
        return state

    def test_a_map_over_the_limit_spills_and_never_blocks_the_partition(self):
        tracker = CommitTracker(16, spill=True)
        state = self._holes(tracker)
        [commit] = tracker.due([state], now=0.0)
        assert commit.spill
        assert commit.offset == 0
        assert len(commit.metadata) > 16
        assert TP not in tracker.blocked
        assert tracker.metadata(TP)[1] == "spill"

    def test_without_spilling_the_same_map_blocks_and_commits_no_metadata(self):
        tracker = CommitTracker(16)
        state = self._holes(tracker)
        [commit] = tracker.due([state], now=0.0)
        assert not commit.spill
        assert commit.metadata == ""
        assert TP in tracker.blocked

    def test_a_map_that_fits_is_the_same_commit_with_or_without_spilling(self):
        state = PartitionState(TP, 1)
        state.accept(msgs(0, 1, 2))
        state.succeeded(2)
        [spilling] = CommitTracker(4096, spill=True).due([state], now=0.0)
        [inline] = CommitTracker(4096).due([state], now=0.0)
        assert spilling == inline
        assert not inline.spill
        assert inline.metadata
