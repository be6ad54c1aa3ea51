"""The failure-handling settings of :class:`~parallel_consumer.options.Options`: the
exhaustion policy and the checks of ``max_retries``, ``on_retries_exhausted``,
``retries_exhausted_callback``, ``non_retryable`` and ``dead_letter_topic`` (kept apart so that
options.py stays small; it takes the fields, not the Options, so that it depends on nothing
but errors.py). See docs/failure-handling.md."""

from __future__ import annotations

import enum

from parallel_consumer.errors import ConfigurationError, DeadLetter, Retry, Skip

__all__ = ["OnExhausted", "checked_failure_settings"]


class OnExhausted(enum.Enum):
    """What happens to a record whose retries are exhausted (``Options.max_retries`` failed
    retries, or an exception listed in ``Options.non_retryable``). See
    docs/failure-handling.md."""

    #: Write it to the dead-letter topic; its offset commits once the broker acknowledged it.
    DEAD_LETTER = "dead_letter"
    #: Mark it done without further processing (logged at WARNING; committed).
    SKIP = "skip"
    #: Stop the consumer (``pc.failure`` is a RetriesExhausted); nothing commits at or past it.
    STOP = "stop"


def _policy(value: object) -> OnExhausted:
    if isinstance(value, OnExhausted):
        return value
    if isinstance(value, str):
        for member in OnExhausted:
            if value.lower() in (member.name.lower(), member.value):
                return member
    choices = ", ".join(f"OnExhausted.{m.name}" for m in OnExhausted)
    raise ConfigurationError(
        f"Options.on_retries_exhausted must be one of {choices}; got {value!r}"
    )


def checked_failure_settings(
    *,
    max_retries: object,
    on_retries_exhausted: object,
    retries_exhausted_callback: object,
    non_retryable: object,
    dead_letter_topic: object,
) -> tuple[OnExhausted, tuple[type[BaseException], ...]]:
    """Check the failure-handling fields of Options (passed as they were given); returns
    ``on_retries_exhausted`` as an OnExhausted and ``non_retryable`` as a tuple (a single class
    or a list is accepted too)."""
    retries = max_retries
    if retries is not None and (
        not isinstance(retries, int) or isinstance(retries, bool) or retries < 0
    ):
        raise ConfigurationError(
            f"Options.max_retries must be an int >= 0 (0: give up at the first failure) or "
            f"None (retry forever), got {retries!r}"
        )
    policy = _policy(on_retries_exhausted)
    callback = retries_exhausted_callback
    if callback is not None and not callable(callback):
        raise ConfigurationError(
            "Options.retries_exhausted_callback must be a callable taking (RecordContext, "
            f"exception), got {callback!r}"
        )
    kinds: object = non_retryable
    if isinstance(kinds, type):
        kinds = (kinds,)
    if not isinstance(kinds, tuple | list | frozenset | set):
        raise ConfigurationError(
            f"Options.non_retryable must be a tuple of exception types, got {kinds!r}"
        )
    for kind in kinds:
        if not isinstance(kind, type) or not issubclass(kind, BaseException):
            raise ConfigurationError(
                f"Options.non_retryable must hold exception types (classes), got {kind!r}"
            )
        if issubclass(kind, Retry | Skip | DeadLetter):
            raise ConfigurationError(
                f"Options.non_retryable lists {kind.__name__}, a control signal with its "
                "own meaning (Retry retries, Skip skips, DeadLetter dead-letters); remove it"
            )
    topic = dead_letter_topic
    if topic is not None and (not isinstance(topic, str) or not topic or topic.startswith("^")):
        raise ConfigurationError(
            "Options.dead_letter_topic must be a topic name (not a regex), or None for "
            f"'<topic>.dlq' per input topic, got {topic!r}"
        )
    return policy, tuple(kinds)
