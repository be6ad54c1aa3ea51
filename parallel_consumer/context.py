"""Read-only views of records handed to user functions.

A :class:`RecordContext` is a snapshot taken when the record is dispatched: its ``attempts`` and
``last_failure`` describe the attempts *before* this one and never change under the handler.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["PollContext", "RecordContext"]

Headers = list[tuple[str, bytes | None]]


class RecordContext:
    """One Kafka record plus its processing history.

    ``message`` is the underlying :class:`confluent_kafka.Message`.
    """

    __slots__ = ("_message", "attempts", "last_failure", "last_failure_at")

    def __init__(
        self,
        message: Any,
        attempts: int = 0,
        last_failure: BaseException | None = None,
        last_failure_at: datetime | None = None,
    ) -> None:
        self._message = message
        #: Failed attempts before this one (0 on the first attempt).
        self.attempts = attempts
        #: The exception of the latest failed attempt, if any.
        self.last_failure = last_failure
        #: When the latest failed attempt ended (UTC), if any.
        self.last_failure_at = last_failure_at

    @property
    def message(self) -> Any:
        return self._message

    @property
    def topic(self) -> str:
        return self._message.topic()  # type: ignore[no-any-return]

    @property
    def partition(self) -> int:
        return self._message.partition()  # type: ignore[no-any-return]

    @property
    def offset(self) -> int:
        return self._message.offset()  # type: ignore[no-any-return]

    @property
    def key(self) -> bytes | None:
        return self._message.key()  # type: ignore[no-any-return]

    @property
    def value(self) -> bytes | None:
        return self._message.value()  # type: ignore[no-any-return]

    @property
    def raw_key(self) -> bytes | None:
        """The key's bytes as stored in Kafka (``key`` is the deserialized key when
        ``Options.key_deserializer`` is set)."""
        return self._message.key()  # type: ignore[no-any-return]

    @property
    def raw_value(self) -> bytes | None:
        """The value's bytes as stored in Kafka (``value`` is the deserialized value when
        ``Options.value_deserializer`` is set)."""
        return self._message.value()  # type: ignore[no-any-return]

    @property
    def headers(self) -> Headers:
        return self._message.headers() or []

    @property
    def timestamp(self) -> datetime | None:
        """The record's timestamp (create or log-append time) in UTC, or None if absent."""
        kind, millis = self._message.timestamp()
        if kind == 0 or millis is None or millis < 0:  # TIMESTAMP_NOT_AVAILABLE
            return None
        return datetime.fromtimestamp(millis / 1000, tz=UTC)

    def __repr__(self) -> str:
        if self._message is None:  # a bare context (tests, tools): the warnings naming it still log
            return f"<RecordContext (no message) attempts={self.attempts}>"
        return (
            f"<RecordContext {self.topic}[{self.partition}]@{self.offset} "
            f"key={self.key!r} attempts={self.attempts}>"
        )


class PollContext(Sequence[RecordContext]):
    """What a handler receives: one record, or up to ``Options.batch_size`` records.

    Single-record shortcuts (``key``, ``value``, ``offset``, ...) read ``.record`` and raise
    ``ValueError`` when the context holds more than one record.

    :meth:`fail` fails single records of a batch while the others succeed.
    """

    __slots__ = ("_failed", "_keep_alive", "_records")

    def __init__(
        self,
        records: Sequence[RecordContext],
        *,
        keep_alive: Callable[[float], None] | None = None,
    ) -> None:
        self._records = tuple(records)
        #: Set by the engine when the call has a deadline (``Options.processing_timeout``).
        self._keep_alive = keep_alive
        #: Index -> exception, set by fail() on the thread that runs the handler.
        self._failed: dict[int, BaseException] = {}

    @classmethod
    def of_one(cls, record: RecordContext) -> PollContext:
        """A context of one record without a deadline (the hot path: no sequence to copy)."""
        context = cls.__new__(cls)
        context._records = (record,)
        context._keep_alive = None
        context._failed = {}
        return context

    def derived(self, records: Sequence[RecordContext]) -> PollContext:
        """A context of ``records`` (standing for records of this call) with this call's
        deadline: what a wrapper of the handler hands on."""
        return PollContext(records, keep_alive=self._keep_alive)

    def fail(self, record: RecordContext, error: BaseException) -> None:
        """Fail one record of this call; the others succeed when the handler returns.

        ``error`` is what the record failed with: any exception (retried, or given up on per
        ``Options.max_retries`` / ``non_retryable``), or a signal (``Retry(delay=...)``,
        ``Skip(...)``, ``DeadLetter(...)``). Failing a record twice keeps the last error. If the
        handler raises anyway, the whole call fails with that exception.
        """
        if not isinstance(error, BaseException):
            raise TypeError(f"PollContext.fail() needs an exception instance, got {error!r}")
        for index, candidate in enumerate(self._records):
            if candidate is record:
                self._failed[index] = error
                return
        for index, candidate in enumerate(self._records):
            if (candidate.topic, candidate.partition, candidate.offset) == (
                record.topic,
                record.partition,
                record.offset,
            ):
                self._failed[index] = error
                return
        raise ValueError(f"{record!r} is not a record of this call ({self!r})")

    @property
    def has_failures(self) -> bool:
        """:meth:`fail` was called (cheap: runners ask after every call)."""
        return bool(self._failed)

    @property
    def failures(self) -> dict[int, BaseException]:
        """What :meth:`fail` recorded: the index of each failed record -> its exception."""
        return dict(self._failed)

    def outcomes(self, error: BaseException | None) -> tuple[BaseException | None, ...]:
        """One outcome per record for a call that raised ``error`` (every record fails with
        it) or returned (``error`` None: the records passed to :meth:`fail` fail, the others
        succeed). Runners report this."""
        if error is not None:
            return (error,) * len(self._records)
        failed = self._failed
        if not failed:
            return (None,) * len(self._records)
        return tuple(failed.get(index) for index in range(len(self._records)))

    def extend_deadline(self, seconds: float | timedelta) -> None:
        """Keep this call's records alive: its deadline becomes at least ``seconds`` from now.

        Only meaningful with ``Options.processing_timeout``; without one (or on a context built
        by hand, as in a unit test of a handler) it does nothing. Thread-safe and non-blocking:
        call it from the handler's thread, from an ``async def`` handler, from a thread the
        handler started, or from a handler in a worker process of ``runner="process"`` (it
        travels over the worker's pipe). See docs/deadlines.md.
        """
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        if (
            not isinstance(seconds, int | float)
            or isinstance(seconds, bool)
            or not math.isfinite(seconds)
            or seconds <= 0
        ):
            raise ValueError(
                f"extend_deadline() takes seconds > 0 (int, float or timedelta), got {seconds!r}"
            )
        if self._keep_alive is not None:
            self._keep_alive(float(seconds))

    @property
    def records(self) -> tuple[RecordContext, ...]:
        return self._records

    @property
    def record(self) -> RecordContext:
        if len(self._records) != 1:
            raise ValueError(
                f"PollContext holds {len(self._records)} records; use .records (batch_size > 1)"
            )
        return self._records[0]

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[RecordContext]:
        return iter(self._records)

    def __getitem__(self, index: Any) -> Any:
        return self._records[index]

    @property
    def key(self) -> bytes | None:
        return self.record.key

    @property
    def value(self) -> bytes | None:
        return self.record.value

    @property
    def headers(self) -> Headers:
        return self.record.headers

    @property
    def topic(self) -> str:
        return self.record.topic

    @property
    def partition(self) -> int:
        return self.record.partition

    @property
    def offset(self) -> int:
        return self.record.offset

    @property
    def timestamp(self) -> datetime | None:
        return self.record.timestamp

    @property
    def attempts(self) -> int:
        return self.record.attempts

    @property
    def last_failure(self) -> BaseException | None:
        return self.record.last_failure

    @property
    def last_failure_at(self) -> datetime | None:
        return self.record.last_failure_at

    def __repr__(self) -> str:
        if len(self._records) == 1:
            return f"<PollContext {self._records[0]!r}>"
        return f"<PollContext {len(self._records)} records>"
