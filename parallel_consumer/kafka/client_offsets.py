"""The consumer client's offset calls, translated once at the boundary: the offsets a commit
sends, its answers and errors (which of them fail again however often they are retried), and
the committed offsets read on assignment and on a rewind.

Called by the poller only, on its thread (the only one that touches the client).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from parallel_consumer.kafka.committed_reader import CommittedReader
from parallel_consumer.offsets import read_committed_metadata
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit
from parallel_consumer.work.item import TopicPartition

__all__ = ["answer", "commit_sync", "failed", "read_committed", "request"]

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


def request(commit: OffsetCommit) -> Any:
    """The client's form of one offset to commit."""
    tp = commit.tp
    if commit.metadata:
        return KafkaTopicPartition(tp[0], tp[1], commit.offset, commit.metadata)
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


def failed(commits: Sequence[OffsetCommit], exc: KafkaException) -> tuple[CommitAnswer, ...]:
    """The answers for ``commits`` whose request raised ``exc``."""
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else exc
    return tuple(answer(c, error) for c in commits)


def commit_sync(consumer: Any, commits: Sequence[OffsetCommit]) -> tuple[CommitAnswer, ...]:
    """Commit ``commits`` and wait for the answer."""
    try:
        stored = consumer.commit(offsets=[request(c) for c in commits], asynchronous=False)
    except KafkaException as exc:
        log.warning("commit failed: %s", exc)
        return failed(commits, exc)
    errors = {(r.topic, r.partition): r.error for r in stored or ()}
    return tuple(answer(c, errors.get(c.tp)) for c in commits)


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
