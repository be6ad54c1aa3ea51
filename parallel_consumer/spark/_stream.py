"""Lanes that keep running while more records arrive: the Spark task's way to overlap reading
with processing.

:func:`parallel_consumer.spark._core.process` takes a whole slice and returns when it is done;
a Spark task, though, receives its records in Arrow batches, and the JVM reads the next batch
(from Kafka) while Python works on the last. :class:`LaneStream` takes each batch as it comes
(:meth:`LaneStream.feed`), appends its records to their lanes' queues and starts idle lanes on
the task's thread pool; a lane takes its records in order, so per-key order holds across
batches. :meth:`LaneStream.take` returns the rows finished so far, each lane's in order, and
:meth:`LaneStream.wait_idle` waits a while for every lane to be idle and
:meth:`LaneStream.finish` until they are. Owned by the task's thread; the lane workers
share only ``_lock``-guarded queues with it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor

from parallel_consumer.context import PollContext
from parallel_consumer.options import Options
from parallel_consumer.spark._lane import Lane, lane_key, run_record
from parallel_consumer.spark._records import InputRecord, OutputRow, PartitionTally

__all__ = ["LaneStream"]


class _Queue:
    """One lane: its records waiting, whether a worker runs it, and its finished rows."""

    __slots__ = ("lane", "running", "waiting")

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.waiting: deque[InputRecord] = deque()
        self.running = False


class LaneStream:
    """Records fed batch by batch; lanes run across batches on ``executor``."""

    def __init__(
        self,
        handler: Callable[[PollContext], object],
        options: Options,
        group: str,
        executor: Executor,
        *,
        sleep: Callable[[float], None] = time.sleep,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._handler = handler
        self._options = options
        self._group = group
        self._executor = executor
        self._sleep = sleep
        self._wall = wall
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queues: dict[object, _Queue] = {}
        self._running = 0
        self._stopping = threading.Event()
        self._error: BaseException | None = None

    def feed(self, records: Iterable[InputRecord]) -> None:
        """Queue ``records`` (whole partitions' next offsets, in order) on their lanes."""
        self._raise_if_failed()
        ordering = self._options.ordering
        start: list[_Queue] = []
        with self._lock:
            for record in records:
                key = lane_key(record, ordering)
                queue = self._queues.get(key)
                if queue is None:
                    queue = self._queues[key] = _Queue(Lane(self._options, self._group, self._wall))
                queue.waiting.append(record)
                if not queue.running:
                    queue.running = True
                    self._running += 1
                    start.append(queue)
        for queue in start:
            self._executor.submit(self._drain, queue)

    def _drain(self, queue: _Queue) -> None:
        while True:
            with self._lock:
                if not queue.waiting or self._stopping.is_set():
                    queue.running = False
                    self._running -= 1
                    self._idle.notify_all()
                    return
                record = queue.waiting.popleft()
            try:
                run_record(queue.lane, record, self._handler, self._sleep, self._stopping)
            except BaseException as exc:
                with self._lock:
                    if self._error is None:
                        self._error = exc
                    self._stopping.set()
                    queue.running = False
                    self._running -= 1
                    self._idle.notify_all()
                return

    def take(self) -> list[OutputRow]:
        """The rows finished since the last call, lane by lane (each lane's in order)."""
        self._raise_if_failed()
        out: list[OutputRow] = []
        with self._lock:
            queues = list(self._queues.values())
        for queue in queues:
            rows = queue.lane.rows
            done = len(rows)  # the lane's worker only appends: the first `done` are final
            if done:
                out.extend(rows[:done])
                del rows[:done]
        return out

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: as long as it takes) for every lane to be
        idle; True once they are."""
        with self._lock:
            return self._idle.wait_for(lambda: not self._running, timeout)

    def finish(self) -> tuple[list[OutputRow], dict[tuple[str, int], PartitionTally]]:
        """Wait until every lane is idle; the remaining rows, and the tallies per partition."""
        self.wait_idle()
        self._raise_if_failed()
        tallies: dict[tuple[str, int], PartitionTally] = {}
        for queue in self._queues.values():
            for tp, tally in queue.lane.tally_of.items():
                tallies.setdefault(tp, PartitionTally()).add(tally)
        return self.take(), tallies

    def close(self) -> None:
        """Stop the lanes (after an error or an abandoned task) and wait for them."""
        self._stopping.set()
        self.wait_idle()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def __repr__(self) -> str:
        return f"<LaneStream lanes={len(self._queues)} running={self._running}>"
