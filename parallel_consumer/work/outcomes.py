"""What happens to a record after a handler call: a pure decision over its outcome.

``decide`` is the one place that turns an outcome into the next state of a record. The
failure-handling work extends it (max retries, dead letters, skip, stop) without touching the
controller, which only carries out the decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from parallel_consumer.context import RecordContext
from parallel_consumer.options import Options
from parallel_consumer.retry import retry_delay

__all__ = ["Decision", "RetryAt", "Succeeded", "decide"]


@dataclass(frozen=True, slots=True)
class Succeeded:
    """The record is done: its offset leaves the incomplete set."""


@dataclass(frozen=True, slots=True)
class RetryAt:
    """Run the record again once the clock reaches ``due`` (``delay`` after the failure)."""

    due: float
    delay: float


Decision = Succeeded | RetryAt

SUCCEEDED = Succeeded()


def decide(
    error: BaseException | None, record: RecordContext, finished_at: float, options: Options
) -> Decision:
    """The next step for a record whose call ended at ``finished_at`` with ``error``.

    ``record`` describes the attempt that just failed (``attempts`` already counts it); the
    delay comes from :func:`~parallel_consumer.retry.retry_delay`.
    """
    if error is None:
        return SUCCEEDED
    delay = retry_delay(options, error, record)
    return RetryAt(finished_at + delay, delay)
