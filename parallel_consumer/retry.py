"""Retry timing: pure functions from a failure to the delay before the next attempt."""

from __future__ import annotations

import logging
from datetime import timedelta

from parallel_consumer.context import RecordContext
from parallel_consumer.errors import Retry
from parallel_consumer.options import Options

__all__ = ["retry_delay"]

log = logging.getLogger("parallel_consumer")


def retry_delay(options: Options, error: BaseException, record: RecordContext) -> float:
    """Seconds to wait before ``record`` is tried again after ``error``.

    ``Retry(delay=...)`` raised by the handler wins; then ``Options.retry_delay_provider`` (which
    sees the attempt count including this failure); then ``Options.retry_delay``. A provider
    that fails or returns nonsense falls back to ``retry_delay`` with a warning, because a bug in
    it must not stop the consumer.
    """
    if isinstance(error, Retry) and error.delay is not None:
        return error.delay
    provider = options.retry_delay_provider
    if provider is None:
        return options.retry_delay
    try:
        value = provider(record)
        seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    except Exception:
        log.warning("retry_delay_provider failed; using retry_delay", exc_info=True)
        return options.retry_delay
    if not seconds >= 0:  # also catches NaN
        log.warning("retry_delay_provider returned %r; using retry_delay", value)
        return options.retry_delay
    return seconds
