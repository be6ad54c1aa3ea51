"""LaneStream: lanes that keep running across fed batches (the Spark task's inner loop)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from parallel_consumer import DeadLetter, Options, PollContext, ProducerRecord, RetriesExhausted
from parallel_consumer.spark._core import InputRecord
from parallel_consumer.spark._lanes import LaneStream


def record(offset: int, key: str, partition: int = 0) -> InputRecord:
    return InputRecord("in", partition, offset, key.encode(), str(offset).encode())


def echo(ctx: PollContext) -> ProducerRecord:
    return ProducerRecord("out", ctx.value, ctx.key)


def test_a_lane_goes_on_across_batches_in_offset_order() -> None:
    # Given a handler that holds key "a"'s first record until the second batch was fed
    fed = threading.Event()
    seen: list[int] = []

    def handler(ctx: PollContext) -> ProducerRecord:
        if ctx.offset == 0:
            assert fed.wait(10)
        seen.append(ctx.offset)
        return echo(ctx)

    with ThreadPoolExecutor(4) as pool:
        stream = LaneStream(handler, Options(), "g", pool)
        # When two batches of the same key are fed while its first record still runs
        stream.feed([record(0, "a"), record(1, "b")])
        stream.feed([record(2, "a"), record(3, "a")])
        fed.set()
        rows, tallies = stream.finish()
        stream.close()
    # Then key "a" ran 0, 2, 3 in that order, and every row came out once
    assert [o for o in seen if o != 1] == [0, 2, 3]
    assert sorted(r.source_offset for r in rows) == [0, 1, 2, 3]
    assert [r.source_offset for r in rows if r.key == b"a"] == [0, 2, 3]
    assert tallies[("in", 0)].inputs == 4


def test_take_returns_finished_rows_once() -> None:
    with ThreadPoolExecutor(2) as pool:
        stream = LaneStream(echo, Options(), "g", pool)
        stream.feed([record(i, f"k{i % 2}") for i in range(10)])
        rows, _ = stream.finish()
        assert len(rows) == 10
        assert stream.take() == []
        stream.close()


def test_a_stop_surfaces_from_finish_and_stops_the_other_lanes() -> None:
    calls: list[int] = []

    def handler(ctx: PollContext) -> None:
        calls.append(ctx.offset)
        if ctx.offset == 0:
            raise DeadLetter("no dead-letter topic: a stop")

    with ThreadPoolExecutor(1) as pool:  # one worker: lane "b" runs after "a" stopped
        stream = LaneStream(handler, Options(), "g", pool)
        stream.feed([record(0, "a"), record(1, "b"), record(2, "b")])
        with pytest.raises(RetriesExhausted):
            stream.finish()
        stream.close()
    assert calls == [0]
