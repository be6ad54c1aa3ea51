"""ShardMap.take_longest: the longest lanes first, without starving short lanes or breaking
lane order (docs/performance.md#longest-lanes-first)."""

from __future__ import annotations

from collections import defaultdict

from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_consumer.options import ProcessingOrder
from parallel_consumer.work.item import WorkItem
from parallel_consumer.work.lanes import shard_key_for
from parallel_consumer.work.shards import PASSED_MOST, ShardMap

TP = ("t", 0)


def item(offset: int, key: bytes, tp=TP, ordering=ProcessingOrder.KEY) -> WorkItem:
    message = Message(topic=tp[0], partition=tp[1], offset=offset, key=key)
    return WorkItem(message, tp, shard_key_for(ordering, tp, key), epoch=1)


def lanes(shards: ShardMap, sizes: dict[bytes, int]) -> dict[bytes, list[WorkItem]]:
    """Records of each key (offsets interleaved round-robin across keys), added in order."""
    out: dict[bytes, list[WorkItem]] = defaultdict(list)
    offset = 0
    for round_ in range(max(sizes.values())):
        for key, size in sizes.items():
            if round_ < size:
                out[key].append(item(offset, key))
                offset += 1
    every = sorted((i for items in out.values() for i in items), key=lambda i: i.offset)
    shards.add(TP, every)
    return out


def test_the_lane_with_most_records_waiting_goes_first():
    shards = ShardMap(ProcessingOrder.KEY)
    by_key = lanes(shards, {b"short": 1, b"long": 5, b"mid": 3})
    first = shards.take_longest({})
    assert first is by_key[b"long"][0]
    assert shards.take_longest({}) is by_key[b"mid"][0]
    assert shards.take_longest({}) is by_key[b"short"][0]
    assert shards.take_longest({}) is None  # every lane is busy
    # the long lane ends its call: it is again the longest
    shards.finished(first)
    assert shards.take_longest({}) is by_key[b"long"][1]


def test_unordered_takes_as_take_does():
    shards = ShardMap(ProcessingOrder.UNORDERED)
    a = [item(o, b"a", ordering=ProcessingOrder.UNORDERED) for o in range(3)]
    shards.add(TP, a)
    assert [shards.take_longest({}) for _ in range(4)] == [*a, None]


def test_a_short_lane_waits_at_most_passed_most_turns_each_time():
    # Given a short lane behind long lanes that never run out (their calls end at once)
    shards = ShardMap(ProcessingOrder.KEY)
    sizes = {b"long-1": 1000, b"long-2": 1000, b"short": 2}
    by_key = lanes(shards, sizes)

    def turns_until(record: WorkItem) -> int:
        turns = 0
        while (taken := shards.take_longest({})) is not record:
            assert taken is not None
            shards.finished(taken)
            turns += 1
        shards.finished(record)
        return turns

    # When lanes are taken longest first, each call ending before the next take
    first, second = by_key[b"short"]
    # Then the short lane runs within PASSED_MOST turns, though longer lanes always wait...
    assert 0 < turns_until(first) <= PASSED_MOST
    # ... and its wait starts over once it ran (it does not jump the queue for good)
    assert 0 < turns_until(second) <= PASSED_MOST


def test_a_lane_held_by_a_stale_call_is_not_taken():
    # Given lane a of a re-assigned partition, whose call of the old assignment still runs
    shards = ShardMap(ProcessingOrder.KEY)
    old = item(0, b"a")
    shards.add(TP, [old])
    assert shards.take_longest({}) is old
    shards.remove_partition(TP)
    fresh = [item(0, b"a"), item(1, b"a")]
    shards.add(TP, fresh)  # (lane a is ready again: a new lane of the new assignment)
    shards.hold_for_stale(old)
    # Then the lane waits for the stale call
    assert shards.take_longest({}) is None
    shards.stale_done(old)
    assert shards.take_longest({}) is fresh[0]


def test_a_blocked_partitions_lanes_park_and_return_once_unparked():
    shards = ShardMap(ProcessingOrder.KEY)
    low, high = item(3, b"a"), item(9, b"b")
    high_next = item(10, b"b")
    shards.add(TP, [low, high, high_next])
    # b is the longest, but its head is above the limit: parked; a's head is a hole below it
    assert shards.take_longest({TP: 5}) is low
    assert shards.take_longest({TP: 5}) is None
    shards.unpark(TP)
    assert shards.take_longest({}) is high


def test_removed_and_emptied_lanes_are_skipped():
    shards = ShardMap(ProcessingOrder.KEY)
    a0 = item(0, b"a")
    shards.add(TP, [a0])
    shards.remove_partition(TP)
    other = ("t", 1)
    b0 = item(0, b"b", tp=other)
    shards.add(other, [b0])
    assert shards.take_longest({}) is b0
    assert shards.take_longest({}) is None
    assert shards.waiting == 0


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=40),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 10**6)), max_size=400),
)
def test_every_record_runs_once_in_lane_order_one_at_a_time_per_lane(sizes, steps):
    """Any interleaving of takes (longest first, or plain round-robin) and call ends: no lane
    has two records out, each lane runs in offset order, and every record runs exactly once."""
    shards = ShardMap(ProcessingOrder.KEY)
    by_key = lanes(shards, {f"k{i}".encode(): size for i, size in enumerate(sizes)})
    total = sum(sizes)
    out: list[WorkItem] = []
    ran: dict[object, list[int]] = defaultdict(list)

    def take(longest: bool) -> None:
        taken = shards.take_longest({}) if longest else shards.take({})
        if taken is None:
            return
        assert all(o.shard_key != taken.shard_key for o in out), "two records of a lane out"
        ran[taken.shard_key].append(taken.offset)
        out.append(taken)

    for longest, pick in steps:
        if out and pick % 3 == 0:
            shards.finished(out.pop(pick % len(out)))
        else:
            take(longest)
    # drain: whatever the interleaving left, everything still runs
    while out or shards.waiting:
        take(True)
        if out:
            shards.finished(out.pop(0))
    assert sum(len(offsets) for offsets in ran.values()) == total
    for key, items in by_key.items():
        lane = items[0].shard_key
        assert ran[lane] == [i.offset for i in items], key
    assert shards.waiting == 0
    assert len(shards) == 0


# -- the controller: a choice is left to make --------------------------------------------------


def _stepped_key_controller(keys: int, per_key: int):
    from doubles import ChainTaker, stepped_controller

    from parallel_consumer import Options
    from parallel_consumer._events import RecordsPolled
    from parallel_consumer.testing.clock import FakeClock

    class Runner(ChainTaker):
        capacity = 16
        backlog = 4

    runner = Runner()
    options = Options(ordering=ProcessingOrder.KEY, max_concurrency=16, commit_interval=1000)
    controller = stepped_controller(FakeClock(), options=options, runner=runner)
    controller.dispatch.observe_service(0.002)  # calls of 2 ms: chains, and the longest lanes first
    messages = [
        Message(topic="t", partition=0, offset=o, key=b"k%d" % (o % keys))
        for o in range(keys * per_key)
    ]
    controller.post(RecordsPolled({TP: (1, messages)}))
    controller.run_once(block=False)
    return controller, runner


def test_with_about_as_many_lanes_as_call_slots_two_backlog_slots_stay_unused():
    """W1 KEY-20: 20 lanes for 16 workers and 4 backlog slots. With every slot used, every lane
    not running sits in the runner's queue and the next lane is never chosen: lanes run
    round-robin. The engine keeps the backlog to LONGEST_FIRST_BACKLOG (2) there, so that two
    lanes wait where the controller can still choose between them."""
    controller, runner = _stepped_key_controller(keys=20, per_key=50)
    handed = len(runner.chains) + len(runner.singles)
    assert handed == 16 + 2
    assert controller.ledger.shards.has_ready()


def test_with_many_more_lanes_than_call_slots_the_whole_backlog_is_used():
    _, runner = _stepped_key_controller(keys=200, per_key=3)
    assert len(runner.chains) + len(runner.singles) == 16 + 4
