"""The pure per-partition progress watch and the deadline table: no threads, no clock but the
numbers the tests pass in (the watch's model-based property is in tests/property)."""

from __future__ import annotations

from parallel_consumer.work.deadlines import Deadlines
from parallel_consumer.work.progress import ProgressWatch

TP = ("t", 0)


def _observe(watch, now, lowest, committed=None, epoch=1, tp=TP):
    return watch.observe(tp, epoch=epoch, lowest=lowest, committed=committed, now=now)


def test_a_record_holding_the_partition_is_reported_at_the_threshold_once():
    watch = ProgressWatch(10)
    assert _observe(watch, 0, 5) is None
    assert watch.wake_at() == 10
    assert _observe(watch, 9.99, 5) is None
    stall = _observe(watch, 10, 5)
    assert stall is not None
    assert (stall.tp, stall.offset, stall.stalled_for) == (TP, 5, 10)
    assert watch.stalled() == [TP]
    assert _observe(watch, 100, 5) is None  # once per episode
    assert watch.wake_at() is None


def test_a_moving_commit_restarts_the_clock():
    watch = ProgressWatch(10)
    _observe(watch, 0, 5, committed=3)
    assert _observe(watch, 8, 5, committed=5) is None  # records below 5 were committed
    assert _observe(watch, 17.9, 5, committed=5) is None
    assert _observe(watch, 18, 5, committed=5) is not None


def test_the_lowest_unfinished_offset_moving_ends_the_episode():
    watch = ProgressWatch(10)
    _observe(watch, 0, 5)
    assert _observe(watch, 10, 5) is not None
    assert _observe(watch, 11, 6) is None
    assert watch.stalled() == []
    assert _observe(watch, 21, 6) is not None


def test_nothing_unfinished_never_stalls_and_none_disables():
    watch = ProgressWatch(10)
    _observe(watch, 0, None)
    assert _observe(watch, 1000, None) is None
    assert not watch.watching
    off = ProgressWatch(None)
    _observe(off, 0, 5)
    assert _observe(off, 1000, 5) is None
    assert off.wake_at() is None
    assert off.track(TP).lowest_since == 0


def test_a_new_epoch_or_a_restart_starts_again():
    watch = ProgressWatch(10)
    _observe(watch, 0, 5)
    assert _observe(watch, 9, 5, epoch=2) is None  # reassigned: a new track
    assert _observe(watch, 18, 5, epoch=2) is None
    watch.restart_all(18)
    assert _observe(watch, 27, 5, epoch=2) is None
    assert _observe(watch, 28, 5, epoch=2) is not None
    watch.forget(TP)
    assert watch.track(TP) is None


def test_deadlines_expire_in_order_and_late_results_are_recognised():
    deadlines = Deadlines()
    deadlines.started(1, 10)
    deadlines.started(2, 5)
    deadlines.started(3, 20)
    assert deadlines.next_at() == 5
    assert deadlines.expired(4.9) == []
    assert deadlines.expired(10) == [2, 1]
    assert deadlines.overruns == 2
    assert deadlines.ended(2) is True  # a late result
    assert deadlines.ended(3) is False  # an ordinary result
    assert deadlines.overruns == 1
    assert deadlines.expired(100) == []  # 3 ended in time


def test_extend_moves_a_deadline_later_only_while_watched():
    deadlines = Deadlines()
    deadlines.started(1, 10)
    assert deadlines.extend(1, 5) is True  # never earlier
    assert deadlines.deadline_of(1) == 10
    assert deadlines.extend(1, 30) is True
    assert deadlines.expired(29) == []
    assert deadlines.expired(30) == [1]
    assert deadlines.extend(1, 60) is False  # too late: already abandoned
    assert deadlines.extend(7, 60) is False  # unknown


def test_expire_forget_and_compaction():
    deadlines = Deadlines()
    assert deadlines.expire(9) is True  # a stalled record's call without a deadline
    assert deadlines.expire(9) is False
    deadlines.forget_overrun(9)
    assert deadlines.overruns == 0
    for batch in range(1000):
        deadlines.started(batch, 1000.0 + batch)
        deadlines.ended(batch)
    assert len(deadlines._heap) < 200  # ended calls do not pile up
    assert deadlines.expired(10_000) == []


def test_the_record_holding_a_partition_is_found_in_its_lane_or_the_retry_queue():
    from confluent_kafka import Message

    from parallel_consumer.options import ProcessingOrder
    from parallel_consumer.work.item import WorkItem
    from parallel_consumer.work.retry_queue import RetryQueue
    from parallel_consumer.work.shards import ShardMap

    def item(offset: int, key: bytes) -> WorkItem:
        message = Message(topic="t", partition=0, offset=offset, key=key)
        return WorkItem(message, TP, ("t", 0, key), 1)

    shards = ShardMap(ProcessingOrder.KEY)
    waiting = [item(3, b"a"), item(4, b"b")]
    shards.add(TP, waiting)
    assert shards.find(TP, 4) is waiting[1]
    assert shards.find(TP, 5) is None
    assert shards.find(("t", 1), 3) is None
    retries = RetryQueue()
    failed = item(1, b"c")
    retries.push(failed, 10.0)
    assert retries.find(TP, 1) is failed
    assert retries.find(TP, 3) is None
