"""Committers: how planned offsets reach the broker.

The controller decides *what* to commit (``offsets.plan_commit`` per dirty partition); a
committer decides *how*. Answers always come back to the controller as
:class:`~parallel_consumer._events.CommitResult` events, and a partition counts as committed only
then. The consumer committers hand the offsets to the poller, the only owner of the Kafka
consumer; a transactional committer (exactly-once) will plug in here with the same interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from parallel_consumer._events import Commit, PollerCommand
from parallel_consumer.options import CommitMode
from parallel_consumer.work.item import TopicPartition

__all__ = ["Committer", "ConsumerCommitter"]

Offsets = Sequence[tuple[TopicPartition, int, str]]


class _CommandSink(Protocol):
    def send(self, command: PollerCommand) -> None: ...


class Committer(Protocol):
    def commit(self, offsets: Offsets, *, final: bool = False) -> None:
        """Send ``offsets`` (tp, offset, metadata); the answer arrives as a CommitResult event."""
        ...


class ConsumerCommitter:
    """Commits through the consumer's group coordinator, on the poller thread.

    ``PERIODIC_CONSUMER_ASYNC`` does not block the poller: the answer comes from the client's
    commit callback. ``PERIODIC_CONSUMER_SYNC`` blocks the poller (never the controller) until the
    broker answered. The final commit on close is always synchronous.
    """

    def __init__(self, poller: _CommandSink, mode: CommitMode) -> None:
        self._poller = poller
        self._sync = mode is CommitMode.PERIODIC_CONSUMER_SYNC

    def commit(self, offsets: Offsets, *, final: bool = False) -> None:
        self._poller.send(Commit(tuple(offsets), sync=self._sync or final))

    def __repr__(self) -> str:
        return f"<ConsumerCommitter {'sync' if self._sync else 'async'}>"
