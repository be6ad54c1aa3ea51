"""Commits whose offset maps reach the broker byte for byte, through the consumer's own librdkafka.

confluent-kafka commits metadata as a C string: ``py_to_c_parts()`` sets ``metadata_size`` to
``strlen + 1``, so every map is stored with a NUL after it, and the Java Parallel Consumer,
whose strict Base64 decoder rejects that byte, replays everything above the committed offset
(see ``docs/offset-metadata.md``). :class:`ExactCommits` makes the same librdkafka calls
confluent-kafka makes, on the same ``rd_kafka_t`` (the group member's: a commit must carry its
member id and generation), with ``metadata_size`` exactly the map's length:

- a synchronous commit: ``rd_kafka_commit_queue(rk, offsets, NULL, cb, NULL)``, as
  ``Consumer.commit(asynchronous=False)`` does; it blocks the calling thread until the broker
  answered, and ``cb`` (ours) collects the per-partition errors in that same call;
- an asynchronous commit: ``rd_kafka_commit(rk, offsets, 1)``; librdkafka posts the answer to
  the ``offset_commit_cb`` confluent-kafka set in the configuration, with the opaque it set,
  served inside ``consume()``: the consumer's ``on_commit`` gets it exactly as after
  ``Consumer.commit(asynchronous=True)`` (which posts the same answer to the same queue);
- the offsets of a transaction: ``rd_kafka_send_offsets_to_transaction`` on the library's
  producer's handle, with the group metadata of the consumer's handle.

librdkafka copies the list it is given before these calls return; the list and the metadata
buffers (allocated with ``rd_kafka_mem_malloc``) are ours and freed by
``rd_kafka_topic_partition_list_destroy``. None of these calls serves a queue of
confluent-kafka's, so none of its Python callbacks runs inside them.

Everything is checked before the first use, and whenever the handle changes: the library
(``librdkafka.py``: the one confluent-kafka loaded, its version and struct layouts, a copy of a
list with metadata that is exact), the handle (read from the client object, it must point back
to it through ``rd_kafka_opaque()``, have the right ``rd_kafka_type()``, and for the consumer
the member id confluent-kafka reports). When anything is off, it logs one WARNING and the
caller commits through confluent-kafka as before, for good. Used by the poller thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from parallel_consumer.kafka import librdkafka
from parallel_consumer.kafka.librdkafka import (
    COMMIT_CB,
    RD_KAFKA_CONSUMER,
    RD_KAFKA_PRODUCER,
    ClientClosed,
    Library,
    Unavailable,
)
from parallel_consumer.work.commit_tracker import OffsetCommit

__all__ = ["CLIENT_VERIFIED_BELOW", "ExactCommits", "StoredOffset"]

log = logging.getLogger("parallel_consumer")

#: confluent-kafka versions (major, minor) whose ``Handle`` layout and configuration (the
#: opaque, the ``offset_commit_cb``) were checked in its source (1.9 to 2.15, master of June
#: 2026) or, for 2.16, by the probes here and the broker tests of ``test_exact_commits.py``.
CLIENT_VERIFIED_FROM = (1, 9)
CLIENT_VERIFIED_BELOW = (2, 17)


@dataclass(frozen=True, slots=True)
class StoredOffset:
    """One partition of a synchronous commit's answer (the fields of confluent-kafka's
    ``TopicPartition`` the caller reads)."""

    topic: str
    partition: int
    offset: int
    error: KafkaError | None


class ExactCommits:
    """Exact commits on ``consumer``'s own handle (a ``confluent_kafka.Consumer``)."""

    def __init__(self, consumer: Any, *, name: str = "pc") -> None:
        self._consumer = consumer
        self._name = name
        self._lib: Library | None = None
        #: The consumer's handle, once checked (a different one is checked again).
        self._rk: int | None = None
        #: Why exact commits are off for good (said once, at WARNING).
        self._unavailable: str | None = None

    @property
    def unavailable(self) -> str | None:
        """Why exact commits gave up for good, or None while they may still work."""
        return self._unavailable

    def ready(self) -> bool:
        """Whether the next commit can go out exactly (False: commit through confluent-kafka,
        which is then also what fails, as before, if the consumer is closed)."""
        return self._handle() is not None

    def commit(
        self, commits: Sequence[OffsetCommit], *, asynchronous: bool
    ) -> list[StoredOffset] | None:
        """What ``Consumer.commit(offsets=..., asynchronous=...)`` does, with exact metadata:
        the answer per partition when synchronous, None when asynchronous (``on_commit`` gets
        it); raises KafkaException as it does. Only after :meth:`ready` said True."""
        lib, rk = self._require()
        writing = lib.writing()
        plist = _offsets(lib, commits)
        try:
            if asynchronous:
                err = writing.commit(rk, plist, 1)
                stored = None
            else:
                answer: list[StoredOffset] = []
                inner = [0]

                def answered(_rk: int, err: int, offsets: Any, _opaque: int) -> None:
                    inner[0] = err
                    if offsets:
                        answer.extend(_stored(offsets.contents))

                callback = COMMIT_CB(answered)  # alive until the call returns: it is served in it
                err = writing.commit_queue(rk, plist, None, callback, None)
                err = inner[0] or err  # as confluent-kafka: the callback's error is the richer one
                stored = answer
        finally:
            lib.list_destroy(plist)
        if err:
            raise KafkaException(KafkaError(err, f"Commit failed: {lib.error(err)}"))
        return stored

    def send_offsets_to_transaction(
        self, producer: Any, commits: Sequence[OffsetCommit], timeout: float
    ) -> bool:
        """What ``producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(),
        timeout)`` does, with exact metadata; raises KafkaException as it does. False when it
        cannot (the caller sends them through confluent-kafka)."""
        if self._handle() is None:
            return False
        lib, rk = self._require()
        try:
            prk = librdkafka.client_handle(producer, lib, RD_KAFKA_PRODUCER)
        except Unavailable as exc:
            self._give_up(f"the producer: {exc}")
            return False
        writing = lib.writing()
        group = writing.group_metadata(rk)
        if not group:
            self._give_up("rd_kafka_consumer_group_metadata returned NULL")
            return False
        try:
            plist = _offsets(lib, commits)  # (destroys its list itself if it raises)
            try:
                error = writing.send_offsets_to_transaction(
                    prk, plist, group, max(0, int(timeout * 1000))
                )
            finally:
                lib.list_destroy(plist)
        finally:
            writing.group_metadata_destroy(group)  # also when the list could not be made
        if error:
            try:
                text = writing.error_string(error)
                raise KafkaException(
                    KafkaError(
                        writing.error_code(error),
                        text.decode("utf-8", "replace") if text else None,
                        fatal=bool(writing.error_is_fatal(error)),
                        retriable=bool(writing.error_is_retriable(error)),
                        txn_requires_abort=bool(writing.error_txn_requires_abort(error)),
                    )
                )
            finally:
                writing.error_destroy(error)
        return True

    def _require(self) -> tuple[Library, int]:
        lib, rk = self._lib, self._rk
        assert lib is not None, "ready() first"
        assert rk is not None, "ready() first"
        return lib, rk

    def _handle(self) -> int | None:
        if self._unavailable is not None:
            return None
        try:
            lib = self._lib or librdkafka.load()
            self._lib = lib
            _check_client_version()
            rk = librdkafka.client_handle(self._consumer, lib, RD_KAFKA_CONSUMER)
            if rk != self._rk:
                theirs = self._consumer.memberid()
                if theirs is None:
                    return None  # not in the group yet: nothing to compare (no commit either)
                ours = librdkafka.member_id(lib, rk)
                if ours != theirs:
                    raise Unavailable(
                        f"the handle's member id {ours!r} is not the consumer's {theirs!r}"
                    )
                self._rk = rk
                log.debug("%s: offset maps are committed exactly through librdkafka", self._name)
            return rk
        except ClientClosed:
            return None  # confluent-kafka's commit raises, as before
        except Unavailable as exc:
            self._give_up(str(exc))
        except Exception as exc:  # a bug here must never take the poller down
            self._give_up(f"unexpected error {exc!r}")
        return None

    def _give_up(self, reason: str) -> None:
        self._unavailable = reason
        self._rk = None
        log.warning(
            "%s: offset maps cannot be committed exactly (%s); committing them through "
            "confluent-kafka, which stores each with a trailing NUL byte that the Java Parallel "
            "Consumer cannot decode (a group handed over to it replays finished records)",
            self._name,
            reason,
        )


def _check_client_version() -> None:
    import confluent_kafka

    text = str(confluent_kafka.version())
    try:
        found = tuple(int(part) for part in text.split(".")[:2])
    except ValueError:
        raise Unavailable(f"confluent-kafka {text}: cannot read its version") from None
    if not CLIENT_VERIFIED_FROM <= found < CLIENT_VERIFIED_BELOW:
        raise Unavailable(
            f"confluent-kafka {text} is outside the versions whose client layout was checked"
        )


def _offsets(lib: Library, commits: Sequence[OffsetCommit]) -> Any:
    """A new list of ``commits`` with their exact metadata (the caller destroys it)."""
    writing = lib.writing()
    plist = lib.list_new(max(1, len(commits)))
    if not plist:
        raise MemoryError("rd_kafka_topic_partition_list_new returned NULL")
    try:
        for commit in commits:
            topic, partition = commit.tp
            added = lib.list_add(plist, topic.encode("utf-8"), partition)
            if not added:
                raise MemoryError("rd_kafka_topic_partition_list_add returned NULL")
            element = added.contents
            element.offset = commit.offset
            # No map: no metadata at all, as through confluent-kafka (see kafka_offset).
            librdkafka.set_metadata(writing, element, commit.metadata.encode("utf-8"))
    except BaseException:
        lib.list_destroy(plist)
        raise
    return plist


def _stored(offsets: Any) -> list[StoredOffset]:
    return [
        StoredOffset(
            (element.topic or b"").decode("utf-8"),
            int(element.partition),
            int(element.offset),
            KafkaError(element.err) if element.err else None,
        )
        for element in (offsets.elems[i] for i in range(offsets.cnt))
    ]
