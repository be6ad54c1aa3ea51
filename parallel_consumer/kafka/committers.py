"""Committers: how planned offsets reach the broker.

The controller decides *what* to commit (the commit tracker plans per partition); a committer
decides *how*. Every commit goes through one: periodic ones, the final one on close and the
one on revoke. ``commit`` returns a future of the broker's answers, and a partition counts as
committed only once its answer arrived. The consumer committers hand the offsets to the poller,
the only owner of the Kafka consumer; a transactional committer (exactly-once) replaces them
behind the same interface. On a share group (``kafka/share/``) nothing is committed: records are
acknowledged one by one (``acknowledge``), and a commit only sends the acknowledgements.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

from parallel_consumer._events import Acknowledge, Commit, PollerCommand, Transact
from parallel_consumer.options import CommitMode
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit

__all__ = ["Committer", "ConsumerCommitter", "ShareCommitter", "TransactionalCommitter"]

#: A record that left the engine: (tp, offset, accept) (see ``engine/ledger.py``'s ``Ack``).
_Ack = tuple[tuple[str, int], int, bool]


class _CommandSink(Protocol):
    def send(self, command: PollerCommand) -> None: ...


class Committer(Protocol):
    def commit(
        self, offsets: Sequence[OffsetCommit], *, final: bool = False, abort: bool = False
    ) -> Future[tuple[CommitAnswer, ...]]:
        """Send ``offsets``; the future resolves with one answer per offset. ``final`` commits
        (close, revoke) must be acknowledged before the partition is let go. ``abort``
        (transactional mode only) aborts the open transaction instead: every offset fails."""
        ...

    def acknowledge(self, acks: Sequence[_Ack]) -> None:
        """Share groups only: accept (done) or release (deliver again) each record."""
        ...


class ConsumerCommitter:
    """Commits through the consumer's group coordinator, on the poller thread.

    ``PERIODIC_CONSUMER_ASYNC`` does not block the poller: the answer comes from the client's
    commit callback. ``PERIODIC_CONSUMER_SYNC`` blocks the poller (never the controller) until the
    broker answered. Final commits are always synchronous.
    """

    def __init__(self, poller: _CommandSink, mode: CommitMode) -> None:
        self._poller = poller
        self._sync = mode is CommitMode.PERIODIC_CONSUMER_SYNC

    def commit(
        self, offsets: Sequence[OffsetCommit], *, final: bool = False, abort: bool = False
    ) -> Future[tuple[CommitAnswer, ...]]:
        assert not abort, "only a transaction can abort"
        reply: Future[tuple[CommitAnswer, ...]] = Future()
        self._poller.send(Commit(tuple(offsets), sync=self._sync or final, reply=reply))
        return reply

    def acknowledge(self, acks: Sequence[_Ack]) -> None:
        raise AssertionError("a consumer group commits offsets; it acknowledges no record")

    def __repr__(self) -> str:
        return f"<ConsumerCommitter {'sync' if self._sync else 'async'}>"


class ShareCommitter(ConsumerCommitter):
    """A share group (KIP-932): each record is acknowledged on its own, on the poller thread
    (``kafka/share/poller.py``); a commit (none is planned: shared partitions never turn dirty)
    only sends the acknowledgements made so far."""

    def acknowledge(self, acks: Sequence[_Ack]) -> None:
        self._poller.send(Acknowledge(tuple(acks)))

    def __repr__(self) -> str:
        return "<ShareCommitter>"


class TransactionalCommitter:
    """``PERIODIC_TRANSACTIONAL_PRODUCER``: offsets commit inside the producer's transaction,
    atomically with the outputs produced in it (exactly-once for Kafka-to-Kafka pipelines).

    The poller runs the transaction's requests (it holds the consumer's group metadata, with
    which the broker fences a zombie after a rebalance, KIP-447); the controller sends nothing
    while they run and only once every output of the transaction was acknowledged. An empty
    ``offsets`` still commits the transaction (outputs of records whose partitions did not
    move are in it).
    """

    def __init__(self, poller: _CommandSink) -> None:
        self._poller = poller

    def commit(
        self, offsets: Sequence[OffsetCommit], *, final: bool = False, abort: bool = False
    ) -> Future[tuple[CommitAnswer, ...]]:
        reply: Future[tuple[CommitAnswer, ...]] = Future()
        self._poller.send(Transact(tuple(offsets), reply=reply, abort=abort))
        return reply

    def acknowledge(self, acks: Sequence[_Ack]) -> None:
        raise AssertionError("a transaction commits offsets; it acknowledges no record")

    def __repr__(self) -> str:
        return "<TransactionalCommitter>"
