"""The library's error tree, and the control signals a handler may raise.

The tree is shallow on purpose: callers catch :class:`ParallelConsumerError` for anything this
library raises, or one of its direct children when they care which part failed.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

__all__ = [
    "NEVER_RETRIED",
    "AccessDenied",
    "ConfigurationError",
    "DeadLetter",
    "DeadlineExceeded",
    "InternalError",
    "InvalidOutput",
    "ParallelConsumerError",
    "PartitionStalled",
    "ProduceError",
    "RetriesExhausted",
    "Retry",
    "SerializationError",
    "Skip",
]


class ParallelConsumerError(Exception):
    """Base class of every error this library raises."""


class ConfigurationError(ParallelConsumerError, ValueError):
    """A setting or an API call is invalid; the message names the setting and what to do."""


class InternalError(ParallelConsumerError):
    """The engine stopped because of a fault outside user code (the broker, the client, a bug).

    It is stored in ``ParallelConsumer.failure`` and re-raised by ``wait()`` and ``close()``;
    the original exception, if any, is its ``__cause__``.
    """


class DeadlineExceeded(ParallelConsumerError):
    """A handler call ran past ``Options.processing_timeout`` (see docs/deadlines.md).

    It is the failure of each record of the call (``RecordContext.last_failure``), which then
    takes the normal failure path: retried after the retry delay like any other failure. The
    call itself was cancelled (asyncio), its worker process replaced (process runner) or, on a
    thread that cannot be interrupted, left to finish with its late result ignored.
    """


class PartitionStalled(InternalError):
    """``Options.on_stall=StallPolicy.STOP``: a partition made no progress for
    ``Options.stall_threshold``; the consumer stopped (see docs/health.md)."""

    def __init__(
        self, message: str, *, topic: str, partition: int, offset: int, stalled_for: float
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        #: The partition's lowest unfinished offset: the record that held it.
        self.offset = offset
        self.stalled_for = stalled_for


class ProduceError(ParallelConsumerError):
    """An output of a ``poll_and_produce`` call was not delivered (or could not be sent). The
    call's input records fail with it (``RecordContext.last_failure``) and are retried; nothing
    is committed past them."""


class AccessDenied(ProduceError):
    """Kafka refused an output or a dead letter: the client's principal lacks a permission
    (an ACL, e.g. WRITE on the topic). The message names the permission and the resource. The
    call's records are retried until it is granted, never dead-lettered or skipped for it (no
    retry limit applies), so nothing is lost; ``health()`` is unhealthy meanwhile."""

    def __init__(self, message: str, *, topic: str | None = None) -> None:
        super().__init__(message)
        #: The topic the output or dead letter was refused on.
        self.topic = topic


class SerializationError(ParallelConsumerError):
    """A record's key or value could not be deserialized (``Options.key_deserializer`` /
    ``value_deserializer``), or an output's key or value could not be serialized. Never retried:
    the same bytes fail the same way. The record goes to ``on_retries_exhausted`` (by default
    the dead-letter topic, with its raw bytes); the original error is the ``__cause__``."""


class InvalidOutput(ParallelConsumerError, TypeError):
    """A ``poll_and_produce`` handler returned something that is not a ``ProducerRecord``, a
    list of them or ``None`` (or an output whose key or value is neither bytes nor str, with no
    serializer set). A programming error: never retried, the record goes to
    ``on_retries_exhausted``, and the message names what was returned."""


#: Failures that no retry can mend: they go straight to ``on_retries_exhausted``.
NEVER_RETRIED: tuple[type[BaseException], ...] = (SerializationError, InvalidOutput)


class Retry(Exception):
    """Raise from a handler to retry the record(s) after ``delay`` instead of the default delay.

    ``delay`` is seconds (int/float) or a :class:`~datetime.timedelta`; ``None`` keeps the
    configured retry delay. The failure is logged at DEBUG rather than as an error.
    """

    def __init__(self, message: str = "", *, delay: float | timedelta | None = None) -> None:
        super().__init__(message)
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        # NaN and infinity are refused like negatives: a NaN due time corrupts the retry queue's
        # order, and an infinite one pins the record (and its partition's commits) forever.
        if delay is not None and not (math.isfinite(delay) and delay >= 0):
            raise ValueError(f"Retry(delay=...) must be finite seconds >= 0, got {delay!r}")
        self.delay: float | None = None if delay is None else float(delay)


class Skip(Exception):
    """Raise from a handler (or pass to ``PollContext.fail``) to mark the record(s) done
    without processing them: committed, never retried, never dead-lettered. Counted in
    ``statistics().records_skipped_on_failure``; hooks see ``on_skip``."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class DeadLetter(Exception):
    """Raise from a handler (or pass to ``PollContext.fail``) to send the record(s) to the
    dead-letter topic now, without further retries. Needs dead-lettering to be on
    (``Options.dead_lettering``); otherwise there is nowhere to write it, and the record is
    retried after its retry delay with a WARNING naming it (see docs/failure-handling.md)."""

    def __init__(self, reason: str = "", *, cause: BaseException | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        if cause is not None:
            self.__cause__ = cause

    def __reduce__(self) -> tuple[Any, ...]:
        # An exception pickles as its class, its args and its __dict__: __cause__ would be lost.
        # The process runner sends a handler's DeadLetter back to the parent, whose dead-letter
        # headers name the cause, so the cause travels in the state (set back by setattr).
        return (type(self), self.args, {**self.__dict__, "__cause__": self.__cause__})


class RetriesExhausted(ParallelConsumerError):
    """Stored in ``ParallelConsumer.failure`` (and re-raised by ``wait()``/``close()``) when a
    record's failures hit ``OnExhausted.STOP``. The record's last error is its ``__cause__``;
    nothing was committed at or past the record."""
