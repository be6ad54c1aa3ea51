"""The ``asyncio`` peer (async calls on a bare event loop, a task per lane): its lanes keep
each row's ordering, and it runs no more calls at once than the row allows."""

from __future__ import annotations

import asyncio
import time

import pytest

from parallel_consumer.bench.contestants import CONTESTANTS
from parallel_consumer.bench.contestants import asyncio_floor as floor
from parallel_consumer.bench.contestants.base import LogRecorder
from parallel_consumer.bench.measure import order_kept
from parallel_consumer.bench.model import DataSet, Row, Work
from parallel_consumer.bench.workloads import WORKLOADS

# Two partitions, read partition by partition (as read_records returns them).
RECORDS = [(0, b"a", 0), (0, b"b", 1), (0, b"a", 2), (1, b"a", 0), (1, b"c", 1), (1, b"a", 2)]


def row(ordering: str, concurrency: int, records: int = 6) -> Row:
    return Row(
        workload="T",
        label=ordering,
        data=DataSet(records=records, partitions=2, keys=3),
        ordering=ordering,  # type: ignore[arg-type]
        concurrency=concurrency,
        work=Work("async_sleep", 5),
        async_handler=True,
    )


def test_key_lanes_are_a_partitions_key_in_offset_order():
    lanes = floor.lanes_in_order(RECORDS, "KEY")
    assert sorted(lanes) == sorted(
        [
            [(0, b"a", 0), (0, b"a", 2)],
            [(0, b"b", 1)],
            [(1, b"a", 0), (1, b"a", 2)],
            [(1, b"c", 1)],
        ]
    )
    # the lanes start in the order a consumer fetching both partitions sees their records
    assert [lane[0] for lane in lanes] == [(0, b"a", 0), (1, b"a", 0), (0, b"b", 1), (1, b"c", 1)]


def test_partition_lanes_and_unordered_lanes():
    assert floor.lanes_in_order(RECORDS, "PARTITION") == [RECORDS[:3], RECORDS[3:]]
    unordered = floor.lanes_in_order(RECORDS, "UNORDERED")
    assert all(len(lane) == 1 for lane in unordered)
    assert sorted(lane[0] for lane in unordered) == sorted(RECORDS)


@pytest.mark.parametrize("ordering", ["KEY", "PARTITION", "UNORDERED"])
def test_every_record_runs_once_in_order_and_never_more_than_c_at_once(ordering, monkeypatch):
    # Given a handler that counts the calls in flight
    in_flight = peak = 0

    def counting_work(_work: object):
        async def work() -> None:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.005)
            in_flight -= 1

        return work

    monkeypatch.setattr(floor, "async_work", counting_work)
    records = [(p, b"k%d" % (o % 5), o) for p in range(2) for o in range(40)]
    lanes = floor.lanes_in_order(records, ordering)
    recorder = LogRecorder(len(records))

    # When the floor runs them, 3 at once
    finished = asyncio.run(floor._run(lanes, row(ordering, 3, len(records)), recorder))

    # Then each ran once, each lane in order, and never more than 3 at once (PARTITION: 2 lanes)
    log = recorder.log
    assert sorted((p, o) for p, _, o, _ in log) == sorted((p, o) for p, _, o in records)
    assert order_kept(log, ordering)
    assert peak == min(3, len(lanes))
    assert recorder.first_call is not None
    assert recorder.first_call <= finished <= time.time()


def test_it_runs_the_async_rows_and_says_why_not_the_others():
    contestant = CONTESTANTS["asyncio"]
    for workload in WORKLOADS.values():
        for r in workload.rows("tiny"):
            reason = contestant.unsupported(r)
            if r.async_handler and r.runner.get("loop_factory") != "uvloop":
                assert reason is None, r.name
            elif not r.async_handler:
                assert reason is not None, r.name
                assert "async rows only" in reason, r.name


def test_a_failing_call_ends_the_run_with_its_error_at_once(monkeypatch):
    # Given work that fails on its third call (a fault of the harness, not of a contestant)
    calls = 0

    def failing_work(_work: object):
        async def work() -> None:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise RuntimeError("boom")
            await asyncio.sleep(0.001)

        return work

    monkeypatch.setattr(floor, "async_work", failing_work)
    records = [(0, b"k%d" % o, o) for o in range(50)]
    lanes = floor.lanes_in_order(records, "UNORDERED")

    # When the floor runs them, the run ends with that error rather than waiting for its timeout
    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(
            asyncio.wait_for(floor._run(lanes, row("UNORDERED", 2, 50), LogRecorder(50)), 5)
        )


def test_lanes_keep_offset_order_whatever_order_the_records_come_in():
    shuffled = [RECORDS[i] for i in (5, 2, 3, 0, 4, 1)]
    assert floor.lanes_in_order(shuffled, "KEY") == floor.lanes_in_order(RECORDS, "KEY")
    assert floor.lanes_in_order(shuffled, "PARTITION") == [RECORDS[:3], RECORDS[3:]]


def test_a_rows_loop_is_asyncios_or_uvloops_and_nothing_else():
    from parallel_consumer.bench.work import loop_factory

    (plain, on_uvloop) = [
        r for r in WORKLOADS["W6"].rows("tiny") if r.label.startswith("UNORDERED")
    ]
    assert loop_factory(plain) is None
    odd = Row(**{**on_uvloop.__dict__, "runner": {"loop_factory": "trio"}})
    with pytest.raises(ValueError, match="unknown loop_factory 'trio'"):
        loop_factory(odd)
    uvloop = pytest.importorskip("uvloop")
    assert loop_factory(on_uvloop) is uvloop.new_event_loop
