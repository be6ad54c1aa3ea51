"""The consumer client's offset calls, translated once at the boundary: the offsets a commit
sends, its answers and errors (which of them fail again however often they are retried), the
commit requests carried out (:class:`CommitClient`), and the committed offsets read on
assignment and on a rewind. Maps are committed with their exact bytes through
``exact_commits.py`` when it can, else through the client's ``commit()`` (which appends a NUL).

Called by the poller only, on its thread (the only one that touches the client).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from parallel_consumer._events import Assignment, Commit
from parallel_consumer.kafka.assigned import AssignedPartitions
from parallel_consumer.kafka.commit_requests import (
    CommitRequests,
    Decision,
    Reply,
    Request,
    split_live,
)
from parallel_consumer.kafka.committed_reader import CommittedReader
from parallel_consumer.kafka.exact_commits import ExactCommits
from parallel_consumer.kafka.spill_store import SideWrite, SpillFailed, SpillStore
from parallel_consumer.offsets import read_committed_metadata
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit
from parallel_consumer.work.item import TopicPartition

__all__ = [
    "CommitClient",
    "answer",
    "assignment",
    "commit_sync",
    "failed",
    "kafka_offset",
    "on_the_wire",
    "read_committed",
    "send_offsets_to_transaction",
    "spill_failed",
    "spill_references",
]

log = logging.getLogger("parallel_consumer")

#: Per partition: the committed offset and its metadata (as read, see read_committed_metadata).
Committed = dict[TopicPartition, tuple[int, str | None]]

_MAP_TOO_LARGE = (
    "the offset map is larger than the broker's offset.metadata.max.bytes; set "
    "Options(max_metadata_bytes=...) to at most that value"
)
#: Commit errors that fail again however often they are retried.
_PERMANENT_COMMIT_ERRORS = {
    KafkaError.OFFSET_METADATA_TOO_LARGE: _MAP_TOO_LARGE,
    KafkaError.INVALID_COMMIT_OFFSET_SIZE: _MAP_TOO_LARGE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "the consumer may not commit for this topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "the consumer may not commit for this group",
    KafkaError.INVALID_GROUP_ID: "the group.id is not valid",
}


def kafka_offset(commit: OffsetCommit, references: Mapping[TopicPartition, str] = {}) -> Any:
    """The client's form of one offset to commit: its map, or the reference to its map in the
    side topic (``references``, for ``spill`` commits)."""
    tp = commit.tp
    metadata = references.get(tp, "") if commit.spill else commit.metadata
    if metadata:
        return KafkaTopicPartition(tp[0], tp[1], commit.offset, metadata)
    # No map: send no metadata at all (an empty string would be stored as a lone NUL byte).
    return KafkaTopicPartition(tp[0], tp[1], commit.offset)


def answer(commit: OffsetCommit, error: Any) -> CommitAnswer:
    """The answer for ``commit`` given the client's error for its partition (None: stored)."""
    if error is None:
        return CommitAnswer(commit)
    code = error.code() if isinstance(error, KafkaError) else None
    hint = _PERMANENT_COMMIT_ERRORS.get(code) if code is not None else None
    if hint is not None:
        return CommitAnswer(commit, f"{error} ({hint})", permanent=True)
    return CommitAnswer(commit, str(error))


def spill_failed(commits: Sequence[OffsetCommit], exc: SpillFailed) -> tuple[CommitAnswer, ...]:
    """The answers for ``commits`` whose side records could not be written."""
    return tuple(CommitAnswer(c, str(exc), permanent=exc.permanent) for c in commits)


def failed(commits: Sequence[OffsetCommit], exc: KafkaException) -> tuple[CommitAnswer, ...]:
    """The answers for ``commits`` whose request raised ``exc``."""
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else exc
    return tuple(answer(c, error) for c in commits)


def on_the_wire(
    commits: Sequence[OffsetCommit], references: Mapping[TopicPartition, str]
) -> list[OffsetCommit]:
    """``commits`` as they reach the broker: a spilled map is replaced by its reference in the
    side topic (``references``)."""
    return [
        dataclasses.replace(c, metadata=references.get(c.tp, ""), spill=False) if c.spill else c
        for c in commits
    ]


def _commit(
    consumer: Any,
    exact: ExactCommits | None,
    commits: Sequence[OffsetCommit],
    asynchronous: bool,
    references: Mapping[TopicPartition, str] = {},
) -> Any:
    """``consumer.commit(offsets=..., asynchronous=...)``, with each map's exact bytes through
    ``exact`` when it can (see ``kafka/exact_commits.py``)."""
    wire = on_the_wire(commits, references)
    if exact is not None and exact.ready():
        return exact.commit(wire, asynchronous=asynchronous)
    return consumer.commit(offsets=[kafka_offset(c) for c in wire], asynchronous=asynchronous)


def commit_sync(
    consumer: Any,
    commits: Sequence[OffsetCommit],
    exact: ExactCommits | None = None,
    references: Mapping[TopicPartition, str] = {},
) -> tuple[CommitAnswer, ...]:
    """Commit ``commits`` and wait for the answer."""
    try:
        stored = _commit(consumer, exact, commits, asynchronous=False, references=references)
    except KafkaException as exc:
        log.warning("commit failed: %s", exc)
        return failed(commits, exc)
    errors = {(r.topic, r.partition): r.error for r in stored or ()}
    return tuple(answer(c, errors.get(c.tp)) for c in commits)


class CommitClient:
    """What :class:`CommitRequests` decides, carried out on ``client`` (the consumer): requests
    sent, the client's ``on_commit`` answers matched to them, replies set. Owned by the poller
    thread (the client serves its callbacks inside ``consume()``)."""

    def __init__(
        self,
        client: Any,
        assigned: AssignedPartitions,
        spill: SpillStore | None = None,
        *,
        name: str = "pc",
    ) -> None:
        self.requests = CommitRequests()
        self._client = client
        self._assigned = assigned
        #: Commits maps byte for byte on the client's own handle: only for a real client.
        self.exact = ExactCommits(client, name=name) if isinstance(client, Consumer) else None
        #: Where maps over the metadata limit go (None: the planner never spills).
        self._spill = spill
        #: An asynchronous request whose side records are on their way: it goes to the client
        #: once they are acknowledged (the poller fetches meanwhile).
        self._side: tuple[Request, SideWrite] | None = None

    def commit(self, command: Commit, revoking: frozenset[TopicPartition]) -> None:
        """A Commit command arrived; ``revoking``: the partitions being revoked right now."""
        self._carry_out(self.requests.commit(command, self._assigned.epochs, revoking))

    def turn(self, now: float, answer_timeout: float) -> None:
        """Send what waited, once the request before it is answered or given up on."""
        self._side_turn()
        decision = self.requests.due(now, answer_timeout, self._assigned.epochs)
        if (gave_up := decision.gave_up) is not None:
            log.warning(
                "no answer to the commit of %s after %.0fs; sending what waited behind it",
                ", ".join(f"{t}[{p}]@{c.offset}" for (t, p), c in gave_up.sent.items()),
                answer_timeout,
            )
        self._carry_out(decision)

    def on_commit(self, error: Any, partitions: list[Any]) -> None:
        """The client's ``on_commit`` callback. It does not say which request it answers:
        CommitRequests matches it."""
        answered = {(p.topic, p.partition): p.offset for p in partitions}
        request, again = self.requests.answered(answered, self._assigned.epochs)
        if again:
            log.warning(
                "a commit given up on was stored late; committing %s again",
                ", ".join(f"{c.tp[0]}[{c.tp[1]}]@{c.offset}" for c in again),
            )
        if request is not None:
            errors = {(p.topic, p.partition): p.error or error for p in partitions}
            answers = [answer(c, errors.get(tp)) for tp, c in request.sent.items()]
            self._stored(answers)
            _reply(request.answer(answers))

    def close(self, reason: str) -> None:
        """The client closes: every commit not answered yet failed with ``reason``."""
        self._side = None
        _reply(self.requests.close(reason))

    def _stored(self, answers: Iterable[CommitAnswer]) -> None:
        """Tell the side topic which inline maps were stored (their tombstones follow)."""
        if self._spill is not None:
            self._spill.inline_stored(
                [a.commit.tp for a in answers if a.error is None and not a.commit.spill]
            )

    def _carry_out(self, decision: Decision) -> None:
        _reply(decision.replies)
        if decision.send is not None:
            self._send(decision.send)

    def _send(self, request: Request) -> None:
        """Synchronously if the request says so (answered at once), else asynchronously
        (answered by ``on_commit``)."""
        live = request.offsets
        try:
            if request.sync or self._spill is None:
                references = spill_references(self._spill, live)
            else:
                write = self._spill.start(live)
                if write.pending:
                    # Sent once they are acknowledged (_side_turn); commits that come meanwhile
                    # wait behind it, as behind any request on its way.
                    self.requests.on_its_way(request, time.monotonic())
                    self._side = (request, write)
                    return
                references = write.refs
        except SpillFailed as exc:
            log.warning("commit failed: %s", exc)
            _reply(request.answer(spill_failed(live, exc)))
            return
        if request.sync:
            answers = commit_sync(self._client, live, self.exact, references)
            self._stored(answers)
            _reply(request.answer(answers))
            return
        self._send_async(request, references)

    def _side_turn(self) -> None:
        """Send the request waiting for its side records once they are acknowledged."""
        if self._side is None:
            return
        request, write = self._side
        if self.requests.unanswered is not request:
            self._side = None  # given up on meanwhile (answered as failed): never sent
            return
        assert self._spill is not None
        try:
            references = self._spill.finish(write, block=False)
        except SpillFailed as exc:
            log.warning("commit failed: %s", exc)
            self._side = None
            self.requests.withdraw(request)
            _reply(request.answer(spill_failed(request.offsets, exc)))
            return
        if references is None:
            return
        self._side = None
        self.requests.withdraw(request)
        # A partition revoked meanwhile had its final commit: an older offset must not follow.
        _, dropped = split_live(request.offsets, self._assigned.epochs)
        for gone in dropped:
            del request.sent[gone.commit.tp]
            request.dropped[gone.commit.tp] = gone
        if not request.sent:
            _reply(request.answer(()))
            return
        self._send_async(request, references)

    def _send_async(self, request: Request, references: Mapping[TopicPartition, str]) -> None:
        live = request.offsets
        try:
            _commit(self._client, self.exact, live, asynchronous=True, references=references)
        except KafkaException as exc:
            _reply(request.answer(failed(live, exc)))
            return
        self.requests.on_its_way(request, time.monotonic())


def spill_references(
    spill: SpillStore | None, commits: Sequence[OffsetCommit], producer: Any = None
) -> dict[TopicPartition, str]:
    """The references of the ``spill`` commits among ``commits`` (their side records written
    first); raises SpillFailed, also when a map must spill and there is no side topic."""
    if spill is None:
        if any(c.spill for c in commits):
            raise SpillFailed("an offset map must spill but no side topic is set", permanent=True)
        return {}
    return spill.references(commits, producer)


def assignment(
    spill: SpillStore | None,
    tp: TopicPartition,
    epoch: int,
    committed: tuple[int, str | None] | None,
    *,
    exact: bool = False,
) -> Assignment:
    """The assignment of ``tp`` from what it read as committed: a reference to a spilled map
    is replaced by the map itself (exact), fetched from the side topic."""
    offset, metadata = committed if committed is not None else (None, None)
    if spill is not None and offset is not None and metadata:
        found = spill.resolve(tp, offset, metadata)
        if found is not None:
            metadata, exact = found, True
    return Assignment(tp, epoch, offset, metadata, exact_metadata=exact)


def _reply(replies: Iterable[Reply]) -> None:
    for reply in replies:
        reply.command.reply.set_result(reply.answers)


def send_offsets_to_transaction(
    producer: Any,
    consumer: Any,
    exact: ExactCommits | None,
    commits: Sequence[OffsetCommit],
    timeout: float,
) -> None:
    """Add ``commits`` to ``producer``'s open transaction as ``consumer``'s group's offsets,
    each map's exact bytes through ``exact`` when it can; raises KafkaException."""
    if exact is not None and exact.send_offsets_to_transaction(producer, commits, timeout):
        return
    producer.send_offsets_to_transaction(
        [kafka_offset(c) for c in commits], consumer.consumer_group_metadata(), timeout
    )


def read_committed(
    consumer: Any,
    tps: Sequence[TopicPartition],
    timeout: float,
    *,
    exact_reader: CommittedReader | None = None,
    attempts: int = 1,
) -> tuple[Committed, bool] | None:
    """The committed offsets and metadata of ``tps`` (partitions without one are absent), and
    whether the metadata is exact: read with its length through ``exact_reader`` when given and
    able, else through confluent-kafka's ``committed()``, which may append stray bytes to a map
    the Java client committed. None if every one of ``attempts`` failed; with one attempt, its
    error is raised."""
    if exact_reader is not None:
        exact = exact_reader.read(list(tps), timeout)
        if exact is not None:
            return exact, True
    kafka_tps = [KafkaTopicPartition(t, p) for t, p in tps]
    for attempt in range(attempts):
        try:
            found = consumer.committed(kafka_tps, timeout=timeout)
        except KafkaException as exc:
            if attempts == 1:
                raise
            log.warning("reading committed offsets failed (attempt %d): %s", attempt + 1, exc)
            continue
        # read_committed_metadata: a map the Java client committed comes back followed by
        # stray bytes, which may not even be UTF-8 (see offsets/codec.py).
        return {
            (r.topic, r.partition): (r.offset, read_committed_metadata(r))
            for r in found
            if r.error is None and r.offset >= 0
        }, False
    return None
