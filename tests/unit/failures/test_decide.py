"""decide(): the pure decision table of docs/failure-handling.md."""

from __future__ import annotations

from typing import Any

import pytest

from parallel_consumer import (
    ConfigurationError,
    DeadLetter,
    OnExhausted,
    Options,
    RecordContext,
    Retry,
    Skip,
)
from parallel_consumer.dead_letter import Reason
from parallel_consumer.errors import InvalidOutput, SerializationError
from parallel_consumer.retry import retry_delay
from parallel_consumer.work.outcomes import (
    DeadLetterNow,
    RetryAt,
    SkipNow,
    StopNow,
    Succeeded,
    counts_as_attempt,
    decide,
)


class _Message:
    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7

    def key(self) -> bytes:
        return b"k"


def _record(attempts: int) -> RecordContext:
    return RecordContext(_Message(), attempts)


def test_success_and_plain_failures_without_a_limit_retry_forever() -> None:
    options = Options(retry_delay=2)
    assert isinstance(decide(None, _record(0), 0.0, options), Succeeded)
    assert decide(ValueError(), _record(10_000), 5.0, options) == RetryAt(7.0, 2.0)


@pytest.mark.parametrize(
    ("max_retries", "attempts", "retried"),
    [(0, 1, False), (3, 3, True), (3, 4, False)],
)
def test_max_retries_counts_retries_after_the_first_attempt(
    max_retries: int, attempts: int, retried: bool
) -> None:
    options = Options(max_retries=max_retries)
    decision = decide(ValueError(), _record(attempts), 0.0, options)
    if retried:
        assert isinstance(decision, RetryAt)
    else:
        assert decision == DeadLetterNow(Reason.RETRIES_EXHAUSTED, exhausted=True)


def test_retry_signals_count_towards_max_retries_too() -> None:
    decision = decide(Retry(delay=1), _record(2), 0.0, Options(max_retries=1))
    assert isinstance(decision, DeadLetterNow)


def test_the_policy_picks_skip_or_stop() -> None:
    skip = decide(
        ValueError(), _record(2), 0.0, Options(max_retries=1, on_retries_exhausted="skip")
    )
    assert isinstance(skip, SkipNow)
    assert skip.exhausted
    stop = decide(
        ValueError("x"),
        _record(2),
        0.0,
        Options(max_retries=1, on_retries_exhausted=OnExhausted.STOP),
    )
    assert isinstance(stop, StopNow)
    assert "t[0]@7" in stop.message


def test_signals_skip_and_dead_letter_at_once_whatever_the_attempts() -> None:
    options = Options(dead_letter_topic="dlq")
    assert decide(Skip("dup"), _record(0), 0.0, options) == SkipNow("dup")
    assert decide(DeadLetter("bad"), _record(0), 0.0, options) == DeadLetterNow(Reason.DEAD_LETTER)


def test_dead_letter_with_dead_lettering_off_retries_with_a_warning_saying_how_to_turn_it_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Nowhere to write it: neither dropped (lost) nor a stop (every partition halted)
    with caplog.at_level("WARNING", logger="parallel_consumer"):
        decision = decide(DeadLetter("bad"), _record(1), 5.0, Options(retry_delay=2.0))
    assert decision == RetryAt(7.0, 2.0)
    assert "dead_letter_topic" in caplog.text
    assert "is to be dead-lettered" in caplog.text


def test_never_retried_errors_go_to_the_policy_at_the_first_failure() -> None:
    options = Options(dead_letter_topic="dlq")
    for error in (SerializationError("bad bytes"), InvalidOutput("a str")):
        assert decide(error, _record(1), 0.0, options) == DeadLetterNow(
            Reason.NON_RETRYABLE, exhausted=True
        )


def test_never_retried_errors_with_the_stop_policy_stop() -> None:
    options = Options(on_retries_exhausted=OnExhausted.STOP)
    assert isinstance(decide(InvalidOutput("a str"), _record(1), 0.0, options), StopNow)


def test_non_retryable_types_and_subclasses_go_to_the_policy_at_the_first_failure() -> None:
    options = Options(non_retryable=(LookupError,))
    assert decide(KeyError("k"), _record(1), 0.0, options) == DeadLetterNow(
        Reason.NON_RETRYABLE, exhausted=True
    )
    assert isinstance(decide(ValueError(), _record(1), 0.0, options), RetryAt)


def test_the_callback_sees_the_record_and_error_and_may_override_the_policy() -> None:
    seen: list[tuple[int, str]] = []

    def callback(record: RecordContext, error: BaseException) -> OnExhausted | None:
        seen.append((record.attempts, str(error)))
        return OnExhausted.SKIP if record.key == b"k" else None

    options = Options(max_retries=0, retries_exhausted_callback=callback)
    assert isinstance(decide(ValueError("boom"), _record(1), 0.0, options), SkipNow)
    assert seen == [(1, "boom")]


@pytest.mark.parametrize(
    "returned", ["nonsense", RuntimeError("callback bug"), SystemExit(3), KeyboardInterrupt()]
)
def test_a_callback_that_fails_or_returns_nonsense_leaves_the_policy(returned: Any) -> None:
    def callback(record: RecordContext, error: BaseException) -> Any:
        if isinstance(returned, BaseException):
            raise returned
        return returned

    options = Options(max_retries=0, retries_exhausted_callback=callback, dead_letter_topic="d")
    assert isinstance(decide(ValueError(), _record(1), 0.0, options), DeadLetterNow)


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"on_retries_exhausted": "explode"}, "on_retries_exhausted"),
        ({"non_retryable": ("ValueError",)}, "non_retryable"),
        ({"non_retryable": (Skip,)}, "non_retryable"),
        ({"retries_exhausted_callback": 3}, "retries_exhausted_callback"),
        ({"dead_letter_topic": ""}, "dead_letter_topic"),
        ({"dead_letter_topic": "^dlq.*"}, "dead_letter_topic"),
    ],
)
def test_bad_failure_settings_are_configuration_errors(
    kwargs: dict[str, Any], setting: str
) -> None:
    with pytest.raises(ConfigurationError, match=setting):
        Options(**kwargs)


def test_dead_lettering_is_on_only_when_something_can_dead_letter() -> None:
    assert not Options().dead_lettering
    assert not Options(max_retries=3, on_retries_exhausted="skip").dead_lettering
    assert Options(max_retries=3).dead_lettering
    assert Options(non_retryable=ValueError).dead_lettering  # type: ignore[arg-type]
    assert Options(dead_letter_topic="dlq").dead_lettering


@pytest.mark.parametrize("delay", [-1.0, float("nan"), float("inf"), float("-inf")])
def test_retry_refuses_a_delay_that_is_not_finite_seconds(delay: float) -> None:
    with pytest.raises(ValueError, match="finite seconds >= 0"):
        Retry("x", delay=delay)


@pytest.mark.parametrize("delay", [float("nan"), float("inf"), -1.0])
def test_a_bad_delay_set_on_a_retry_afterwards_falls_back_to_retry_delay(
    delay: float, caplog: pytest.LogCaptureFixture
) -> None:
    error = Retry("x")
    error.delay = delay
    assert retry_delay(Options(retry_delay=2), error, _record(1)) == 2.0
    assert "t[0]@7" in caplog.text  # the warning names the record


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), -1.0, None, SystemExit(3), KeyboardInterrupt()]
)
def test_a_provider_that_fails_or_returns_nonsense_falls_back_to_retry_delay(
    value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def provider(record: RecordContext) -> Any:
        if isinstance(value, BaseException):
            raise value
        return value

    options = Options(retry_delay=2, retry_delay_provider=provider)
    assert retry_delay(options, ValueError(), _record(1)) == 2.0
    assert "t[0]@7" in caplog.text


def test_only_a_failure_counts_as_an_attempt_not_the_handlers_skip_or_dead_letter() -> None:
    on = Options(dead_letter_topic="dlq")
    assert counts_as_attempt(ValueError("boom"), on)
    assert counts_as_attempt(Retry("later", delay=1.0), on)
    assert not counts_as_attempt(Skip("not for us"), on)
    assert not counts_as_attempt(DeadLetter("bad payload"), on)
    # With nowhere to write it, a dead letter is retried like any failure, and counts as one
    off = Options()
    assert counts_as_attempt(DeadLetter("bad payload"), off)
    assert not counts_as_attempt(Skip("not for us"), off)
