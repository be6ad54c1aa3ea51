"""The side topic of offset maps over the metadata limit: written before the commit that
references them, read back on assignment. Owned by the poller thread (the commits and the
assignments run there); the format is ``offsets/spill.py``'s. See
``docs/offset-metadata.md#maps-over-the-limit``.

Writing: :meth:`SpillStore.references` turns the ``spill`` commits of one request into
references, producing one side record per partition whose map changed since its last one, and
waits for the broker's acknowledgement (its offset goes into the reference). The first write
creates the topic (``cleanup.policy=compact``) if it is missing. A partition whose map fits
inline again gets a tombstone, so that compaction leaves nothing of it: once the inline commit
is stored (:meth:`SpillStore.inline_stored`; before it, the committed reference still names
the record, which a tombstone lets compaction drop). In the transactional mode the records,
tombstones included, go through the transactional producer, inside the open transaction (they
commit with the offsets or not at all).

Reading: :meth:`SpillStore.resolve` fetches the record a committed reference names, checks it
is the very one (key, checksum, committed offset) and returns the map; when it cannot, it says
so in a WARNING naming the partition and the partition replays from its committed offset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.cimpl import NewTopic

from parallel_consumer.kafka.spill_reader import SideReader, client_log, side_client_config
from parallel_consumer.offsets import OffsetDecodeError
from parallel_consumer.offsets.spill import (
    SpillReference,
    checksum,
    default_spill_topic,
    format_reference,
    parse_reference,
    read_side_value,
    side_key,
    side_value,
)
from parallel_consumer.options import Options
from parallel_consumer.work.commit_tracker import OffsetCommit
from parallel_consumer.work.item import TopicPartition

__all__ = ["SideWrite", "SpillFailed", "SpillStore", "spill_store_for"]

log = logging.getLogger("parallel_consumer")

#: How long a side write may take before the commit fails (and is sent again later).
SIDE_TIMEOUT = 15.0
#: Errors after which writing again cannot help: the consumer stops with the reason.
_PERMANENT = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.POLICY_VIOLATION,
    KafkaError.INVALID_CONFIG,
    KafkaError.TOPIC_EXCEPTION,
}


class SpillFailed(Exception):
    """A side record could not be written: the commits of the request fail (``permanent``:
    for good, and the consumer stops with this message)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class SideWrite:
    """Side records on their way for one commit request (see :meth:`SpillStore.start`)."""

    def __init__(self) -> None:
        #: References known already (maps unchanged since their record).
        self.refs: dict[TopicPartition, str] = {}
        self.to_write: list[tuple[OffsetCommit, bytes]] = []
        self.tombstones: list[TopicPartition] = []
        self.producer: Any = None
        #: Per record: None until its delivery report, then its offset or its error.
        self.results: list[Any] = []
        self.deadline = 0.0
        #: The store's forget counts when the write started (see SpillStore.forget).
        self.forgets: tuple[int, dict[TopicPartition, int]] = (0, {})
        # Delivery reports may be served on another thread (the transactional producer's).
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        return bool(self.to_write or self.tombstones)

    def report(self, index: int, error: Any, message: Any) -> None:
        with self._lock:
            self.results[index] = error if error is not None else message.offset()

    def acknowledged(self) -> bool:
        with self._lock:
            return all(r is not None for r in self.results)

    def offsets(self) -> list[int]:
        """The offsets of the records written (raises SpillFailed if one failed)."""
        with self._lock:
            results = list(self.results)
        for result in results:
            if isinstance(result, KafkaError):
                raise _failed(KafkaException(result))
        return [int(r) for r in results[: len(self.to_write)]]


class SpillStore:
    """The side topic ``topic`` of group ``group``'s offset maps; owned by the poller thread.

    The clients are made on first use from ``config`` (the consumer's settings) by the given
    factories; ``max_metadata_bytes`` bounds a reference as it bounds a map."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        group: str,
        topic: str,
        producer_factory: Callable[[dict[str, Any]], Any],
        consumer_factory: Callable[[dict[str, Any]], Any],
        admin_factory: Callable[[dict[str, Any]], Any],
        name: str = "pc",
    ) -> None:
        self.topic = topic
        self._group = group
        self._config = dict(config)
        self._producer_factory = producer_factory
        self._admin_factory = admin_factory
        self._name = name
        self._producer: Any = None
        self._reader = SideReader(config, group=group, consumer_factory=consumer_factory, name=name)
        self._topic_ready = False
        #: Per partition: the (committed offset, map) last written and its reference.
        self._written: dict[TopicPartition, tuple[int, str, str]] = {}
        #: Partitions whose key may hold a map in the side topic (to tombstone once inline).
        self._keys: set[TopicPartition] = set()
        #: Partitions with a key in the side topic whose last commit sent was inline: their
        #: tombstone follows once it is stored (see inline_stored).
        self._inline: set[TopicPartition] = set()
        #: How often everything, and each partition, was forgotten: a write acknowledged after
        #: its partition was forgotten (revoked, or its transaction aborted) is not remembered.
        self._forgot_all = 0
        self._forgot: dict[TopicPartition, int] = {}
        #: Side records written so far (statistics and tests).
        self.records_written = 0
        self.tombstones_written = 0

    # -- writing --------------------------------------------------------------------------------

    def references(
        self, commits: Sequence[OffsetCommit], producer: Any = None
    ) -> dict[TopicPartition, str]:
        """The reference to commit instead of each ``spill`` commit's map, after writing the
        side records that changed (and the tombstones of partitions back inline) and waiting for
        their acknowledgement. ``producer``: the transactional producer, whose open transaction
        the records join (None: the store's own). Raises :class:`SpillFailed`."""
        write = self.start(commits, producer)
        refs = self.finish(write, block=True)
        assert refs is not None
        return refs

    def start(self, commits: Sequence[OffsetCommit], producer: Any = None) -> SideWrite:
        """Produce the side records (and tombstones) ``commits`` need, without waiting for
        them: :meth:`finish` gives the references once they are acknowledged."""
        write = SideWrite()
        for commit in commits:
            tp = commit.tp
            if not commit.spill:
                if tp in self._keys:
                    if producer is None:
                        self._inline.add(tp)  # tombstoned once this commit is stored
                    else:
                        write.tombstones.append(tp)  # in the transaction, with the commit
                continue
            self._inline.discard(tp)
            last = self._written.get(tp)
            if last is not None and last[:2] == (commit.offset, commit.metadata):
                write.refs[tp] = last[2]  # unchanged since its record: no second record
                continue
            write.to_write.append((commit, side_value(commit.offset, commit.metadata)))
        if not write.pending:
            return write
        self._ensure_topic()
        records: list[tuple[bytes, bytes | None]] = [
            (side_key(self._group, *c.tp), value) for c, value in write.to_write
        ]
        records += [(side_key(self._group, *tp), None) for tp in write.tombstones]
        write.producer = producer or self._own_producer()
        write.forgets = (self._forgot_all, dict(self._forgot))
        write.results = [None] * len(records)
        write.deadline = time.monotonic() + SIDE_TIMEOUT
        try:
            for index, (key, value) in enumerate(records):
                write.producer.produce(
                    self.topic,
                    value,
                    key,
                    partition=0,
                    on_delivery=lambda e, m, i=index: write.report(i, e, m),
                )
            write.producer.poll(0)
        except KafkaException as exc:
            self._written_failed()
            raise _failed(exc) from exc
        except BufferError as exc:
            raise SpillFailed(f"the offset map producer's queue is full: {exc}") from exc
        return write

    def finish(self, write: SideWrite, *, block: bool) -> dict[TopicPartition, str] | None:
        """The references of ``write`` once its records are acknowledged; None while they are
        not (``block``: wait for them, up to SIDE_TIMEOUT). Raises :class:`SpillFailed`."""
        if write.pending:
            try:
                offsets = self._acknowledged(write, block=block)
            except SpillFailed:
                self._written_failed()
                raise
            if offsets is None:
                return None
            all_then, each_then = write.forgets
            for (commit, value), offset in zip(write.to_write, offsets, strict=False):
                ref = format_reference(SpillReference(self.topic, 0, offset, checksum(value)))
                self._keys.add(commit.tp)
                write.refs[commit.tp] = ref
                tp_then = each_then.get(commit.tp, 0)
                if (all_then, tp_then) == (self._forgot_all, self._forgot.get(commit.tp, 0)):
                    self._written[commit.tp] = (commit.offset, commit.metadata, ref)
            for tp in write.tombstones:
                self._keys.discard(tp)
                self._written.pop(tp, None)
            self.records_written += len(write.to_write)
            self.tombstones_written += len(write.tombstones)
            write.to_write, write.tombstones = [], []
        return write.refs

    def inline_stored(self, tps: Sequence[TopicPartition]) -> None:
        """The inline commits of ``tps`` were stored: the side records their references named
        are no longer needed, so each partition whose last commit sent was inline gets its
        tombstone now (not waited for: a lost one only leaves one record of the key)."""
        done = [tp for tp in tps if tp in self._inline and tp in self._keys]
        if not done:
            return
        try:
            self._ensure_topic()
            producer = self._own_producer()
            for tp in done:
                producer.produce(self.topic, None, side_key(self._group, *tp), partition=0)
            producer.poll(0)
        except (SpillFailed, KafkaException, BufferError) as exc:
            log.debug("tombstones of %s not written (tried again later): %s", done, exc)
            return
        for tp in done:
            self._inline.discard(tp)
            self._keys.discard(tp)
            self._written.pop(tp, None)
        self.tombstones_written += len(done)

    def _written_failed(self) -> None:
        """A side write failed: the topic may have been deleted meanwhile. The next write checks
        it again (and creates it, compacted), and every map is written again rather than
        referenced where it may no longer be."""
        self._topic_ready = False
        self._written.clear()

    def _acknowledged(self, write: SideWrite, *, block: bool) -> list[int] | None:
        """The offsets of ``write``'s records once acknowledged (None: not yet, and not
        ``block``); raises :class:`SpillFailed`."""
        producer = write.producer
        try:
            while not write.acknowledged():
                left = write.deadline - time.monotonic()
                if left <= 0:
                    raise SpillFailed(
                        f"no acknowledgement of the offset map records in {self.topic} "
                        f"within {SIDE_TIMEOUT:.0f}s"
                    )
                if not block:
                    producer.poll(0)
                    if not write.acknowledged():
                        return None
                    break
                producer.flush(min(1.0, left))
        except KafkaException as exc:
            raise _failed(exc) from exc
        return write.offsets()

    def forget(self, tps: Sequence[TopicPartition] | None = None) -> None:
        """Drop what was written for ``tps`` (revoked), or for every partition (a transaction
        aborted: its records are aborted too, so nothing written may be referenced again)."""
        if tps is None:
            self._written.clear()
            self._forgot_all += 1
            return
        for tp in tps:
            self._written.pop(tp, None)
            self._keys.discard(tp)
            self._inline.discard(tp)
            self._forgot[tp] = self._forgot.get(tp, 0) + 1

    def _own_producer(self) -> Any:
        if self._producer is None:
            settings = side_client_config(self._config)
            # A side topic deleted meanwhile is created again by _ensure_topic, compacted: never
            # by the broker's auto-creation, whose defaults (cleanup.policy=delete) lose maps.
            settings.update(
                {
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 0,
                    "allow.auto.create.topics": False,
                }
            )
            said = client_log(f"{self._name} offset-map producer", settings)
            self._producer = self._producer_factory(said.configure(settings))
        return self._producer

    def _ensure_topic(self) -> None:
        if self._topic_ready:
            return
        settings = side_client_config(self._config)
        said = client_log(f"{self._name} offset-map admin", settings)
        try:
            admin = self._admin_factory(said.configure(settings))
            found = admin.list_topics(topic=self.topic, timeout=SIDE_TIMEOUT).topics.get(self.topic)
            if found is None or found.error is not None:
                futures = admin.create_topics(
                    [NewTopic(self.topic, 1, config={"cleanup.policy": "compact"})],
                    request_timeout=SIDE_TIMEOUT,
                )
                try:
                    futures[self.topic].result(SIDE_TIMEOUT)
                    log.info("created the offset map topic %s (cleanup.policy=compact)", self.topic)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            raise SpillFailed(
                f"the offset map topic {self.topic!r} does not exist and could not be created "
                f"({exc}): create it (1 partition, cleanup.policy=compact) or allow the consumer "
                "to, name another with Options(offset_map_topic=...), or set "
                "Options(spill_offset_maps=False) to throttle such partitions instead",
                permanent=error is not None and error.code() in _PERMANENT,
            ) from exc
        self._topic_ready = True

    # -- reading --------------------------------------------------------------------------------

    def resolve(self, tp: TopicPartition, committed: int, metadata: str) -> str | None:
        """The map to restore ``tp`` from when its committed ``metadata`` is a reference (None
        when it is not): the map fetched from the side topic, exactly as written, or ``""``
        (replay from the committed offset, with a WARNING) when it cannot be had."""
        try:
            ref = parse_reference(metadata)
        except OffsetDecodeError as exc:
            return self._lost(tp, committed, str(exc))
        if ref is None:
            return None
        self._keys.add(tp)  # whatever happens below, the key may hold a map: tombstone it later
        try:
            key, value = self._reader.read(ref)
            found = read_side_value(
                ref, key, value, expected_key=side_key(self._group, *tp), committed_offset=committed
            )
        except (OffsetDecodeError, KafkaException) as exc:
            return self._lost(tp, committed, str(exc))
        log.info("%s[%d]: restored the offset map from %s", *tp, ref)
        return found

    def _lost(self, tp: TopicPartition, committed: int, why: str) -> str:
        log.warning(
            "%s[%d]: the offset map committed at offset %d is not in the side topic (%s); "
            "replaying everything from that offset (finished records may run again)",
            *tp,
            committed,
            why,
        )
        return ""

    def close(self) -> None:
        """Close the clients (on the poller thread, as it stops)."""
        if self._producer is not None:
            self._producer.flush(SIDE_TIMEOUT)
            self._producer = None
        self._reader.close()

    def __repr__(self) -> str:
        return (
            f"<SpillStore {self.topic} spilled={len(self._keys)} written={self.records_written} "
            f"tombstones={self.tombstones_written}>"
        )


def spill_store_for(
    options: Options,
    config: Mapping[str, Any],
    *,
    producer_factory: Callable[[dict[str, Any]], Any],
    consumer_factory: Callable[[dict[str, Any]], Any],
    admin_factory: Callable[[dict[str, Any]], Any],
    name: str,
) -> SpillStore | None:
    """The side topic store ``options`` ask for (None when maps never spill)."""
    if not options.spill_offset_maps:
        return None
    group = str(config["group.id"])
    return SpillStore(
        config,
        group=group,
        topic=options.offset_map_topic or default_spill_topic(group),
        producer_factory=producer_factory,
        consumer_factory=consumer_factory,
        admin_factory=admin_factory,
        name=name,
    )


def _failed(exc: KafkaException) -> SpillFailed:
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    permanent = error is not None and error.code() in _PERMANENT
    reason = f"writing the offset map to the side topic failed: {exc}"
    return SpillFailed(reason, permanent=permanent)
