"""Deadlines of handler calls, and calls that outlived theirs (pure data, no clock, no threads).

With ``Options.processing_timeout`` every call handed to the runner gets a deadline. The
controller asks :meth:`Deadlines.expired` what has passed its deadline, fails those calls'
records through the normal failure path, and asks the runner to cancel the call. A call the
runner cannot interrupt (a thread) keeps running: it is an *overrun*, remembered here until its
late result arrives, which is then ignored. Overruns still occupy a worker, so they count
against the runner's capacity (:attr:`Deadlines.overruns`).
"""

from __future__ import annotations

import heapq

__all__ = ["Deadlines"]


class Deadlines:
    """Owned by the controller thread. Deadlines are engine-clock times (``monotonic``)."""

    __slots__ = ("_at", "_heap", "_overruns")

    def __init__(self) -> None:
        #: batch id -> its current deadline (calls in flight only).
        self._at: dict[int, float] = {}
        #: (deadline, batch id); entries of ended or extended calls are skipped lazily.
        self._heap: list[tuple[float, int]] = []
        #: Calls past their deadline whose result has not arrived yet.
        self._overruns: set[int] = set()

    def started(self, batch: int, deadline: float) -> None:
        self._at[batch] = deadline
        heapq.heappush(self._heap, (deadline, batch))

    def extend(self, batch: int, until: float) -> bool:
        """Move ``batch``'s deadline to ``until`` if that is later; False if the call is no
        longer watched (it ended, or it is already past its deadline)."""
        current = self._at.get(batch)
        if current is None:
            return False
        if until > current:
            self._at[batch] = until
            heapq.heappush(self._heap, (until, batch))
        return True

    def finished_late(self, batch: int, finished_at: float) -> bool:
        """The call's result says it ended at ``finished_at``, after its deadline (the
        controller had not looked yet): it must not count. Call before :meth:`ended`."""
        deadline = self._at.get(batch)
        return deadline is not None and finished_at > deadline

    def ended(self, batch: int) -> bool:
        """The call's result arrived. True if it is an overrun's late result (to ignore)."""
        if batch in self._overruns:
            self._overruns.discard(batch)
            return True
        if self._at.pop(batch, None) is not None and len(self._heap) > 2 * len(self._at) + 64:
            self._heap = [(d, b) for d, b in self._heap if self._at.get(b) == d]
            heapq.heapify(self._heap)
        return False

    def expired(self, now: float) -> list[int]:
        """The calls whose deadline is ``<= now``, earliest first; from now on each is an
        overrun until :meth:`ended` reports its result."""
        heap = self._heap
        at = self._at
        out = []
        while heap and heap[0][0] <= now:
            deadline, batch = heapq.heappop(heap)
            if at.get(batch) == deadline:
                del at[batch]
                self._overruns.add(batch)
                out.append(batch)
        return out

    def expire(self, batch: int) -> bool:
        """Treat ``batch`` as past its deadline now (a stalled partition's record); False if it
        is not in flight with a deadline being watched."""
        if batch in self._overruns:
            return False
        self._at.pop(batch, None)
        self._overruns.add(batch)
        return True

    def is_overrun(self, batch: int) -> bool:
        return batch in self._overruns

    def forget_overrun(self, batch: int) -> None:
        """The runner will never report ``batch`` (taken back before it started)."""
        self._overruns.discard(batch)

    def next_at(self) -> float | None:
        """When the controller must look again (possibly early: stale entries are skipped)."""
        return self._heap[0][0] if self._heap else None

    @property
    def overruns(self) -> int:
        """Calls past their deadline still running (they hold a worker)."""
        return len(self._overruns)

    def deadline_of(self, batch: int) -> float | None:
        return self._at.get(batch)

    def __repr__(self) -> str:
        return (
            f"<Deadlines watched={len(self._at)} overruns={len(self._overruns)} "
            f"next_at={self.next_at()}>"
        )
