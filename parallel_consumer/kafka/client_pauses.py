"""Which partitions the consumer client should have paused, and the poller's wait for credit.

Pure: the poller owns one :class:`ClientPauses` and makes the client's ``pause()`` and
``resume()`` calls it decides. A partition is paused when the controller wants it paused
(``SetPaused``: back-pressure), or, every one, once the poller has waited for credit longer
than its bound: until then the poller waits without calling the client, which keeps what it
prefetched (a pause would drop it and cost a fetch round trip on resume); past it, every
partition is paused so that ``consume()`` serves the group protocol and callbacks again.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from parallel_consumer.work.item import TopicPartition

__all__ = ["ClientPauses"]


class ClientPauses:
    """The client's paused partitions (owned by the poller thread)."""

    __slots__ = ("paused", "stalled_since", "wanted")

    def __init__(self) -> None:
        #: What the controller wants paused.
        self.wanted: frozenset[TopicPartition] = frozenset()
        #: What the client has paused.
        self.paused: set[TopicPartition] = set()
        #: Since when the poller has been waiting for credit (None while it has enough).
        self.stalled_since: float | None = None

    def waiting(self, now: float, pause_after: float) -> bool:
        """Too little credit at ``now``: True while the wait may go on without the client,
        False once it has lasted ``pause_after`` (every partition is then paused)."""
        if self.stalled_since is None:
            self.stalled_since = now
        return now - self.stalled_since < pause_after

    def credit_back(self) -> None:
        """Enough credit again: the wait is over."""
        self.stalled_since = None

    def changes(
        self, assigned: Set[TopicPartition]
    ) -> tuple[set[TopicPartition], set[TopicPartition]]:
        """What to pause and what to resume now, of the ``assigned`` partitions (taken as
        done)."""
        if self.stalled_since is not None:
            wanted = set(assigned)
        else:
            wanted = set(self.wanted & assigned)
        if wanted == self.paused:
            return set(), set()
        to_pause = wanted - self.paused
        to_resume = (self.paused - wanted) & assigned
        self.paused = wanted
        return to_pause, to_resume

    def leaving(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """``tps`` leave the assignment: those paused, to resume before they go (librdkafka
        keeps a pause across a revoke: a partition handed back would stay paused, while the
        engine takes it for a new, unpaused one and never resumes it)."""
        paused = [tp for tp in tps if tp in self.paused]
        self.paused.difference_update(paused)
        return paused

    def __repr__(self) -> str:
        stalled = "" if self.stalled_since is None else " waiting-for-credit"
        return f"<ClientPauses paused={len(self.paused)} wanted={len(self.wanted)}{stalled}>"
