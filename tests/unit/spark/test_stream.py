"""LaneStream: lanes that keep running across fed batches (the Spark task's inner loop)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from parallel_consumer import OnExhausted, Options, PollContext, ProducerRecord, RetriesExhausted
from parallel_consumer.spark._arrow import KIND_OUTPUT, map_function
from parallel_consumer.spark._records import InputRecord
from parallel_consumer.spark._stream import LaneStream


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
            raise KeyError("non-retryable, and the policy is STOP: a stop")

    options = Options(non_retryable=(KeyError,), on_retries_exhausted=OnExhausted.STOP)
    with ThreadPoolExecutor(1) as pool:  # one worker: lane "b" runs after "a" stopped
        stream = LaneStream(handler, options, "g", pool)
        stream.feed([record(0, "a"), record(1, "b"), record(2, "b")])
        with pytest.raises(RetriesExhausted):
            stream.finish()
        stream.close()
    assert calls == [0]


def test_wait_idle_says_whether_every_lane_is_done() -> None:
    release = threading.Event()

    def handler(ctx: PollContext) -> ProducerRecord:
        if ctx.key == b"slow":
            assert release.wait(10)
        return echo(ctx)

    with ThreadPoolExecutor(2) as pool:
        stream = LaneStream(handler, Options(), "g", pool)
        stream.feed([record(0, "slow"), record(1, "fast")])
        # While one lane still runs, wait_idle times out
        assert stream.wait_idle(0.05) is False
        release.set()
        assert stream.wait_idle(10) is True
        rows, _ = stream.finish()
        stream.close()
    assert sorted(r.source_offset for r in rows) == [0, 1]


def _input_batch(records: list[InputRecord]) -> Any:
    import pyarrow as pa

    header = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    return pa.RecordBatch.from_pydict(
        {
            "key": [r.key for r in records],
            "value": [r.value for r in records],
            "topic": [r.topic for r in records],
            "partition": [r.partition for r in records],
            "offset": [r.offset for r in records],
            "timestamp_ms": [None for _ in records],
            "timestamp_type": [None for _ in records],
            "headers": [None for _ in records],
        },
        schema=pa.schema(
            [
                ("key", pa.binary()),
                ("value", pa.binary()),
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("offset", pa.int64()),
                ("timestamp_ms", pa.int64()),
                ("timestamp_type", pa.int32()),
                ("headers", header),
            ]
        ),
    )


def test_once_the_input_ends_finished_rows_go_out_while_other_lanes_still_run() -> None:
    pytest.importorskip("pyarrow")
    # Given a task whose input is one batch: "fast" finishes once the input has ended, "slow"
    # only when released
    ended = threading.Event()
    release = threading.Event()

    def handler(ctx: PollContext) -> ProducerRecord:
        assert ended.wait(10)
        if ctx.key == b"slow":
            release.wait(5)
        return echo(ctx)

    def batches() -> Iterator[Any]:
        yield _input_batch([record(0, "slow"), record(1, "fast")])
        ended.set()

    run = map_function(handler, Options(max_concurrency=4), "g")
    # When the task's output is read
    early: list[bytes] = []
    keys: list[bytes] = []
    for batch in run(batches()):
        rows = zip(batch.column("key").to_pylist(), batch.column("kind").to_pylist(), strict=True)
        keys.extend(key for key, kind in rows if kind == KIND_OUTPUT)
        if not release.is_set():
            early.extend(keys)
            release.set()
    # Then "fast"'s row came out while "slow" was still running, and "slow"'s after it
    assert early == [b"fast"]
    assert keys == [b"fast", b"slow"]
