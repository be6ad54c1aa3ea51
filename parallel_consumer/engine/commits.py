"""Commits: when to commit, sending commits to the committer and taking the broker's answers.
Owned by the controller thread.

What to commit, what is on its way and when the next commit is due live in the ledger's
commit tracker (work/commit_tracker.py); this part holds the committer port and carries the
tracker's decisions out. In the transactional mode delivery decides when the transaction
commits (:meth:`Delivery.transaction_step`); the commit goes out here.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from parallel_consumer._events import CommitResult
from parallel_consumer.engine.delivery import Delivery
from parallel_consumer.engine.ledger import Ledger
from parallel_consumer.hooks import Hooks
from parallel_consumer.kafka.committers import Committer
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit

__all__ = ["Commits"]


class Commits:
    """The committer port. See the module docstring."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        delivery: Delivery,
        committer: Committer,
        hooks: Hooks,
        post: Callable[[CommitResult], None],
    ) -> None:
        self._ledger = ledger
        self._delivery = delivery
        self._committer = committer
        self._hooks = hooks
        self._post = post

    def wake_at(self, now: float, drained: bool) -> float:
        """The next periodic commit, or sooner an engine that finished everything."""
        tracker = self._ledger.commits
        wake = tracker.next_at
        if self._delivery.gate is None and drained:
            idle_at = tracker.idle_at()
            # (Only ahead of now: a turn at or after idle_at has sent what it could; a commit
            # still awaiting its answer must not make the loop spin until the answer comes.)
            if now < idle_at < wake and self._ledger.dirty():
                wake = idle_at
        return wake

    def tick(self, now: float, drained: Callable[[], bool]) -> None:
        """Commit what is due: every commit interval, and at once (at most every tenth of it)
        once everything polled is finished (``drained``)."""
        ledger = self._ledger
        if ledger.acks:
            self._committer.acknowledge(ledger.take_acks())  # (share groups)
        tracker = ledger.commits
        if now >= tracker.next_at:
            if self._delivery.gate is None:
                self.send(tracker.due(ledger.partitions.values(), now))
            else:
                self._delivery.want_commit()
            tracker.schedule(now)
        elif self._delivery.gate is None and now >= tracker.idle_at() and drained():
            due = tracker.due(ledger.partitions.values(), now)
            if due:
                self.send(due)
                tracker.schedule(now)

    def send(self, commits: list[OffsetCommit], *, final: bool = False) -> None:
        if not commits and self._delivery.gate is None:
            return  # (a transaction commits its outputs even when no offset moved)
        self._ledger.counters.commits_sent += len(commits)
        if commits:
            self._hooks.on_commit_sent(commits)
        answer = self._committer.commit(commits, final=final)
        answer.add_done_callback(self._post_answer)

    def abort(self) -> None:
        """Abort the open transaction; the poller rewinds the partitions it keeps."""
        self._ledger.counters.commits_sent += 1
        answer = self._committer.commit((), abort=True)
        answer.add_done_callback(self._post_answer)

    def send_final(self, now: float) -> bool:
        """Commit everything finished (a close); False if there was nothing to commit."""
        if self._delivery.gate is not None:
            # The transaction commits once the outputs sent are acknowledged (and takes the
            # offsets of their records with it): see Delivery.transaction_step.
            return self._delivery.want_commit()
        ledger = self._ledger
        commits = ledger.commits.due(ledger.partitions.values(), now, final=True)
        self.send(commits, final=True)
        return bool(commits)

    def _post_answer(self, answer: Future[tuple[CommitAnswer, ...]]) -> None:
        # Runs on whichever thread resolves the future (the poller): only posts.
        self._post(CommitResult(answer.result()))

    def on_result(self, answers: tuple[CommitAnswer, ...]) -> None:
        if self._delivery.gate is not None:
            self._delivery.gate.answered()
        self._ledger.on_commit_answers(answers)
        self._hooks.on_commit(answers)
