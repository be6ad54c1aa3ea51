"""The dead-letter record format: header names, and building and reading them (pure, no I/O).

One contract shared by everything that writes or reads dead letters: the engine when a record
is dead-lettered, the PySpark runner's dead-letter rows, and ``pc dlq show`` / ``pc dlq redrive``.
A dead-lettered record keeps the original key, value and headers and gains the ``pc.dlq.*``
headers below. Header values are UTF-8 text (a lone surrogate backslash-escaped): integers in
decimal, times in ISO-8601 UTC with milliseconds (``2026-11-24T04:01:02.123Z``), so they read
well in any Kafka tool.

A redriven record (``pc dlq redrive``) loses its ``pc.dlq.*`` headers (its attempt count starts
again from zero) and gains the ``pc.redrive.*`` audit headers.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from parallel_consumer.errors import DeadLetter

__all__ = [
    "ATTEMPTS",
    "DELIVERY_COUNT",
    "DLQ_PREFIX",
    "ERROR_MESSAGE",
    "ERROR_MESSAGE_LIMIT",
    "ERROR_STACKTRACE",
    "ERROR_STACKTRACE_LIMIT",
    "ERROR_TYPE",
    "FIRST_FAILURE_AT",
    "GROUP",
    "LAST_FAILURE_AT",
    "ORIGINAL_OFFSET",
    "ORIGINAL_PARTITION",
    "ORIGINAL_TIMESTAMP",
    "ORIGINAL_TOPIC",
    "REASON",
    "REDRIVE_AT",
    "REDRIVE_COUNT",
    "REDRIVE_FROM",
    "REDRIVE_PREFIX",
    "TRACE_ID",
    "DeadLetterInfo",
    "Reason",
    "dead_letter_headers",
    "default_topic",
    "format_time",
    "read_dead_letter",
]

DLQ_PREFIX = "pc.dlq."
ORIGINAL_TOPIC = "pc.dlq.original.topic"
ORIGINAL_PARTITION = "pc.dlq.original.partition"
ORIGINAL_OFFSET = "pc.dlq.original.offset"
#: The original record's timestamp (its CreateTime or LogAppendTime), ISO-8601 UTC.
ORIGINAL_TIMESTAMP = "pc.dlq.original.timestamp"
#: Failed attempts before the record was dead-lettered (0 for ``DeadLetter`` on the first call).
ATTEMPTS = "pc.dlq.attempts"
#: Share groups only: how many times the broker delivered the record (its ``delivery_count``),
#: across every member of the group (docs/share-groups.md).
DELIVERY_COUNT = "pc.dlq.delivery.count"
#: Qualified name of the last error's type, e.g. ``builtins.ValueError``.
ERROR_TYPE = "pc.dlq.error.type"
#: ``str()`` of the last error, cut to :data:`ERROR_MESSAGE_LIMIT` characters (its type's
#: qualified name when ``str()`` raises).
ERROR_MESSAGE = "pc.dlq.error.message"
#: The last error's traceback as Python prints it; a longer one than
#: :data:`ERROR_STACKTRACE_LIMIT` characters keeps its end (the innermost frames and the error
#: line); a worker process of ``runner="process"`` sends it back as text. Empty when the error
#: was never raised.
ERROR_STACKTRACE = "pc.dlq.error.stacktrace"
FIRST_FAILURE_AT = "pc.dlq.first.failure.at"
LAST_FAILURE_AT = "pc.dlq.last.failure.at"
#: The consumer group that gave up on the record.
GROUP = "pc.dlq.group"
#: Why: one of :class:`Reason`'s values.
REASON = "pc.dlq.reason"
#: The W3C trace id of the record's processing span, when tracing is on.
TRACE_ID = "pc.dlq.trace.id"

REDRIVE_PREFIX = "pc.redrive."
#: When the record was redriven, ISO-8601 UTC.
REDRIVE_AT = "pc.redrive.at"
#: ``<dead-letter topic>/<partition>@<offset>``: where the redriven copy came from.
REDRIVE_FROM = "pc.redrive.from"
#: How many times this record has been redriven (1 on the first redrive).
REDRIVE_COUNT = "pc.redrive.count"

#: Error messages longer than this are cut (with a trailing "...").
ERROR_MESSAGE_LIMIT = 1000
#: Tracebacks longer than this keep their end (the frames nearest the error and the error line),
#: after a leading "...": a dead letter stays well under a broker's message size limit.
ERROR_STACKTRACE_LIMIT = 8000


class Reason:
    """Why a record was dead-lettered (the value of the :data:`REASON` header)."""

    #: ``max_retries`` failed attempts.
    RETRIES_EXHAUSTED = "retries-exhausted"
    #: The handler raised ``DeadLetter``.
    DEAD_LETTER = "dead-letter"
    #: The handler raised an exception of a type in ``Options.non_retryable``.
    NON_RETRYABLE = "non-retryable"
    #: The stall policy dead-lettered the record blocking its partition.
    STALLED = "stalled"

    ALL = (RETRIES_EXHAUSTED, DEAD_LETTER, NON_RETRYABLE, STALLED)


def default_topic(topic: str) -> str:
    """The dead-letter topic of ``topic`` when ``Options.dead_letter_topic`` is not set."""
    return f"{topic}.dlq"


def format_time(when: datetime | float | None) -> str:
    """ISO-8601 UTC with milliseconds; a float is seconds since the epoch."""
    if when is None:
        return ""
    if not isinstance(when, datetime):
        when = datetime.fromtimestamp(when, UTC)
    elif when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _parse_time(text: str) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _timestamp(millis: int | None) -> str:
    """A record's timestamp as header text; empty when it has none (None, or Kafka's -1)."""
    return format_time(millis / 1000) if millis is not None and millis >= 0 else ""


def _cut(text: str) -> str:
    if len(text) <= ERROR_MESSAGE_LIMIT:
        return text
    return text[: ERROR_MESSAGE_LIMIT - 3] + "..."


def _stacktrace(error: BaseException) -> str:
    """``error``'s traceback (with its causes) as Python prints it, its end kept within
    :data:`ERROR_STACKTRACE_LIMIT`; empty when it was never raised here."""
    if error.__traceback__ is None:
        # (an error from a worker process of runner="process" brings its traceback as text)
        remote = getattr(error, "_pc_remote_traceback", None) or getattr(
            error, "remote_traceback", None
        )
        text = remote if isinstance(remote, str) else ""
    else:
        try:
            text = "".join(traceback.format_exception(error))
        except BaseException:  # an odd __str__ inside the chain must not stop the write
            return ""
    if len(text) <= ERROR_STACKTRACE_LIMIT:
        return text
    return "..." + text[-(ERROR_STACKTRACE_LIMIT - 3) :]


def _type_name(error: BaseException) -> str:
    kind = type(error)
    return f"{kind.__module__}.{kind.__qualname__}"


def _message(error: BaseException) -> str:
    """``str(error)``, or its type's name when that fails (an odd ``__str__`` must not stop the
    record's dead letter from being written)."""
    try:
        text = str(error)
    except BaseException:  # whatever a __str__ raises
        return _type_name(error)
    return text if isinstance(text, str) else _type_name(error)


Header = tuple[str, bytes]


def dead_letter_headers(
    *,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    attempts: int,
    error: BaseException | None,
    first_failure_at: datetime | None,
    last_failure_at: datetime | None,
    group: str,
    reason: str,
    trace_id: str | None = None,
    original_headers: Sequence[Header] | None = None,
    delivery_count: int | None = None,
) -> list[Header]:
    """The headers of a dead-lettered record: its own headers (any stale ``pc.dlq.*`` from an
    earlier dead-lettering dropped) followed by the ``pc.dlq.*`` ones. The one builder of them,
    for the engine and the Spark runner alike.

    ``timestamp_ms`` is the record's timestamp in milliseconds since the epoch: None, or
    Kafka's -1 (any negative value), when it has none, which leaves :data:`ORIGINAL_TIMESTAMP`
    empty; 0 is the epoch itself, a timestamp like any other. ``error`` is the record's last
    error; for ``raise DeadLetter(...) from exc`` (or ``DeadLetter(cause=exc)``) the headers
    name ``exc``, else the error itself.
    """
    if reason not in Reason.ALL:
        raise ValueError(f"unknown dead-letter reason {reason!r}; expected one of {Reason.ALL}")
    if isinstance(error, DeadLetter) and error.__cause__ is not None:
        error = error.__cause__
    kept = [(k, v) for k, v in (original_headers or ()) if not k.startswith(DLQ_PREFIX)]
    ours: list[tuple[str, str]] = [
        (ORIGINAL_TOPIC, topic),
        (ORIGINAL_PARTITION, str(partition)),
        (ORIGINAL_OFFSET, str(offset)),
        (ORIGINAL_TIMESTAMP, _timestamp(timestamp_ms)),
        (ATTEMPTS, str(attempts)),
        (ERROR_TYPE, _type_name(error) if error is not None else ""),
        (ERROR_MESSAGE, _cut(_message(error)) if error is not None else ""),
        (ERROR_STACKTRACE, _stacktrace(error) if error is not None else ""),
        (FIRST_FAILURE_AT, format_time(first_failure_at)),
        (LAST_FAILURE_AT, format_time(last_failure_at)),
        (GROUP, group),
        (REASON, reason),
    ]
    if trace_id:
        ours.append((TRACE_ID, trace_id))
    if delivery_count is not None:
        ours.append((DELIVERY_COUNT, str(delivery_count)))
    # backslashreplace: a lone surrogate (in a message, or a topic name) must not fail the write
    return kept + [(k, v.encode("utf-8", errors="backslashreplace")) for k, v in ours]


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """What the ``pc.dlq.*`` headers of a dead-lettered record say."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime | None
    attempts: int
    error_type: str
    error_message: str
    first_failure_at: datetime | None
    last_failure_at: datetime | None
    group: str
    reason: str
    trace_id: str | None
    redrive_count: int
    #: The last error's traceback (:data:`ERROR_STACKTRACE`), empty when none was recorded.
    error_stacktrace: str = ""


def _as_map(headers: Iterable[tuple[str, bytes | str | None]] | None) -> Mapping[str, str]:
    out: dict[str, str] = {}
    for key, value in headers or ():
        if value is None:
            text = ""
        elif isinstance(value, bytes):
            text = value.decode("utf-8", errors="replace")
        else:
            text = value
        out[key] = text  # the last occurrence wins, as in most Kafka tools
    return out


def _int(text: str | None, default: int = -1) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def read_dead_letter(
    headers: Iterable[tuple[str, bytes | str | None]] | None,
) -> DeadLetterInfo | None:
    """Parse the ``pc.dlq.*`` headers; None when the record has no original topic header (it
    was not written by this library's dead-lettering)."""
    found = _as_map(headers)
    if ORIGINAL_TOPIC not in found:
        return None
    return DeadLetterInfo(
        topic=found[ORIGINAL_TOPIC],
        partition=_int(found.get(ORIGINAL_PARTITION)),
        offset=_int(found.get(ORIGINAL_OFFSET)),
        timestamp=_parse_time(found.get(ORIGINAL_TIMESTAMP, "")),
        attempts=_int(found.get(ATTEMPTS), 0),
        error_type=found.get(ERROR_TYPE, ""),
        error_message=found.get(ERROR_MESSAGE, ""),
        error_stacktrace=found.get(ERROR_STACKTRACE, ""),
        first_failure_at=_parse_time(found.get(FIRST_FAILURE_AT, "")),
        last_failure_at=_parse_time(found.get(LAST_FAILURE_AT, "")),
        group=found.get(GROUP, ""),
        reason=found.get(REASON, ""),
        trace_id=found.get(TRACE_ID) or None,
        redrive_count=_int(found.get(REDRIVE_COUNT), 0),
    )
