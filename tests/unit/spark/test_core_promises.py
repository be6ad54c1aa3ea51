"""The PySpark runner's pure-Python core (parallel_consumer/spark) keeps the promises of
docs/spark.md and of its own docstrings: dead letters carry the engine's attempts, times and
cause, a record without a timestamp, decorated async handlers, an interrupt in one lane, and one
source id per output. Each failed on an earlier version of the core. No JVM, no pyspark: the
core is driven as tests/unit/spark/test_core.py does."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from typing import Any

import pytest

from parallel_consumer import DeadLetter, Options, PollContext, ProducerRecord
from parallel_consumer.dead_letter import ORIGINAL_TIMESTAMP, Reason, read_dead_letter
from parallel_consumer.spark._core import SOURCE_ID, InputRecord, OutputRow, process


def record(offset: int, key: bytes = b"k", **kwargs: Any) -> InputRecord:
    fields: dict[str, Any] = {
        "timestamp_ms": 1_700_000_000_000 + offset,
        "timestamp_type": 1,
        "headers": (("h", b"x"),),
    }
    fields.update(kwargs)
    return InputRecord("in", 0, offset, key, f"v{offset}".encode(), **fields)


def letters(rows: list[OutputRow]) -> list[OutputRow]:
    return [row for row in rows if row.dead_letter]


def no_sleep(seconds: float) -> None:
    pass


def test_dead_letter_on_the_first_call_has_the_engines_attempts_and_times() -> None:
    """Claim (docs/spark.md 'Dead letters'; docs/dead-letters.md): dead-letter rows carry the
    engine's pc.dlq.* headers, built by the same functions; pc.dlq.attempts is "failed calls
    before it was dead-lettered (0 for DeadLetter on the first call)", and the failure times
    are empty when no call failed. The engine does so (tests/unit/engine/
    test_failure_handling.py asserts attempts == 0: a DeadLetter/Skip raise is the handler's
    decision, not a failed attempt, see _controller._failed).

    Reproduction: a handler that raises DeadLetter on its first call.

    Observed: attempts == 1 and first/last failure times set (run_record increments
    ``attempts`` and stamps ``last`` before Lane.settle for every error, DeadLetter included;
    tests/unit/spark/test_core.py even asserts attempts == 1).
    """

    def handler(ctx: PollContext) -> None:
        raise DeadLetter("bad payload")

    result = process([record(0)], handler, Options(dead_letter_topic="dlq"), sleep=no_sleep)
    info = read_dead_letter(list(letters(result.rows)[0].headers))
    assert info is not None
    assert info.reason == Reason.DEAD_LETTER
    assert (info.attempts, info.first_failure_at, info.last_failure_at) == (0, None, None)


def test_dead_letter_after_failures_counts_only_the_failures() -> None:
    """Claim: as above, dead-letter headers equal the engine's. In the engine a record that
    failed twice (ValueError) and then raised DeadLetter has pc.dlq.attempts == 2: the
    DeadLetter call is not a failed attempt (the history "stays as it was").

    Reproduction: ValueError on attempts 0 and 1, DeadLetter on attempt 2, max_retries=5.

    Observed: pc.dlq.attempts == 3.
    """

    def handler(ctx: PollContext) -> None:
        if ctx.attempts < 2:
            raise ValueError("transient")
        raise DeadLetter("give up")

    result = process(
        [record(0)], handler, Options(max_retries=5, dead_letter_topic="dlq"), sleep=no_sleep
    )
    info = read_dead_letter(list(letters(result.rows)[0].headers))
    assert info is not None
    assert (info.reason, info.attempts) == (Reason.DEAD_LETTER, 2)


def test_dead_letter_raised_from_an_error_names_the_cause() -> None:
    """Claim (docs/dead-letters.md, pc.dlq.error.type): "for `raise DeadLetter(...) from exc`:
    exc's type"; the engine unwraps ``__cause__`` in _controller._give_up, and docs/spark.md
    says the Spark rows carry the same headers.

    Reproduction: ``raise DeadLetter("bad json") from KeyError("field")``.

    Observed: error type ``parallel_consumer.errors.DeadLetter`` (Lane.dead_letter passes the
    DeadLetter itself to dead_letter_headers), message "bad json" instead of "'field'".
    """

    def handler(ctx: PollContext) -> None:
        try:
            raise KeyError("field")
        except KeyError as exc:
            raise DeadLetter("bad json") from exc

    result = process([record(0)], handler, Options(dead_letter_topic="dlq"), sleep=no_sleep)
    info = read_dead_letter(list(letters(result.rows)[0].headers))
    assert info is not None
    assert info.error_type == "builtins.KeyError"


def test_a_record_without_timestamp_has_an_empty_original_timestamp() -> None:
    """Claim: dead-letter headers equal the engine's. The engine passes the timestamp only when
    its type is not NOT_AVAILABLE and millis >= 0 (_dead_letters.DeadLetters.start), else the
    header is empty ("or empty", docs/dead-letters.md). Kafka's "no timestamp" is -1, and the
    Spark adapter's ``unix_millis(timestamp)`` gives -1 for it.

    Reproduction: InputRecord with timestamp_ms=-1 dead-lettered.

    Observed: Lane.dead_letter tests only truthiness (``timestamp_ms if timestamp_ms else
    None``), so -1 is formatted as 1969-12-31T23:59:59.999Z. (Message.timestamp() in the same
    module does treat < 0 as not available: the handler and the dead letter disagree.)
    """

    def handler(ctx: PollContext) -> None:
        raise DeadLetter("x")

    result = process(
        [record(0, timestamp_ms=-1)], handler, Options(dead_letter_topic="dlq"), sleep=no_sleep
    )
    headers = dict(letters(result.rows)[0].headers)
    assert headers[ORIGINAL_TIMESTAMP] == b""


def _async_handler() -> Callable[[PollContext], Any]:
    async def handler(ctx: PollContext) -> ProducerRecord:
        await asyncio.sleep(0)
        return ProducerRecord("out", ctx.value, ctx.key)

    return handler


def _logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A synchronous decorator that keeps __wrapped__, as logging/metrics decorators do."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def test_a_decorated_async_handler_runs_as_async() -> None:
    """Claim (docs/spark.md): the runner runs "the same function the engine runs"; an
    ``async def`` handler runs as tasks on one event loop. The engine finds async handlers
    through functools.partial, bound methods, async ``__call__`` and ``__wrapped__``
    (runners/base.handler_kind), because a wrapper returns the coroutine.

    Reproduction: an ``async def`` handler behind a ``functools.wraps`` decorator.

    Observed: _core.process (and _arrow.map_function) use ``inspect.iscoroutinefunction``:
    the wrapper is called on threads, returns a coroutine, outputs_of raises TypeError, and
    the record is retried and dead-lettered (the coroutine is never awaited).
    """
    handler = _logged(_async_handler())
    result = process(
        [record(0), record(1)],
        handler,
        Options(max_retries=0, dead_letter_topic="dlq"),
        sleep=no_sleep,
    )
    assert letters(result.rows) == []
    assert [row.value for row in result.rows] == [b"v0", b"v1"]


def test_an_interrupt_in_one_lane_stops_the_other_lanes() -> None:
    """Claim (_core._run_threads): on "a stop (or an interrupt): lanes not started yet need not
    run, and the caller gets control back". A stop (RetriesExhausted) sets the shared
    ``stopping`` event so running lanes end after their current record; a BaseException from
    the handler (KeyboardInterrupt, SystemExit, which _attempt lets through) does not.

    Reproduction: lane k0 raises KeyboardInterrupt while lane k1 is in its first call; after
    process() raised, k1's call is released.

    Observed: k1 goes on to call the handler for its next records in a thread nobody waits
    for, after the caller has seen the interrupt.
    """
    in_k1 = threading.Event()
    release = threading.Event()
    k1_second = threading.Event()

    def handler(ctx: PollContext) -> None:
        if ctx.key == b"k0":
            in_k1.wait(5)
            raise KeyboardInterrupt
        if ctx.offset == 1:
            in_k1.set()
            release.wait(5)
        else:
            k1_second.set()

    batch = [record(0, b"k0"), record(1, b"k1"), record(2, b"k1"), record(3, b"k1")]
    with pytest.raises(KeyboardInterrupt):
        process(batch, handler, Options(max_concurrency=2), sleep=no_sleep)
    release.set()
    assert not k1_second.wait(1.0)


def test_every_output_carries_exactly_one_source_id() -> None:
    """Claim (docs/spark.md): "Every output carries a pc.source.id header,
    <topic>/<partition>@<offset>/<n> of its input" so readers can drop replayed duplicates.

    Reproduction: a chained pipeline, whose input was written by an earlier Spark stage (it
    carries pc.source.id), forwards the input's headers to its output (and dead-letters one
    record, whose original headers are kept).

    Observed: Lane.emit and Lane.dead_letter append their id after the existing headers
    without dropping a stale pc.source.id (dead_letter_headers drops stale pc.dlq.* only), so
    each row has two; a reader taking the first occurrence dedupes on the upstream id and
    drops distinct outputs (e.g. both /0 outputs of two inputs of the same upstream record).
    """
    upstream = ((SOURCE_ID, b"raw/0@7/0"),)

    def handler(ctx: PollContext) -> ProducerRecord:
        if ctx.offset == 1:
            raise DeadLetter("x")
        return ProducerRecord("out", ctx.value, ctx.key, list(ctx.headers or []))

    result = process(
        [record(0, headers=upstream), record(1, headers=upstream)],
        handler,
        Options(dead_letter_topic="dlq"),
        sleep=no_sleep,
    )
    assert len(result.rows) == 2
    for row in result.rows:
        ids = [value for name, value in row.headers if name == SOURCE_ID]
        assert len(ids) == 1, ids
