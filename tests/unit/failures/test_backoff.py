"""exponential_backoff: the maths is pure, bounded and reproducible with an injected random."""

from __future__ import annotations

import random
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parallel_consumer import ConfigurationError, exponential_backoff
from parallel_consumer.retry import backoff_delay


def _record(attempts: int) -> Any:
    return SimpleNamespace(attempts=attempts)


def test_without_jitter_the_delay_doubles_from_initial_up_to_the_cap() -> None:
    # Given a backoff of 0.5 s doubling up to 4 s without jitter
    provider = exponential_backoff(initial=0.5, multiplier=2, max=4, jitter=0)
    # When asked after 1..6 failures, then it doubles and stops at the cap
    assert [provider(_record(n)) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_jitter_shortens_by_the_drawn_fraction() -> None:
    # Given jitter 0.5 and a random source that always draws 1.0, then 0.0
    draws = iter([1.0, 0.0])
    provider = exponential_backoff(
        initial=2, multiplier=3, max=100, jitter=0.5, random=lambda: next(draws)
    )
    # Then the first delay is halved and the second is the full base
    assert provider(_record(2)) == pytest.approx(3.0)
    assert provider(_record(2)) == pytest.approx(6.0)


def test_a_seeded_random_gives_the_same_delays() -> None:
    first = exponential_backoff(jitter=0.3, random=random.Random(7).random)
    second = exponential_backoff(jitter=0.3, random=random.Random(7).random)
    assert [first(_record(n)) for n in range(1, 10)] == [second(_record(n)) for n in range(1, 10)]


def test_timedelta_durations_are_accepted() -> None:
    provider = exponential_backoff(initial=timedelta(seconds=1), max=timedelta(minutes=1), jitter=0)
    assert provider(_record(3)) == 4.0


@given(
    attempts=st.integers(min_value=-5, max_value=10_000),
    initial=st.floats(min_value=0, max_value=1e6),
    multiplier=st.floats(min_value=1, max_value=1e3),
    extra=st.floats(min_value=0, max_value=1e6),
    jitter=st.floats(min_value=0, max_value=1),
    draw=st.floats(min_value=0, max_value=1),
)
def test_the_delay_stays_between_the_jittered_base_and_the_cap(
    attempts: int, initial: float, multiplier: float, extra: float, jitter: float, draw: float
) -> None:
    maximum = initial + extra
    delay = backoff_delay(
        attempts, initial=initial, multiplier=multiplier, maximum=maximum, jitter=jitter, draw=draw
    )
    assert 0 <= delay <= maximum
    assert delay >= min(initial, maximum) * (1 - jitter) - 1e-9


@given(
    attempts=st.integers(min_value=1, max_value=200),
    initial=st.floats(min_value=0.001, max_value=10),
    multiplier=st.floats(min_value=1, max_value=10),
)
def test_without_jitter_the_delay_never_shrinks_as_failures_grow(
    attempts: int, initial: float, multiplier: float
) -> None:
    def delay(n: int) -> float:
        return backoff_delay(
            n, initial=initial, multiplier=multiplier, maximum=60.0, jitter=0.0, draw=0.5
        )

    assert delay(attempts) <= delay(attempts + 1)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"initial": -1}, "initial"),
        ({"initial": float("nan")}, "initial"),
        ({"initial": 10, "max": 5}, "max"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"jitter": 1.5}, "jitter"),
        ({"random": 3}, "random"),
    ],
)
def test_bad_settings_are_configuration_errors_naming_the_setting(
    kwargs: dict[str, Any], names: str
) -> None:
    with pytest.raises(ConfigurationError, match=names):
        exponential_backoff(**kwargs)


def test_a_zero_initial_delay_stays_zero_however_many_failures() -> None:
    provider = exponential_backoff(initial=0, multiplier=10, max=60, jitter=0)
    for attempts in (1, 2, 400, 10_000):
        assert provider(_record(attempts)) == 0
