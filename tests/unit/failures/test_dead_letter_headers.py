"""The dead-letter header contract: what the engine and the Spark runner write (one builder) is
what the tools read back."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from parallel_consumer import DeadLetter, Options, PollContext
from parallel_consumer import dead_letter as dl
from parallel_consumer.engine.letters import DeadLetters, Letter
from parallel_consumer.spark import SOURCE_ID, InputRecord, process_records
from parallel_consumer.spark._records import Message
from parallel_consumer.work.item import WorkItem


def _headers(**overrides: object) -> list[tuple[str, bytes]]:
    args: dict[str, object] = {
        "topic": "orders",
        "partition": 3,
        "offset": 42,
        "timestamp_ms": 1_700_000_000_123,
        "attempts": 4,
        "error": ValueError("bad order"),
        "first_failure_at": datetime(2026, 11, 24, 4, 0, 0, 5000, tzinfo=UTC),
        "last_failure_at": datetime(2026, 11, 24, 4, 0, 9, tzinfo=UTC),
        "group": "g",
        "reason": dl.Reason.RETRIES_EXHAUSTED,
        "original_headers": [("app", b"1"), (dl.ATTEMPTS, b"9")],
    }
    args.update(overrides)
    return dl.dead_letter_headers(**args)  # type: ignore[arg-type]


def test_round_trip() -> None:
    headers = _headers()
    assert headers[0] == ("app", b"1")  # the record's own headers first
    assert sum(1 for k, _ in headers if k == dl.ATTEMPTS) == 1  # the stale one dropped
    info = dl.read_dead_letter(headers)
    assert info is not None
    assert (info.topic, info.partition, info.offset, info.attempts) == ("orders", 3, 42, 4)
    assert info.error_type == "builtins.ValueError"
    assert info.error_message == "bad order"
    assert info.timestamp == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert info.first_failure_at == datetime(2026, 11, 24, 4, 0, 0, 5000, tzinfo=UTC)
    assert info.reason == "retries-exhausted"
    assert info.trace_id is None
    assert info.redrive_count == 0


def test_long_messages_are_cut() -> None:
    info = dl.read_dead_letter(_headers(error=RuntimeError("x" * 5000)))
    assert info is not None
    assert len(info.error_message) == dl.ERROR_MESSAGE_LIMIT
    assert info.error_message.endswith("...")


def _raised(error: BaseException) -> BaseException:
    def parse_order() -> None:
        raise error

    try:
        parse_order()
    except BaseException as caught:
        return caught
    raise AssertionError("unreachable")


def test_the_traceback_of_a_raised_error_travels_in_a_header() -> None:
    info = dl.read_dead_letter(_headers(error=_raised(ValueError("bad order"))))
    assert info is not None
    assert info.error_stacktrace.startswith("Traceback (most recent call last):")
    assert "in parse_order" in info.error_stacktrace
    assert info.error_stacktrace.rstrip().endswith("ValueError: bad order")


def test_a_long_traceback_keeps_its_end_within_the_limit() -> None:
    # (repeated frames are folded by Python: a long message makes the traceback long)
    info = dl.read_dead_letter(_headers(error=_raised(RuntimeError("deep " + "x" * 20_000))))
    assert info is not None
    assert len(info.error_stacktrace) == dl.ERROR_STACKTRACE_LIMIT
    assert info.error_stacktrace.startswith("...")
    assert info.error_stacktrace.rstrip().endswith("x" * 100)


def test_an_error_never_raised_has_an_empty_traceback_header() -> None:
    info = dl.read_dead_letter(_headers())
    assert info is not None
    assert info.error_stacktrace == ""


def test_unknown_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dead-letter reason"):
        _headers(reason="because")


def test_records_without_the_headers_are_not_dead_letters() -> None:
    assert dl.read_dead_letter([("app", b"1")]) is None
    assert dl.read_dead_letter(None) is None


def test_times_are_utc_with_milliseconds() -> None:
    assert dl.format_time(0.0) == "1970-01-01T00:00:00.000Z"
    assert dl.format_time(datetime(2026, 1, 2, 3, 4, 5, 678999)) == "2026-01-02T03:04:05.678Z"
    assert dl.format_time(None) == ""


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def test_an_error_whose_str_raises_is_named_by_its_type() -> None:
    info = dl.read_dead_letter(_headers(error=_Unprintable("x")))
    assert info is not None
    assert info.error_type.endswith("._Unprintable")
    assert info.error_message == info.error_type


def test_text_that_is_not_valid_utf8_is_escaped_not_refused() -> None:
    headers = _headers(error=ValueError("bad \udcff byte"), topic="t\udcfe")
    values = dict(headers)
    assert values[dl.ERROR_MESSAGE] == b"bad \\udcff byte"
    info = dl.read_dead_letter(headers)
    assert info is not None
    assert info.error_message == "bad \\udcff byte"
    assert info.topic == "t\\udcfe"


@pytest.mark.parametrize(
    ("timestamp_ms", "header"),
    [
        (0, b"1970-01-01T00:00:00.000Z"),  # the epoch is a timestamp like any other
        (1_700_000_000_123, b"2023-11-14T22:13:20.123Z"),
        (-1, b""),  # Kafka's "no timestamp"
        (None, b""),
    ],
)
def test_the_original_timestamp_is_empty_only_when_the_record_has_none(
    timestamp_ms: int | None, header: bytes
) -> None:
    assert dict(_headers(timestamp_ms=timestamp_ms))[dl.ORIGINAL_TIMESTAMP] == header


def test_a_dead_letter_raised_from_an_error_is_named_by_that_error() -> None:
    cause = KeyError("field")
    for error in (DeadLetter("bad json", cause=cause), _raised_from(cause)):
        info = dl.read_dead_letter(_headers(error=error, reason=dl.Reason.DEAD_LETTER))
        assert info is not None
        assert (info.error_type, info.error_message) == ("builtins.KeyError", "'field'")
    # without a cause, the DeadLetter itself
    info = dl.read_dead_letter(_headers(error=DeadLetter("bad json")))
    assert info is not None
    assert (info.error_type, info.error_message) == (
        "parallel_consumer.errors.DeadLetter",
        "bad json",
    )


def _raised_from(cause: BaseException) -> DeadLetter:
    try:
        raise DeadLetter("bad json") from cause
    except DeadLetter as exc:
        return exc


@pytest.mark.parametrize("timestamp_ms", [0, -1, 1_700_000_000_123])
def test_the_engine_and_spark_write_the_same_dead_letter_headers(timestamp_ms: int) -> None:
    # Given one record, and a handler that dead-letters it on its first call, naming a cause
    record = InputRecord("orders", 3, 42, b"k", b"v", timestamp_ms, 1, (("app", b"1"),))
    options = Options(dead_letter_topic="orders.dlq")

    def handler(ctx: PollContext) -> None:
        raise DeadLetter("bad json", cause=KeyError("field"))

    # When Spark dead-letters it
    (row,) = process_records([record], handler, options, group="g").rows
    spark = [h for h in row.headers if h[0] != SOURCE_ID]
    # and the engine writes its dead letter (the handler's error as it was raised)
    item = WorkItem(Message(record), ("orders", 3), b"k", 0)
    letter = Letter(item, DeadLetter("bad json", cause=KeyError("field")), dl.Reason.DEAD_LETTER)
    _, written = DeadLetters(options, "g").start(letter, 1, 0.0)
    # Then both wrote the same headers, with the one builder's timestamp and cause
    assert written.headers == spark
    info = dl.read_dead_letter(spark)
    assert info is not None
    assert info.error_type == "builtins.KeyError"
    assert (info.timestamp is None) == (timestamp_ms < 0)
