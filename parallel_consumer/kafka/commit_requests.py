"""Commit requests: which offsets go to the client when, and which answer goes to which command.

Pure: no client, no threads, no clock of its own (the caller passes ``now``). The poller owns
one :class:`CommitRequests`; it carries out what it decides (sends a :class:`Request`, sets the
:class:`Reply` results) and reports back what the client did (the request went out, an answer
arrived). The rules (docs/commits.md "One commit request at a time"):

- One asynchronous request on its way at a time. The client retries a request whose
  coordinator moved or restarted, and a retried older request can be stored after a newer one,
  moving the group's offset back while the engine holds the newer one as acknowledged. Commits
  that arrive meanwhile wait, and go out as one request (the newest offset of each partition,
  in the order the controller sent them) once it is answered.
- Epochs: an offset of a partition not held in the epoch it was planned in never goes out (a
  commit queued before a revoke must not land after the revoke's final commit); it is answered
  "no longer assigned" at once.
- The revoke's final commit (synchronous, every partition being revoked) goes out at once and
  alone: inside the revoke callback the client cannot serve the answer of the request on its
  way, and commits of partitions kept must stay behind that request.
- A request not answered within the caller's time-out is given up on (answered as failed, the
  controller sends its offsets again) and what waited goes out. If its answer still comes, the
  client stored it late, maybe after a newer request: the newest offset sent of its partitions
  is queued again, so that the group ends on it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from parallel_consumer._events import Commit
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit
from parallel_consumer.work.item import TopicPartition

__all__ = ["GIVEN_UP_KEPT", "CommitRequests", "Decision", "Reply", "Request", "split_live"]

#: Requests given up on whose late answer is still watched for.
GIVEN_UP_KEPT = 16

NOT_ASSIGNED = "the partition is no longer assigned"
NO_ANSWER = "the client did not answer the commit"


@dataclass(frozen=True, slots=True)
class Reply:
    """Set ``command.reply`` to ``answers`` (one per offset of the command, in its order)."""

    command: Commit
    answers: tuple[CommitAnswer, ...]


class Request:
    """One commit request: the newest offset of each partition of ``commands`` that is still
    held, and the commands it answers."""

    __slots__ = ("commands", "dropped", "sent", "sent_at", "sync")

    def __init__(
        self,
        commands: tuple[Commit, ...],
        sent: dict[TopicPartition, OffsetCommit],
        dropped: dict[TopicPartition, CommitAnswer],
    ) -> None:
        self.commands = commands
        #: The offset sent per partition; answers of partitions never sent (no longer held).
        self.sent = sent
        self.dropped = dropped
        #: Synchronous if any of its commands is.
        self.sync = any(c.sync for c in commands)
        #: When it went out (asynchronous requests, see CommitRequests.on_its_way).
        self.sent_at = 0.0

    @property
    def offsets(self) -> tuple[OffsetCommit, ...]:
        """What to send, in the order the controller sent the partitions."""
        return tuple(self.sent.values())

    def fail(self, reason: str | None) -> tuple[Reply, ...]:
        """Every offset sent failed with ``reason`` (None: every one succeeded)."""
        return self.answer(CommitAnswer(c, reason) for c in self.sent.values())

    def answer(self, answers: Iterable[CommitAnswer]) -> tuple[Reply, ...]:
        """The replies to every command: an offset gets the answer of its partition's offset
        sent (an offset another one superseded shares it)."""
        by_tp = {**self.dropped, **{a.commit.tp: a for a in answers}}
        replies = []
        for command in self.commands:
            out = []
            for commit in command.offsets:
                found = by_tp[commit.tp]
                if found.commit.epoch != commit.epoch:
                    # (superseded by an offset of a later assignment: never sent)
                    found = CommitAnswer(commit, NOT_ASSIGNED)
                elif found.commit != commit:
                    found = CommitAnswer(commit, found.error, found.permanent)
                out.append(found)
            replies.append(Reply(command, tuple(out)))
        return tuple(replies)

    def __repr__(self) -> str:
        offsets = ", ".join(f"{t}[{p}]@{c.offset}" for (t, p), c in self.sent.items())
        return f"<Request {offsets or 'nothing'}{' sync' if self.sync else ''}>"


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do, in this order: warn that ``gave_up`` was given up on, set the ``replies``,
    send ``send`` (then report it with :meth:`CommitRequests.on_its_way` if asynchronous)."""

    replies: tuple[Reply, ...] = ()
    send: Request | None = None
    gave_up: Request | None = None


def split_live(
    offsets: Iterable[OffsetCommit], epochs: Mapping[TopicPartition, int]
) -> tuple[list[OffsetCommit], list[CommitAnswer]]:
    """The offsets of partitions held in the epoch they were planned in, and answers for the
    others (never sent: a commit of an earlier epoch must not reach the client)."""
    live: list[OffsetCommit] = []
    dropped: list[CommitAnswer] = []
    for commit in offsets:
        if epochs.get(commit.tp) == commit.epoch:
            live.append(commit)
        else:
            dropped.append(CommitAnswer(commit, NOT_ASSIGNED))
    return live, dropped


class CommitRequests:
    """The commit requests of one consumer (owned by its poller thread)."""

    __slots__ = ("_given_up", "_last_sent", "_queued", "_unanswered")

    def __init__(self, given_up_kept: int = GIVEN_UP_KEPT) -> None:
        #: The asynchronous request sent and not yet answered.
        self._unanswered: Request | None = None
        #: Commits that arrived while it was unanswered, in arrival order.
        self._queued: list[Commit] = []
        #: Requests given up on (no answer in time) that the client may still store.
        self._given_up: deque[Request] = deque(maxlen=given_up_kept)
        #: The newest offset sent per partition (what a late older request must not undo).
        self._last_sent: dict[TopicPartition, OffsetCommit] = {}

    @property
    def unanswered(self) -> Request | None:
        return self._unanswered

    @property
    def queued(self) -> int:
        """Commit commands waiting behind the request on its way."""
        return len(self._queued)

    @property
    def waiting(self) -> bool:
        """A request is on its way or commits wait (the next turn should come soon)."""
        return self._unanswered is not None or bool(self._queued)

    def commit(
        self,
        command: Commit,
        epochs: Mapping[TopicPartition, int],
        revoking: frozenset[TopicPartition] = frozenset(),
    ) -> Decision:
        """A commit command arrived; ``revoking``: the partitions being revoked right now."""
        if self._unanswered is None:
            queued, self._queued = self._queued, []
            return self._request((*queued, command), epochs)
        if command.sync and revoking and all(c.tp in revoking for c in command.offsets):
            return self._request((command,), epochs)
        live, dropped = split_live(command.offsets, epochs)
        if not live:
            return Decision(replies=(Reply(command, tuple(dropped)),))
        self._queued.append(command)
        return Decision()

    def due(
        self, now: float, answer_timeout: float, epochs: Mapping[TopicPartition, int]
    ) -> Decision:
        """A turn of the poller: send what waited once the request before it is answered, or
        has waited ``answer_timeout`` for its answer (then it is given up on)."""
        pending = self._unanswered
        replies: tuple[Reply, ...] = ()
        if pending is not None:
            if now - pending.sent_at < answer_timeout:
                return Decision()
            self._unanswered = None
            self._given_up.append(pending)
            replies = pending.fail(NO_ANSWER)
        if not self._queued:
            return Decision(replies, gave_up=pending)
        queued, self._queued = self._queued, []
        decided = self._request(queued, epochs)
        return Decision((*replies, *decided.replies), decided.send, pending)

    def on_its_way(self, request: Request, now: float) -> None:
        """The asynchronous ``request`` went out (the client took it)."""
        assert self._unanswered is None, "only a synchronous commit may overtake one unanswered"
        request.sent_at = now
        self._unanswered = request

    def withdraw(self, request: Request) -> None:
        """``request`` went out but never reached the client (its side records failed, or it
        was given up on meanwhile): nothing more is waited for."""
        if self._unanswered is request:
            self._unanswered = None

    def answered(
        self, offsets: Mapping[TopicPartition, int], epochs: Mapping[TopicPartition, int]
    ) -> tuple[Request | None, tuple[OffsetCommit, ...]]:
        """The client answered a commit of ``offsets`` (its answer does not say which request).
        Returns the request on its way if that is the one (the caller answers it with the
        client's errors), and the offsets queued again after a late answer (see the module
        doc; else an echo of a synchronous commit, already answered: nothing to do)."""
        pending = self._unanswered
        if pending is not None and {tp: c.offset for tp, c in pending.sent.items()} == offsets:
            self._unanswered = None
            return pending, ()
        return None, self._late_answer(offsets, epochs)

    def close(self, reason: str) -> tuple[Reply, ...]:
        """The client is closing: every commit not answered yet failed with ``reason``."""
        pending, self._unanswered = self._unanswered, None
        replies = pending.fail(reason) if pending is not None else ()
        queued, self._queued = self._queued, []
        for command in queued:
            request = Request((command,), {c.tp: c for c in command.offsets}, {})
            replies = (*replies, *request.fail(reason))
        return replies

    def _request(
        self, commands: Sequence[Commit], epochs: Mapping[TopicPartition, int]
    ) -> Decision:
        """One request with the newest offset of each partition in ``commands``; if none is
        still held, no request and every command answered."""
        newest: dict[TopicPartition, OffsetCommit] = {}
        for command in commands:
            for commit in command.offsets:
                newest[commit.tp] = commit
        live, dropped = split_live(newest.values(), epochs)
        request = Request(
            tuple(commands), {c.tp: c for c in live}, {a.commit.tp: a for a in dropped}
        )
        if not live:
            return Decision(replies=request.answer(()))
        for commit in live:
            self._last_sent[commit.tp] = commit
        return Decision(send=request)

    def _late_answer(
        self, offsets: Mapping[TopicPartition, int], epochs: Mapping[TopicPartition, int]
    ) -> tuple[OffsetCommit, ...]:
        for index, late in enumerate(self._given_up):
            if {tp: c.offset for tp, c in late.sent.items()} == offsets:
                del self._given_up[index]
                break
        else:
            return ()
        again = tuple(
            newest
            for tp, commit in late.sent.items()
            if (newest := self._last_sent.get(tp)) is not None
            and newest != commit
            and epochs.get(tp) == newest.epoch
        )
        if again:
            # (nobody waits for its reply: the controller holds these offsets as acknowledged)
            self._queued.append(Commit(again, sync=False, reply=Future()))
        return again

    def __repr__(self) -> str:
        return (
            f"<CommitRequests unanswered={self._unanswered!r} queued={len(self._queued)} "
            f"given_up={len(self._given_up)}>"
        )
