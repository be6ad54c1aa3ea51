"""The PySpark runner's core without Spark: lanes, order, concurrency, retries, dead letters.

No JVM and no pyspark: ``parallel_consumer.spark._core`` is plain Python. Retry delays go to a
recording ``sleep`` (no time passes); concurrency is proven with a barrier, not with timing.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import defaultdict
from typing import Any

import pytest

from parallel_consumer import (
    ConfigurationError,
    DeadLetter,
    OnExhausted,
    Options,
    PollContext,
    ProducerRecord,
    RetriesExhausted,
    Retry,
    Skip,
)
from parallel_consumer.dead_letter import Reason, read_dead_letter
from parallel_consumer.errors import InvalidOutput
from parallel_consumer.spark._core import SOURCE_ID, InputRecord, OutputRow, process


def records(n: int, keys: int, *, topic: str = "in", partition: int = 0) -> list[InputRecord]:
    return [
        InputRecord(
            topic,
            partition,
            offset,
            f"k{offset % keys}".encode(),
            f"v{offset}".encode(),
            1_700_000_000_000 + offset,
            1,
            (("h", b"x"),),
        )
        for offset in range(n)
    ]


def echo(ctx: PollContext) -> ProducerRecord:
    return ProducerRecord("out", ctx.value, ctx.key)


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, seconds: float) -> None:
        with self._lock:
            self.delays.append(seconds)


def outputs(rows: list[OutputRow]) -> list[OutputRow]:
    return [row for row in rows if not row.dead_letter]


def header(row: OutputRow, name: str) -> bytes | None:
    return dict(row.headers)[name]


def test_every_record_gives_its_output_with_a_source_id() -> None:
    # Given 50 records of 5 keys in one partition
    # When an echo handler runs over them
    result = process(records(50, 5), echo, Options(max_concurrency=4))
    # Then each input has one output, tagged with where it came from
    assert len(result.rows) == 50
    ids = {header(row, SOURCE_ID) for row in result.rows}
    assert ids == {f"in/0@{offset}/0".encode() for offset in range(50)}
    tally = result.partitions[("in", 0)]
    assert (tally.inputs, tally.outputs, tally.first_offset, tally.last_offset) == (50, 50, 0, 49)


def test_outputs_of_a_key_keep_offset_order_and_different_keys_run_concurrently() -> None:
    # Given 4 keys, and a handler whose first call per key waits until all 4 keys are in a call
    barrier = threading.Barrier(4, timeout=10)
    seen: dict[bytes | None, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def handler(ctx: PollContext) -> ProducerRecord:
        with lock:
            seen[ctx.key].append(ctx.offset)
            first = len(seen[ctx.key]) == 1
        if first:
            barrier.wait()  # would time out (BrokenBarrierError) if keys ran one by one
        return ProducerRecord("out", str(ctx.offset), ctx.key)

    # When the core runs 40 records with 4 lanes at once
    result = process(records(40, 4), handler, Options(max_concurrency=4))
    # Then every key saw its records in offset order, and its outputs are in that order too
    for key, offsets in seen.items():
        assert offsets == sorted(offsets), key
        out = [int(r.value or b"") for r in result.rows if r.key == key]
        assert out == sorted(out)
    assert len(result.rows) == 40


def test_a_key_never_has_two_records_in_flight() -> None:
    # Given a handler that records how many calls of its key are running
    running: dict[bytes | None, int] = defaultdict(int)
    worst = 0
    lock = threading.Lock()

    def handler(ctx: PollContext) -> None:
        nonlocal worst
        with lock:
            running[ctx.key] += 1
            worst = max(worst, running[ctx.key])
        with lock:
            running[ctx.key] -= 1

    # When 300 records of 3 keys in 2 partitions run with 16 threads
    process(records(150, 3) + records(150, 3, partition=1), handler, Options(max_concurrency=16))
    # Then no key of a partition ever ran twice at once
    assert worst == 1


def test_one_input_may_give_many_outputs_or_none() -> None:
    # Given a handler returning offset % 3 outputs
    def handler(ctx: PollContext) -> list[ProducerRecord]:
        return [ProducerRecord("out", f"{ctx.offset}-{i}", ctx.key) for i in range(ctx.offset % 3)]

    # When it runs over 9 records
    result = process(records(9, 2), handler, Options())
    # Then there are 0 + 1 + 2 outputs per three inputs, numbered per input
    assert len(result.rows) == 9
    ids = sorted(header(r, SOURCE_ID) or b"" for r in result.rows)
    assert b"in/0@2/1" in ids
    assert b"in/0@2/0" in ids
    assert not any(b"@0/" in i for i in ids)
    assert result.partitions[("in", 0)].outputs == 9


def test_a_transient_failure_is_retried_after_the_retry_delay() -> None:
    # Given a handler failing each record's first attempt
    def handler(ctx: PollContext) -> ProducerRecord:
        if ctx.attempts == 0:
            raise ConnectionError("flaky")
        assert isinstance(ctx.last_failure, ConnectionError)
        return echo(ctx)

    sleeps = Sleeps()
    # When it runs with max_retries=2 and retry_delay=0.25
    result = process(records(6, 2), handler, Options(max_retries=2, retry_delay=0.25), sleep=sleeps)
    # Then every record has its output, each after one retry delay
    assert len(outputs(result.rows)) == 6
    assert sleeps.delays == [0.25] * 6
    assert result.partitions[("in", 0)].retries == 6


def test_retry_with_a_delay_overrides_the_configured_delay() -> None:
    sleeps = Sleeps()

    def handler(ctx: PollContext) -> None:
        if ctx.attempts == 0:
            raise Retry("later", delay=0.5)

    process(records(1, 1), handler, Options(retry_delay=3.0), sleep=sleeps)
    assert sleeps.delays == [0.5]


def test_a_poison_record_is_dead_lettered_with_the_engine_headers_and_its_key_goes_on() -> None:
    # Given a handler that always fails offset 3 (key k1 of 2 keys)
    def handler(ctx: PollContext) -> ProducerRecord:
        if ctx.offset == 3:
            raise ValueError("poison")
        return echo(ctx)

    sleeps = Sleeps()
    # When it runs with max_retries=2 and a dead-letter topic
    result = process(
        records(8, 2),
        handler,
        Options(max_retries=2, retry_delay=0.1, dead_letter_topic="dlq"),
        group="g1",
        sleep=sleeps,
    )
    # Then offset 3 is in the dead-letter topic after 3 attempts, with the engine's headers
    letters = [r for r in result.rows if r.dead_letter]
    assert len(letters) == 1
    letter = letters[0]
    assert (letter.topic, letter.key, letter.value) == ("dlq", b"k1", b"v3")
    info = read_dead_letter(list(letter.headers))
    assert info is not None
    assert (info.topic, info.partition, info.offset) == ("in", 0, 3)
    assert (info.attempts, info.reason, info.group) == (3, Reason.RETRIES_EXHAUSTED, "g1")
    assert (info.error_type, info.error_message) == ("builtins.ValueError", "poison")
    assert info.timestamp is not None
    assert info.first_failure_at is not None
    assert ("h", b"x") in letter.headers  # the original headers are kept
    assert header(letter, SOURCE_ID) == b"in/0@3/dlq"
    # And later records of that key were processed after it, in order
    assert [r.value for r in outputs(result.rows) if r.key == b"k1"] == [b"v1", b"v5", b"v7"]
    assert sleeps.delays == [0.1, 0.1]
    assert result.partitions[("in", 0)].dead_letters == 1


def test_dead_letter_and_skip_signals_end_a_record_at_once() -> None:
    def handler(ctx: PollContext) -> ProducerRecord:
        if ctx.offset == 0:
            raise DeadLetter("bad payload")
        if ctx.offset == 1:
            raise Skip("not for us")
        return echo(ctx)

    sleeps = Sleeps()
    result = process(records(3, 3), handler, Options(dead_letter_topic="dlq"), sleep=sleeps)
    letters = [r for r in result.rows if r.dead_letter]
    assert [r.source_offset for r in letters] == [0]
    info = read_dead_letter(list(letters[0].headers))
    assert info is not None
    # (raising DeadLetter is a decision, not a failed attempt: as in the engine, attempts 0)
    assert (info.reason, info.attempts) == (Reason.DEAD_LETTER, 0)
    assert [r.source_offset for r in outputs(result.rows)] == [2]
    assert result.partitions[("in", 0)].skipped == 1
    assert sleeps.delays == []


def test_a_dead_letter_with_dead_lettering_off_is_retried_as_a_failed_attempt() -> None:
    # As in the engine: nowhere to write it, so neither dropped nor a stop; it runs again
    seen: list[int] = []

    def handler(ctx: PollContext) -> ProducerRecord:
        seen.append(ctx.attempts)
        if len(seen) > 3:
            raise Skip("the attempts did not count")  # (ends the test instead of looping)
        if ctx.attempts < 2:
            raise DeadLetter("bad payload")
        return echo(ctx)

    sleeps = Sleeps()
    result = process(records(1, 1), handler, Options(retry_delay=0.5), sleep=sleeps)
    assert seen == [0, 1, 2]
    assert [r.dead_letter for r in result.rows] == [False]
    assert sleeps.delays == [0.5, 0.5]
    assert result.partitions[("in", 0)].retries == 2


def test_the_default_dead_letter_topic_is_per_input_topic() -> None:
    def handler(ctx: PollContext) -> None:
        raise ValueError("always")

    result = process(records(1, 1, topic="orders"), handler, Options(max_retries=0))
    assert [r.topic for r in result.rows] == ["orders.dlq"]


def test_a_stop_decision_fails_the_call() -> None:
    # Given dead-lettering on STOP: exhausted retries must stop, not drop the record
    def handler(ctx: PollContext) -> None:
        raise ValueError("always")

    options = Options(max_retries=0, on_retries_exhausted=OnExhausted.STOP)
    with pytest.raises(RetriesExhausted) as caught:
        process(records(5, 5), handler, options)
    assert isinstance(caught.value.__cause__, ValueError)


def test_a_stop_ends_the_other_lanes_instead_of_waiting_for_them() -> None:
    # Given one key that stops at once and another whose record retries forever
    calls: dict[bytes | None, int] = defaultdict(int)
    stopped = threading.Event()

    def handler(ctx: PollContext) -> None:
        calls[ctx.key] += 1
        if ctx.key == b"k0":
            raise KeyError("stop")  # non-retryable, and the policy is STOP
        raise ConnectionError("forever")

    def sleep(seconds: float) -> None:
        stopped.wait(10)  # a retry delay lasts until the stop is seen (or 10 s)

    # When they run together, the k1 lane sleeping in its retry delay
    options = Options(
        max_concurrency=2, non_retryable=(KeyError,), on_retries_exhausted=OnExhausted.STOP
    )
    with pytest.raises(RetriesExhausted):
        process(records(2, 2), handler, options, sleep=sleep)
    stopped.set()
    # Then the call ended with the stop, and k1 was not retried again and again
    assert calls[b"k0"] == 1
    assert calls[b"k1"] <= 1  # 0 when the stop came before its lane started


def test_one_poison_record_per_key_dead_letters_each_and_every_key_goes_on() -> None:
    # Given 10 keys whose first record each is poison
    def handler(ctx: PollContext) -> ProducerRecord:
        if ctx.offset < 10:
            raise ValueError("poison")
        return echo(ctx)

    # When 100 records run with max_retries=1
    result = process(
        records(100, 10),
        handler,
        Options(max_retries=1, dead_letter_topic="dlq", max_concurrency=4),
        sleep=Sleeps(),
    )
    # Then 10 dead letters (one per key) and 90 outputs, each key's outputs in order
    assert sorted(r.source_offset for r in result.rows if r.dead_letter) == list(range(10))
    good = outputs(result.rows)
    assert len(good) == 90
    for key in {r.key for r in good}:
        offsets = [r.source_offset for r in good if r.key == key]
        assert offsets == sorted(offsets)
        assert len(offsets) == 9


def test_a_wrong_return_type_is_a_failure_of_the_record() -> None:
    calls: list[int] = []

    def handler(ctx: PollContext) -> object:
        calls.append(ctx.offset)
        return "not a ProducerRecord"

    result = process(records(2, 1), handler, Options(max_retries=1, dead_letter_topic="dlq"))
    assert all(r.dead_letter for r in result.rows)
    assert len(result.rows) == 2
    info = read_dead_letter(list(result.rows[0].headers))
    assert info is not None
    # As in the engine: an InvalidOutput (a TypeError) is never retried, whatever max_retries
    assert info.error_type == "parallel_consumer.errors.InvalidOutput"
    assert issubclass(InvalidOutput, TypeError)
    assert (info.reason, info.attempts) == (Reason.NON_RETRYABLE, 1)
    assert calls == [0, 1]


def test_ctx_fail_fails_the_record_but_keeps_what_the_call_returned() -> None:
    # As in the engine: a call's outputs are written; the record it failed is retried.
    def handler(ctx: PollContext) -> ProducerRecord:
        if ctx.attempts == 0:
            ctx.fail(ctx.record, ConnectionError("half done"))
        return ProducerRecord("out", f"attempt-{ctx.attempts}", ctx.key)

    result = process(records(1, 1), handler, Options(retry_delay=0), sleep=Sleeps())
    assert [(r.value, header(r, SOURCE_ID)) for r in result.rows] == [
        (b"attempt-0", b"in/0@0/0"),
        (b"attempt-1", b"in/0@0/1"),
    ]


def test_partition_order_runs_one_record_per_partition_and_unordered_runs_any() -> None:
    active: dict[Any, int] = defaultdict(int)
    worst: dict[str, int] = defaultdict(int)
    lock = threading.Lock()
    gate = threading.Barrier(2, timeout=10)

    def handler(ctx: PollContext) -> None:
        with lock:
            active[ctx.partition] += 1
            worst["partition"] = max(worst["partition"], active[ctx.partition])
        if ctx.offset == 0 and ctx.key == b"k0":
            gate.wait()  # both partitions' first records are in flight together
        with lock:
            active[ctx.partition] -= 1

    both = records(20, 4) + records(20, 4, partition=1)
    process(both, handler, Options(ordering="partition", max_concurrency=8))
    assert worst["partition"] == 1

    # UNORDERED: all 4 records of one key at once (a barrier of 4 would time out otherwise)
    together = threading.Barrier(4, timeout=10)

    def meet(ctx: PollContext) -> None:
        together.wait()

    result = process(records(4, 1), meet, Options(ordering="unordered", max_retries=0))
    assert result.partitions[("in", 0)].dead_letters == 0


def test_an_empty_slice_gives_nothing() -> None:
    result = process([], echo, Options())
    assert result.rows == []
    assert result.partitions == {}


def test_records_out_of_order_in_a_slice_run_in_offset_order() -> None:
    seen: list[int] = []
    process(list(reversed(records(5, 1))), lambda ctx: seen.append(ctx.offset), Options())
    assert seen == [0, 1, 2, 3, 4]


def test_async_handlers_run_on_one_loop_with_lanes_concurrent() -> None:
    # Given an async handler whose first calls of 5 keys must all be running together
    started = 0
    all_in: asyncio.Event | None = None

    async def handler(ctx: PollContext) -> ProducerRecord:
        nonlocal started, all_in
        if all_in is None:
            all_in = asyncio.Event()
        if ctx.offset < 5:
            started += 1
            if started == 5:
                all_in.set()
            await asyncio.wait_for(all_in.wait(), 10)
        if ctx.offset == 7 and ctx.attempts == 0:
            raise ConnectionError("flaky")
        return echo(ctx)

    # When the core runs 20 records of 5 keys
    result = process(records(20, 5), handler, Options(retry_delay=0, max_concurrency=8))
    # Then every record has one output (offset 7 after a retry), in key order
    assert sorted(r.source_offset for r in result.rows) == list(range(20))
    for key in {r.key for r in result.rows}:
        offsets = [r.source_offset for r in result.rows if r.key == key]
        assert offsets == sorted(offsets)
    assert result.partitions[("in", 0)].retries == 1


class _TaggedLoop(asyncio.SelectorEventLoop):
    pass


def test_async_handlers_run_on_the_loop_of_options_loop_factory() -> None:
    # Given an async handler that notes the kind of loop it runs on
    kinds: set[type] = set()

    async def handler(ctx: PollContext) -> ProducerRecord:
        kinds.add(type(asyncio.get_running_loop()))
        return echo(ctx)

    # When the core runs it with a loop factory
    result = process(records(10, 3), handler, Options(loop_factory=_TaggedLoop))
    # Then the calls ran on the factory's loop
    assert kinds == {_TaggedLoop}
    assert len(result.rows) == 10


def test_settings_the_runner_cannot_honour_are_refused() -> None:
    from parallel_consumer.spark._core import check_options

    with pytest.raises(ConfigurationError, match="batch_size"):
        check_options(Options(batch_size=4), echo)
    with pytest.raises(ConfigurationError, match="process"):
        check_options(Options(runner="process"), echo)
    with pytest.raises(ConfigurationError, match="callable"):
        check_options(Options(), "echo")  # type: ignore[arg-type]


def test_importing_the_package_does_not_import_pyspark_or_pyarrow() -> None:
    import subprocess

    code = (
        "import sys, parallel_consumer.spark; "
        "print('pyspark' in sys.modules, 'pyarrow' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["False", "False"]


def test_the_spark_package_lists_its_public_names() -> None:
    import types

    import parallel_consumer.spark as spark

    public = {
        name
        for name in dir(spark)
        if not name.startswith("_")
        and name != "annotations"
        and not isinstance(getattr(spark, name), types.ModuleType)
    }
    assert set(spark.__all__) == public
