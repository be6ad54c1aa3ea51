"""The in-flight table: every batch handed to a runner and not yet reported back (pure data).

One entry per handler call, ``batch id -> (items, started at, deadline)``. Runners report by
batch id only, so a process or Spark runner never needs the engine's ``WorkItem`` objects; the
table is also what deadlines, stall detection, spans and recovery from a crashed runner read.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from parallel_consumer.work.item import WorkItem

__all__ = ["Batch", "InFlight"]


class Batch:
    """One handler call: its records, when it was handed to the runner, and its deadline.

    A plain slotted class rather than a dataclass: one is built per call on the hot path, and
    the generated ``__init__`` of a slotted dataclass costs half as much again."""

    __slots__ = ("deadline", "id", "items", "started_at")

    def __init__(
        self,
        id: int,
        items: Sequence[WorkItem],
        started_at: float,
        deadline: float | None = None,
    ) -> None:
        self.id = id
        self.items = items
        self.started_at = started_at
        #: When the call should have ended (None: no deadline).
        self.deadline = deadline

    def __repr__(self) -> str:
        return f"<Batch {self.id} records={len(self.items)} started_at={self.started_at:.3f}>"


class InFlight:
    """Batches handed to the runner. Owned by the controller thread."""

    __slots__ = ("_batches", "_ids", "records")

    def __init__(self) -> None:
        self._batches: dict[int, Batch] = {}
        self._ids = itertools.count(1)
        #: Records inside the batches (what ``statistics().in_flight`` shows).
        self.records = 0

    def add(self, items: Sequence[WorkItem], now: float, deadline: float | None = None) -> Batch:
        batch = Batch(next(self._ids), items, now, deadline)
        self._batches[batch.id] = batch
        self.records += len(items)
        return batch

    def new_id(self) -> int:
        """An id no call has, for a write that is no handler call (a dead letter's)."""
        return next(self._ids)

    def pop(self, batch_id: int) -> Batch | None:
        """Remove and return a batch; None if it is not (or no longer) in flight."""
        batch = self._batches.pop(batch_id, None)
        if batch is not None:
            self.records -= len(batch.items)
        return batch

    def began(self, batch_id: int, at: float) -> None:
        """Call ``batch_id`` began at ``at``, after it was handed out (it waited behind the
        calls before it in a chain): its duration counts from then."""
        batch = self._batches.get(batch_id)
        if batch is not None and at > batch.started_at:
            batch.started_at = at

    def __iter__(self) -> Iterator[Batch]:
        return iter(self._batches.values())

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._batches

    def __len__(self) -> int:
        return len(self._batches)

    def __repr__(self) -> str:
        return f"<InFlight batches={len(self._batches)} records={self.records}>"
