"""What happens to a record after a handler call: a pure decision over its outcome.

``decide`` is the one place that turns an outcome into the next state of a record: done, retry
later, dead-letter now, skip now, or stop the consumer. The controller only carries the
decision out. The table it implements is in docs/failure-handling.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from parallel_consumer.context import RecordContext
from parallel_consumer.dead_letter import Reason
from parallel_consumer.errors import NEVER_RETRIED, AccessDenied, DeadLetter, Skip
from parallel_consumer.options import OnExhausted, Options
from parallel_consumer.retry import retry_delay

__all__ = [
    "DeadLetterNow",
    "Decision",
    "RetryAt",
    "SkipNow",
    "StopNow",
    "Succeeded",
    "counts_as_attempt",
    "decide",
    "exhausted_decision",
    "failed_attempts",
]

log = logging.getLogger("parallel_consumer")


@dataclass(frozen=True, slots=True)
class Succeeded:
    """The record is done: its offset leaves the incomplete set."""


@dataclass(frozen=True, slots=True)
class RetryAt:
    """Run the record again once the clock reaches ``due`` (``delay`` after the failure)."""

    due: float
    delay: float


@dataclass(frozen=True, slots=True)
class DeadLetterNow:
    """Write the record to its dead-letter topic; it is done once the broker acknowledged.
    ``reason`` is a :class:`~parallel_consumer.dead_letter.Reason` value."""

    reason: str
    #: The policy for exhausted retries chose this (counts in ``retries_exhausted``).
    exhausted: bool = False


@dataclass(frozen=True, slots=True)
class SkipNow:
    """Mark the record done without processing it further."""

    reason: str
    exhausted: bool = False


@dataclass(frozen=True, slots=True)
class StopNow:
    """Stop the consumer; nothing commits at or past the record. ``message`` says why."""

    message: str
    exhausted: bool = False


Decision = Succeeded | RetryAt | DeadLetterNow | SkipNow | StopNow

SUCCEEDED = Succeeded()


def decide(
    error: BaseException | None, record: RecordContext, finished_at: float, options: Options
) -> Decision:
    """The next step for a record whose call ended at ``finished_at`` with ``error``.

    ``record`` describes the attempt that just failed (``attempts`` already counts it). In
    order: no error is success; ``Skip`` skips; ``DeadLetter`` dead-letters (or, with
    dead-lettering off, retries with a WARNING); a ``NEVER_RETRIED`` or ``non_retryable`` type,
    or more than ``max_retries`` failed retries, applies the exhaustion policy (but never to
    an :class:`~parallel_consumer.errors.AccessDenied`: a missing permission is granted, not
    given up on); anything else retries after :func:`~parallel_consumer.retry.retry_delay`.
    """
    if error is None:
        return SUCCEEDED
    if isinstance(error, Skip):
        return SkipNow(error.reason or "Skip raised by the handler")
    if isinstance(error, DeadLetter):
        if not options.dead_lettering:
            return _nowhere_to_dead_letter(Reason.DEAD_LETTER, error, record, finished_at, options)
        return DeadLetterNow(Reason.DEAD_LETTER)
    if isinstance(error, NEVER_RETRIED) or (
        options.non_retryable and isinstance(error, options.non_retryable)
    ):
        return exhausted_decision(Reason.NON_RETRYABLE, error, record, options, finished_at)
    if (
        options.max_retries is not None
        and record.attempts > options.max_retries
        and not isinstance(error, AccessDenied)
    ):
        return exhausted_decision(Reason.RETRIES_EXHAUSTED, error, record, options, finished_at)
    delay = retry_delay(options, error, record)
    return RetryAt(finished_at + delay, delay)


def counts_as_attempt(error: BaseException, options: Options) -> bool:
    """Whether ``error`` ending a call is a failed attempt of its record (its attempt count and
    failure times move on before :func:`decide`). Raising ``Skip``, or ``DeadLetter`` while
    dead-lettering is on, is not: it is the handler's decision, and the record's history stays
    as it was. A ``DeadLetter`` with nowhere to go is retried like any failure (see
    :func:`decide`), so it counts."""
    if isinstance(error, Skip):
        return False
    return not (isinstance(error, DeadLetter) and options.dead_lettering)


def failed_attempts(count: int) -> str:
    """``"1 failed attempt"``, ``"3 failed attempts"``: for log lines and messages."""
    return f"{count} failed attempt{'' if count == 1 else 's'}"


def exhausted_decision(
    reason: str,
    error: BaseException,
    record: RecordContext,
    options: Options,
    finished_at: float | None = None,
) -> DeadLetterNow | SkipNow | StopNow | RetryAt:
    """``Options.on_retries_exhausted`` (or what ``retries_exhausted_callback`` returns for
    this record) as a decision. A dead letter while dead-lettering is off is a retry (with a
    WARNING) when ``finished_at`` is given, else a stop."""
    policy = options.on_retries_exhausted
    callback = options.retries_exhausted_callback
    if callback is not None:
        try:
            chosen = callback(record, error)
        except BaseException:  # even SystemExit: a callback bug must not stop us
            log.warning(
                "retries_exhausted_callback failed for %r; applying on_retries_exhausted=%s",
                record,
                policy.name,
                exc_info=True,
            )
        else:
            if isinstance(chosen, OnExhausted):
                policy = chosen
            elif chosen is not None:
                log.warning(
                    "retries_exhausted_callback returned %r (not an OnExhausted or None); "
                    "applying on_retries_exhausted=%s",
                    chosen,
                    policy.name,
                )
    if policy is OnExhausted.SKIP:
        return SkipNow(reason, exhausted=True)
    if policy is OnExhausted.STOP:
        return StopNow(
            f"{record.topic}[{record.partition}]@{record.offset} failed for good ({reason}, "
            f"{failed_attempts(record.attempts)}) and on_retries_exhausted is STOP: {error!r}",
            exhausted=True,
        )
    if not options.dead_lettering and finished_at is not None:
        return _nowhere_to_dead_letter(reason, error, record, finished_at, options)
    return _dead_letter_or_stop(reason, options, exhausted=True)


def _nowhere_to_dead_letter(
    reason: str, error: BaseException, record: RecordContext, finished_at: float, options: Options
) -> RetryAt:
    """A record is to be dead-lettered but no dead-letter topic was prepared (dead-lettering
    is off): dropping it would lose it and stopping would halt every partition for one record,
    so it waits for its retry delay and runs again, with a WARNING that names it and says how
    to turn dead-lettering on (at its 1st, 2nd, 4th, 8th... such attempt; DEBUG between, so
    that a record retried for a long time is still named now and then)."""
    attempts = record.attempts
    level = logging.WARNING if attempts & (attempts - 1) == 0 else logging.DEBUG
    log.log(
        level,
        "%s[%s]@%s is to be dead-lettered (%s: %r) but dead-lettering is off; it is retried "
        "instead (attempt %d). Set Options.dead_letter_topic (or max_retries / non_retryable "
        "with on_retries_exhausted=DEAD_LETTER) to write it to a dead-letter topic",
        record.topic,
        record.partition,
        record.offset,
        reason,
        error,
        record.attempts,
    )
    delay = retry_delay(options, error, record)
    return RetryAt(finished_at + delay, delay)


def _dead_letter_or_stop(
    reason: str, options: Options, *, exhausted: bool
) -> DeadLetterNow | StopNow:
    if options.dead_lettering:
        return DeadLetterNow(reason, exhausted=exhausted)
    return StopNow(
        f"a record is to be dead-lettered ({reason}) but dead-lettering is off: set "
        "Options.dead_letter_topic (or max_retries / non_retryable with "
        "on_retries_exhausted=DEAD_LETTER) so that a dead-letter topic is prepared at start",
        exhausted=exhausted,
    )
