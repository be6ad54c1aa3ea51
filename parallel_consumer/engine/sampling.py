"""Which calls metrics see: a periodic sample, and every slow call (hooks.CallSampling).
Owned by the controller thread; one comparison per call when neither is due.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from parallel_consumer._events import RunDone
from parallel_consumer.hooks import CallSampling
from parallel_consumer.work.inflight import Batch
from parallel_consumer.work.runs import Run

__all__ = ["Samples"]

log = logging.getLogger("parallel_consumer")


class Samples:
    """Hands calls to ``sampling`` (None: metrics off), and knows when the next periodic
    sample is due."""

    def __init__(self, sampling: CallSampling | None) -> None:
        self.sampling = sampling
        self.next_at = 0.0

    def due(self, sampling: CallSampling, finished_at: float, took: float) -> bool | None:
        """Whether metrics take a call that took ``took`` and ended at ``finished_at``: None
        if not; else whether it is the periodic sample (then the next one is an interval
        later) rather than a slow call."""
        periodic = finished_at >= self.next_at
        if not periodic and took <= sampling.slow_after:
            return None
        if periodic and sampling.interval is not None:
            self.next_at = finished_at + sampling.interval
        return periodic

    def call(
        self, batch: Batch, errors: Sequence[BaseException | None], finished_at: float
    ) -> None:
        """Hand the call to metrics if a periodic sample is due or it was slow."""
        sampling = self.sampling
        assert sampling is not None
        duration = finished_at - batch.started_at
        periodic = self.due(sampling, finished_at, duration)
        if periodic is None:
            return
        try:
            sampling.sample([i.message for i in batch.items], errors, duration, periodic)
        except Exception:
            log.warning("metrics failed to take a sample of a call", exc_info=True)

    def run(self, run: Run, event: RunDone) -> None:
        """The calls of a run its worker timed."""
        sampling = self.sampling
        assert sampling is not None
        finished_at = event.finished_at
        for index, took in event.samples:
            periodic = self.due(sampling, finished_at, took)
            if periodic is None:
                continue
            error = event.error if index == event.ok else None
            try:
                sampling.sample([run.messages[index]], (error,), took, periodic)
            except Exception:
                log.warning("metrics failed to take a sample of a call", exc_info=True)
