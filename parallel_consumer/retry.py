"""Retry timing: pure functions from a failure to the delay before the next attempt. The queue
of records waiting for theirs is :class:`parallel_consumer.work.retry_queue.RetryQueue`."""

from __future__ import annotations

import logging
import math
import random as _random
from collections.abc import Callable
from datetime import timedelta

from parallel_consumer.context import RecordContext
from parallel_consumer.errors import ConfigurationError, Retry
from parallel_consumer.options import Options

__all__ = ["backoff_delay", "exponential_backoff", "retry_delay"]

log = logging.getLogger("parallel_consumer")


def retry_delay(options: Options, error: BaseException, record: RecordContext) -> float:
    """Seconds to wait before ``record`` is tried again after ``error``.

    ``Retry(delay=...)`` raised by the handler wins; then ``Options.retry_delay_provider`` (which
    sees the attempt count including this failure); then ``Options.retry_delay``. A provider
    that fails (even with a ``BaseException``) or returns nonsense (negative, NaN, infinite), and
    a ``Retry.delay`` that is not finite seconds >= 0, fall back to ``retry_delay`` with a
    warning naming the record, because a bug in them must not stop the consumer.
    """
    if isinstance(error, Retry) and error.delay is not None:
        if math.isfinite(error.delay) and error.delay >= 0:
            return error.delay
        # Retry checks its delay, but the attribute can be set afterwards: a NaN due time would
        # corrupt the retry queue's order, an infinite one pin the record forever.
        log.warning(
            "Retry(delay=%r) raised for %r is not finite seconds >= 0; using retry_delay",
            error.delay,
            record,
        )
        return options.retry_delay
    provider = options.retry_delay_provider
    if provider is None:
        return options.retry_delay
    try:
        value = provider(record)
        seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    except BaseException:  # even SystemExit: a provider bug must not stop us
        log.warning("retry_delay_provider failed for %r; using retry_delay", record, exc_info=True)
        return options.retry_delay
    if not (math.isfinite(seconds) and seconds >= 0):  # also catches NaN
        log.warning("retry_delay_provider returned %r for %r; using retry_delay", value, record)
        return options.retry_delay
    return seconds


def backoff_delay(
    attempts: int,
    *,
    initial: float,
    multiplier: float,
    maximum: float,
    jitter: float,
    draw: float,
) -> float:
    """Exponential backoff, pure: ``min(maximum, initial * multiplier ** (attempts - 1))``,
    then reduced by up to ``jitter`` (a fraction) of itself: ``draw`` in [0, 1] picks how much.

    The result lies in ``[base * (1 - jitter), base]``: never above ``maximum``, never below 0,
    and with ``jitter=0`` exactly ``base``. ``attempts`` counts failures so far (1 after the
    first); values below 1 are taken as 1.
    """
    exponent = max(attempts, 1) - 1
    if initial == 0:
        base = 0.0  # 0 * anything, even once multiplier ** exponent overflows
    else:
        try:
            base = initial * multiplier**exponent
        except OverflowError:
            base = maximum
    base = min(base, maximum)
    return base * (1.0 - jitter * min(max(draw, 0.0), 1.0))


def _duration(name: str, value: object) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise ConfigurationError(
            f"exponential_backoff({name}=...) must be finite seconds >= 0 or a timedelta, "
            f"got {value!r}"
        )
    return float(seconds)


def exponential_backoff(
    *,
    initial: float | timedelta = 0.5,
    multiplier: float = 2.0,
    max: float | timedelta = 60.0,
    jitter: float = 0.2,
    random: Callable[[], float] | None = None,
) -> Callable[[RecordContext], float]:
    """A ready-made ``Options.retry_delay_provider``: ``initial`` after the first failure,
    times ``multiplier`` after each further one, capped at ``max``, each delay shortened at
    random by up to ``jitter`` (0 to 1) of itself so that records failing together spread out.

    ``random`` returns floats in [0, 1) (default :func:`random.random`); tests pass a seeded
    ``random.Random(...).random`` or a constant. See :func:`backoff_delay` for the maths.
    """
    first = _duration("initial", initial)
    cap = _duration("max", max)
    if cap < first:
        raise ConfigurationError(f"exponential_backoff(max={max!r}) must be >= initial={initial!r}")
    if (
        not isinstance(multiplier, int | float)
        or isinstance(multiplier, bool)
        or not math.isfinite(multiplier)
        or multiplier < 1
    ):
        raise ConfigurationError(
            f"exponential_backoff(multiplier=...) must be a finite number >= 1, got {multiplier!r}"
        )
    if not isinstance(jitter, int | float) or isinstance(jitter, bool) or not 0 <= jitter <= 1:
        raise ConfigurationError(
            f"exponential_backoff(jitter=...) must be a fraction from 0 to 1, got {jitter!r}"
        )
    draw = random if random is not None else _random.random
    if not callable(draw):
        raise ConfigurationError(
            f"exponential_backoff(random=...) must be a callable returning [0, 1), got {draw!r}"
        )
    factor = float(multiplier)
    spread = float(jitter)

    def provider(record: RecordContext) -> float:
        return backoff_delay(
            record.attempts,
            initial=first,
            multiplier=factor,
            maximum=cap,
            jitter=spread,
            draw=draw() if spread else 0.0,
        )

    provider.__qualname__ = (
        f"exponential_backoff(initial={first}, multiplier={factor}, max={cap}, jitter={spread})"
    )
    return provider
