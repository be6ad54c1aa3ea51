"""A close in progress: what was asked, its deadlines and phase, and what to do next.

Owned by the controller thread. :meth:`Closing.step` only decides (from facts the controller
hands it and the two clocks); the controller does what it returns. Deadlines for user work use
the engine's clock (``Options.shutdown_timeout``, ``close(timeout=...)``); the final commit and
the poller's stop wait for the broker and a thread, so they use real time even under a test's
virtual clock.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FINAL_COMMIT_RETRY",
    "FINAL_COMMIT_TIMEOUT",
    "STOP_TIMEOUT",
    "Closing",
    "Step",
    "checked_close_timeout",
]

log = logging.getLogger("parallel_consumer")

#: After the work is done, how long the final commit may take to be acknowledged.
FINAL_COMMIT_TIMEOUT = 10.0
#: Least time between two attempts of a final commit that failed.
FINAL_COMMIT_RETRY = 0.2
#: How long the poller (and, after a failure, the workers) may take to stop.
STOP_TIMEOUT = 10.0
#: The longest close timeout taken as given (a year): a larger one means "as long as it takes".
_LONGEST_CLOSE = 365 * 24 * 3600.0


def checked_close_timeout(timeout: float | None, default: float) -> float:
    """A close's timeout as given to ``close()``/``run()`` (None: ``default``), checked."""
    if timeout is None:
        return default
    if (
        not isinstance(timeout, int | float)
        or isinstance(timeout, bool)
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise ValueError(
            f"the close timeout must be finite seconds >= 0, got {timeout!r}: calls still "
            "running past it are abandoned (processed again later), never waited for forever"
        )
    # (a wait far longer than any deployment allows: beyond what a lock's timeout can take)
    return float(min(timeout, _LONGEST_CLOSE))


class Step(enum.Enum):
    """What the controller does next for the close."""

    WAIT = "wait"
    #: Work is over (done, or out of time): no call may start any more; send the final commit.
    STOP_RUNNER = "stop_runner"
    #: Tell the poller to close the Kafka client.
    STOP_POLLER = "stop_poller"
    DONE = "done"


class _Phase(enum.Enum):
    WORK = "work"  #: draining buffered records / waiting for in-flight calls
    FINAL_COMMIT = "final_commit"  #: waiting for the broker to acknowledge the final commit
    STOP_POLLER = "stop_poller"  #: waiting for the poller to close the client


@dataclass(slots=True)
class Closing:
    reply: Future[Any]
    #: Engine-clock time by which buffered (with drain) and in-flight work must be done.
    deadline: float
    #: Still running buffered records and retries (close(drain=True)).
    drain: bool
    _phase: _Phase = _Phase.WORK
    _commit_deadline: float = 0.0
    _next_commit_retry: float = 0.0
    _poller_deadline: float = 0.0

    def tighten(self, *, drain: bool, deadline: float) -> bool:
        """A second close() arrived: the stricter of both applies. True when it ends the drain
        (records not started must be dropped now)."""
        self.deadline = min(self.deadline, deadline)
        ends_drain = self.drain and not drain
        self.drain = self.drain and drain
        return ends_drain

    def step(
        self,
        now: float,
        real_now: float,
        *,
        work_left: bool,
        in_flight: bool,
        commit_pending: bool,
        resend_final_commit: Callable[[], bool],
        poller_stopped: Callable[[], bool],
    ) -> Step:
        """The next step at ``now`` (engine clock) / ``real_now`` (time.monotonic).

        ``work_left``: records waiting, in flight or waiting for a retry; ``in_flight``: calls
        running; ``commit_pending``: a final commit not yet answered; ``resend_final_commit``
        sends what is still uncommitted and says whether there was any.
        """
        if self._phase is _Phase.WORK:
            if self.drain:
                if work_left and now < self.deadline:
                    return Step.WAIT
                self.drain = False
            if in_flight and now < self.deadline:
                return Step.WAIT
            self._phase = _Phase.FINAL_COMMIT
            self._commit_deadline = real_now + FINAL_COMMIT_TIMEOUT
            return Step.STOP_RUNNER
        if self._phase is _Phase.FINAL_COMMIT:
            if not self._final_commit_settled(real_now, commit_pending, resend_final_commit):
                return Step.WAIT
            self._phase = _Phase.STOP_POLLER
            self._poller_deadline = real_now + STOP_TIMEOUT
            return Step.STOP_POLLER
        if poller_stopped():
            return Step.DONE
        if real_now >= self._poller_deadline:
            log.warning("the poller did not stop in time")
            return Step.DONE
        return Step.WAIT

    def _final_commit_settled(
        self, real_now: float, pending: bool, resend: Callable[[], bool]
    ) -> bool:
        """Acknowledged, or given up on. A final commit that failed is sent again (at most every
        FINAL_COMMIT_RETRY) until FINAL_COMMIT_TIMEOUT."""
        in_time = real_now < self._commit_deadline
        if pending:
            if not in_time:
                log.warning("the final commit was not acknowledged in time")
            return not in_time
        if real_now < self._next_commit_retry:
            return False
        if not in_time:
            return True
        self._next_commit_retry = real_now + FINAL_COMMIT_RETRY
        return not resend()
