"""In-memory test doubles: a fake Kafka cluster and a consumer with confluent-kafka's interface.

For fast unit tests of the engine and of user handlers; integration tests use :class:`LocalKafka`.
The fake consumer implements only what ParallelConsumer uses (subscribe with rebalance
callbacks, consume, commit with the ``on_commit`` callback, committed, pause, resume, close) and
hands out real ``confluent_kafka.Message`` objects. Group membership is explicit: the first
``consume()`` assigns every partition of the subscribed topics, and :meth:`FakeConsumer.rebalance`
revokes or assigns partitions on the next ``consume()``.
"""

from __future__ import annotations

import bisect
import random
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

__all__ = ["FakeAdmin", "FakeCluster", "FakeConsumer", "FakeProducer"]

TP = tuple[str, int]


class FakeCluster:
    """Topics (lists of records per partition) and committed offsets per group. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._logs: dict[str, list[list[Message]]] = {}
        self._commits: dict[tuple[str, TP], tuple[int, str | None]] = {}
        self._time_ms = 1_700_000_000_000
        #: Set: an admin client's create_topics fails (as under a policy or an ACL).
        self.refuse_topic_creation = False

    def create_topic(self, name: str, partitions: int = 1) -> None:
        with self._cond:
            if name in self._logs:
                raise ValueError(f"topic {name!r} exists")
            self._logs[name] = [[] for _ in range(partitions)]

    def delete_topic(self, name: str) -> None:
        """Remove a topic and its records (producing to it fails until it is created again)."""
        with self._cond:
            del self._logs[name]

    def records(self, topic: str) -> list[Message]:
        """Every record of ``topic``, partition by partition."""
        with self._cond:
            return [m for log in self._logs[topic] for m in log]

    def admin(self, config: dict[str, Any]) -> FakeAdmin:
        """An admin client for ``ParallelConsumer(admin_factory=...)``."""
        return FakeAdmin(self)

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> tuple[int, int]:
        """Append a record; returns (partition, offset). Without a partition, keys hash to one."""
        with self._cond:
            logs = self._logs[topic]
            if partition is None:
                partition = 0 if key is None else sum(key) % len(logs)
            log = logs[partition]
            offset = _offset(log[-1]) + 1 if log else 0
            self._time_ms += 1
            log.append(
                Message(
                    topic=topic,
                    partition=partition,
                    offset=offset,
                    key=key,
                    value=value,
                    headers=headers,
                    timestamp=(1, self._time_ms),
                )
            )
            self._cond.notify_all()
            return partition, offset

    def delete_records(self, topic: str, partition: int, offsets: Iterable[int]) -> None:
        """Remove records, as compaction would (offsets keep their gaps)."""
        gone = set(offsets)
        with self._cond:
            log = self._logs[topic][partition]
            log[:] = [m for m in log if _offset(m) not in gone]

    def committed(self, group: str, topic: str, partition: int) -> tuple[int, str | None] | None:
        with self._cond:
            return self._commits.get((group, (topic, partition)))

    def set_committed(
        self, group: str, topic: str, partition: int, offset: int, metadata: str | None = None
    ) -> None:
        with self._cond:
            self._commits[(group, (topic, partition))] = (offset, metadata)

    def producer(self, config: dict[str, Any]) -> FakeProducer:
        """A producer writing to this cluster (for ``ParallelConsumer(producer_factory=...)``)."""
        return FakeProducer(self, config)

    def consumer(self, config: dict[str, Any]) -> FakeConsumer:
        """A consumer factory: ``ParallelConsumer(config, consumer_factory=cluster.consumer)``."""
        return FakeConsumer(self, config)

    # -- used by FakeConsumer, under the condition --

    def _topics(self) -> list[str]:
        return list(self._logs)

    def _partitions(self, topic: str) -> int:
        return len(self._logs[topic])

    def _read(self, tp: TP, position: int, limit: int) -> list[Message]:
        log = self._logs[tp[0]][tp[1]]
        start = bisect.bisect_left(log, position, key=_offset)  # offsets increase, with gaps
        return log[start : start + limit]

    def _end(self, tp: TP) -> int:
        log = self._logs[tp[0]][tp[1]]
        return _offset(log[-1]) + 1 if log else 0


class FakeConsumer:
    """A single group member over a :class:`FakeCluster`, with confluent-kafka's interface."""

    def __init__(self, cluster: FakeCluster, config: dict[str, Any]) -> None:
        self._cluster = cluster
        self._cond = cluster._cond
        self._group = str(config["group.id"])
        self._on_commit: Callable[[Any, list[TopicPartition]], None] | None = config.get(
            "on_commit"
        )
        self._reset = str(config.get("auto.offset.reset", "earliest"))
        self._subscription: list[str] = []
        self._callbacks: dict[str, Callable[..., Any] | None] = {}
        self._assigned: dict[TP, int] = {}  # tp -> position
        self._paused: set[TP] = set()
        self._pending_rebalances: list[tuple[list[TP], list[TP]]] = []
        self._pending_commit_callbacks: list[tuple[Any, list[TopicPartition]]] = []
        self._fail_commits = 0
        self._fail_code = KafkaError.REQUEST_TIMED_OUT
        self._lose_answers = 0
        #: Asynchronous commits received while holding, not yet stored (see hold_commits).
        self._held: list[list[TopicPartition]] | None = None
        self._first_assignment_done = False
        self._closed = False
        self._to_lose: list[list[TP]] = []
        #: Every commit request received: (tp, offset, metadata). For assertions.
        self.commit_log: list[tuple[TP, int, str | None]] = []

    # -- test controls (any thread) -----------------------------------------------------------

    def rebalance(self, *, revoke: Iterable[TP] = (), assign: Iterable[TP] = ()) -> None:
        """Revoke and/or assign partitions during the next ``consume()``."""
        with self._cond:
            self._pending_rebalances.append((list(revoke), list(assign)))
            self._cond.notify_all()

    def lose(self, tps: Iterable[TP]) -> None:
        """Lose partitions (``on_lost``, no revoke) during the next ``consume()``."""
        with self._cond:
            self._to_lose.append(list(tps))
            self._cond.notify_all()

    def lose_next_commit_answers(self, count: int) -> None:
        """Store the next ``count`` asynchronous commits but never call ``on_commit`` for them."""
        with self._cond:
            self._lose_answers += count

    def hold_commits(self) -> None:
        """Keep asynchronous commits on their way (neither stored nor answered) until
        :meth:`release_commits`: a coordinator that is moving or restarting."""
        with self._cond:
            if self._held is None:
                self._held = []

    def held_commits(self) -> int:
        with self._cond:
            return len(self._held or ())

    def release_commits(self, *, reverse: bool = False) -> None:
        """Store the held commits and answer them, in the order they were sent or, with
        ``reverse``, newest first (a retried request stored after a newer one); commits from
        now on are stored at once again."""
        with self._cond:
            held, self._held = self._held or [], None
            for requested in reversed(held) if reverse else held:
                self._store(requested)
                self._pending_commit_callbacks.append((None, requested))
            self._cond.notify_all()

    def fail_next_commits(self, count: int, code: int = KafkaError.REQUEST_TIMED_OUT) -> None:
        """Make the next ``count`` commit requests fail with the broker error ``code`` (a
        ``KafkaError`` code; by default a retriable time-out)."""
        with self._cond:
            self._fail_commits += count
            self._fail_code = code

    def paused(self) -> set[TP]:
        with self._cond:
            return set(self._paused)

    # -- the confluent_kafka.Consumer subset --------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[..., Any] | None = None,
        on_revoke: Callable[..., Any] | None = None,
        on_lost: Callable[..., Any] | None = None,
    ) -> None:
        self._subscription = list(topics)
        self._callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        self._check_open()
        self._serve_callbacks()
        deadline = time.monotonic() + (timeout if timeout >= 0 else 3600.0)
        with self._cond:
            while True:
                out = self._fetch(num_messages)
                waiting = self._pending_rebalances or self._pending_commit_callbacks
                if out or waiting or self._to_lose:
                    return out
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._cond.wait(remaining)

    def commit(
        self, offsets: list[TopicPartition] | None = None, asynchronous: bool = True
    ) -> list[TopicPartition] | None:
        self._check_open()
        with self._cond:
            requested = list(offsets or [])
            for tp in requested:
                self.commit_log.append(((tp.topic, tp.partition), tp.offset, tp.metadata))
            if self._fail_commits:
                self._fail_commits -= 1
                error = KafkaError(self._fail_code, "injected commit failure")
                if not asynchronous:
                    raise KafkaException(error)
                self._pending_commit_callbacks.append((error, requested))
                self._cond.notify_all()
                return None
            if asynchronous and self._held is not None:
                self._held.append(requested)
                return None
            self._store(requested)
            if asynchronous:
                if self._lose_answers:
                    self._lose_answers -= 1
                    return None
                self._pending_commit_callbacks.append((None, requested))
                self._cond.notify_all()
                return None
            return requested

    def _store(self, requested: list[TopicPartition]) -> None:
        for tp in requested:
            self._cluster._commits[(self._group, (tp.topic, tp.partition))] = (
                tp.offset,
                tp.metadata,
            )

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[Any]:
        with self._cond:
            out = []
            for p in partitions:
                found = self._cluster._commits.get((self._group, (p.topic, p.partition)))
                if found is None:
                    out.append(TopicPartition(p.topic, p.partition, -1001))
                elif found[1] is None:  # committed without metadata
                    out.append(TopicPartition(p.topic, p.partition, found[0]))
                else:
                    out.append(TopicPartition(p.topic, p.partition, found[0], found[1]))
            return out

    def pause(self, partitions: list[TopicPartition]) -> None:
        with self._cond:
            self._paused.update((p.topic, p.partition) for p in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        with self._cond:
            self._paused.difference_update((p.topic, p.partition) for p in partitions)
            self._cond.notify_all()

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        with self._cond:
            return [
                TopicPartition(
                    p.topic, p.partition, self._assigned.get((p.topic, p.partition), -1001)
                )
                for p in partitions
            ]

    def assignment(self) -> list[TopicPartition]:
        with self._cond:
            return [TopicPartition(t, p) for t, p in self._assigned]

    def consumer_group_metadata(self) -> str:
        return self._group

    def seek(self, partition: TopicPartition) -> None:
        with self._cond:
            tp = (partition.topic, partition.partition)
            if tp not in self._assigned:
                raise KafkaException(KafkaError(KafkaError._STATE, f"{tp} is not assigned"))
            self._assigned[tp] = partition.offset

    def close(self) -> None:
        if self._closed:
            return
        with self._cond:
            revoked = list(self._assigned)
        if revoked:
            self._call("revoke", revoked)
        with self._cond:
            # (the client finishes commits on their way before it closes)
            for requested in self._held or ():
                self._store(requested)
            self._held = None
            self._assigned.clear()
            self._closed = True

    # -- internals ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("FakeConsumer is closed")

    def _serve_callbacks(self) -> None:
        with self._cond:
            commits, self._pending_commit_callbacks = self._pending_commit_callbacks, []
            rebalances, self._pending_rebalances = self._pending_rebalances, []
            losses, self._to_lose = self._to_lose, []
            if not self._first_assignment_done and self._subscription:
                self._first_assignment_done = True
                rebalances.insert(0, ([], self._subscribed_partitions()))
        for error, partitions in commits:
            if self._on_commit is not None:
                self._on_commit(error, partitions)
        for lost in losses:
            self._call("lost", lost)
            with self._cond:
                for tp in lost:
                    # (a pause stays: librdkafka keeps it on the partition across a revoke,
                    # and a partition handed back comes back paused)
                    self._assigned.pop(tp, None)
        for revoke, assign in rebalances:
            if revoke:
                self._call("revoke", revoke)
                with self._cond:
                    for tp in revoke:
                        self._assigned.pop(tp, None)  # (its pause stays, as above)
            if assign:
                with self._cond:
                    for tp in assign:
                        self._assigned[tp] = self._start_position(tp)
                self._call("assign", assign)

    def _call(self, name: str, tps: list[TP]) -> None:
        callback = self._callbacks.get(name)
        if callback is not None:
            callback(self, [TopicPartition(t, p) for t, p in tps])

    def _subscribed_partitions(self) -> list[TP]:
        out: list[TP] = []
        for topic in self._cluster._topics():
            if any(
                (pattern.startswith("^") and re.match(pattern, topic)) or pattern == topic
                for pattern in self._subscription
            ):
                out.extend((topic, p) for p in range(self._cluster._partitions(topic)))
        return out

    def _start_position(self, tp: TP) -> int:
        found = self._cluster._commits.get((self._group, tp))
        if found is not None:
            return found[0]
        return 0 if self._reset in ("earliest", "smallest", "beginning") else self._cluster._end(tp)

    def _fetch(self, limit: int) -> list[Message]:
        out: list[Message] = []
        for tp, position in self._assigned.items():
            if tp in self._paused or len(out) >= limit:
                continue
            got = self._cluster._read(tp, position, limit - len(out))
            if got:
                self._assigned[tp] = _offset(got[-1]) + 1
                out.extend(got)
        return out

    def __repr__(self) -> str:
        return f"<FakeConsumer group={self._group} assigned={len(self._assigned)}>"


def _offset(message: Message) -> int:
    offset = message.offset()
    assert offset is not None
    return offset


class FakeAdmin:
    """The two admin calls the library makes (``list_topics`` and ``create_topics``)."""

    def __init__(self, cluster: FakeCluster) -> None:
        self._cluster = cluster

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        with self._cluster._cond:
            topics = {
                name: SimpleNamespace(
                    topic=name, error=None, partitions={i: i for i in range(len(logs))}
                )
                for name, logs in self._cluster._logs.items()
            }
        return SimpleNamespace(topics=topics)

    def create_topics(self, new_topics: list[Any], **_: Any) -> dict[str, Future[None]]:
        out: dict[str, Future[None]] = {}
        for new in new_topics:
            future: Future[None] = Future()
            if self._cluster.refuse_topic_creation:
                error = KafkaError(KafkaError.POLICY_VIOLATION, "topic creation refused")
                future.set_exception(KafkaException(error))
            else:
                try:
                    self._cluster.create_topic(new.topic, max(new.num_partitions, 1))
                except ValueError:
                    error = KafkaError(KafkaError.TOPIC_ALREADY_EXISTS, "exists")
                    future.set_exception(KafkaException(error))
                else:
                    future.set_result(None)
            out[new.topic] = future
        return out


class FakeProducer:
    """Writes to a :class:`FakeCluster` with confluent-kafka's producer interface: ``produce``
    appends at once, and the delivery report is served by the next ``poll``/``flush``. The
    transactional calls track their state (they isolate nothing: outputs are visible at once)
    and ``send_offsets_to_transaction`` commits the group's offsets when the transaction
    commits. Test controls: :meth:`fail_next_deliveries`."""

    def __init__(self, cluster: FakeCluster, config: dict[str, Any]) -> None:
        self._cluster = cluster
        self._lock = threading.Lock()
        self._reports: list[tuple[Callable[..., Any] | None, Any, Any]] = []
        self._fail_deliveries = 0
        self._fail_rate = 0.0
        self._fail_random = random.Random(0)
        self._transactional = "transactional.id" in config
        self._in_transaction = False
        self._offsets: list[tuple[str, list[TopicPartition]]] = []
        self._fail_commits: list[KafkaError] = []
        self._fatal: KafkaError | None = None
        self._max_bytes = int(config.get("message.max.bytes", 1_000_000))
        #: Set: delivery reports wait (a slow broker); clear it to let them through.
        self.hold = threading.Event()
        #: Values produced in the open transaction.
        self.open_outputs: list[bytes | None] = []
        #: Per committed transaction: its values, and its offsets ((topic, partition), offset).
        self.committed_transactions: list[tuple[list[bytes | None], list[tuple[TP, int]]]] = []
        #: Per aborted transaction: its values.
        self.aborted_transactions: list[list[bytes | None]] = []
        #: Every record produced: (topic, partition, offset, key, value).
        self.produced: list[tuple[str, int, int, bytes | None, bytes | None]] = []
        #: Transactions committed / aborted so far.
        self.commits = 0
        self.aborts = 0

    def fail_next_commit(self, error: KafkaError | None = None) -> None:
        """The next ``commit_transaction`` fails (by default with an abortable error)."""
        self._fail_commits.append(
            error or KafkaError(KafkaError._STATE, "injected", txn_requires_abort=True)
        )

    def committed_outputs(self) -> list[bytes | None]:
        return [v for values, _ in self.committed_transactions for v in values]

    def fail_next_deliveries(self, count: int) -> None:
        """The next ``count`` produced records get a failed delivery report (nothing written)."""
        with self._lock:
            self._fail_deliveries += count

    def fail_deliveries_at_random(self, rate: float, seed: int = 0) -> None:
        """From now on each produced record fails its delivery with probability ``rate``
        (nothing written), drawn from a generator seeded with ``seed``."""
        with self._lock:
            self._fail_rate = rate
            self._fail_random = random.Random(seed)

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        on_delivery: Callable[..., Any] | None = None,
        headers: Any = None,
        **_: Any,
    ) -> None:
        if self._transactional and not self._in_transaction:
            raise KafkaException(KafkaError(KafkaError._STATE, "no transaction in progress"))
        if value is not None and len(value) > self._max_bytes:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
        with self._lock:
            if self._fail_deliveries or (
                self._fail_rate and self._fail_random.random() < self._fail_rate
            ):
                self._fail_deliveries = max(0, self._fail_deliveries - 1)
                error = KafkaError(KafkaError._MSG_TIMED_OUT, "injected delivery failure")
                message = Message(topic=topic, partition=max(partition, 0), key=key, value=value)
                self._reports.append((on_delivery, error, message))
                return
        if topic not in self._cluster._logs:
            error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"no topic {topic}")
            with self._lock:
                self._reports.append((on_delivery, error, Message(topic=topic)))
            return
        where, offset = self._cluster.produce(
            topic,
            value,
            key,
            partition=None if partition < 0 else partition,
            headers=headers,
        )
        with self._lock:
            self.produced.append((topic, where, offset, key, value))
            self.open_outputs.append(value)
            message = Message(topic=topic, partition=where, offset=offset, key=key, value=value)
            self._reports.append((on_delivery, None, message))

    def fail_fatally(self, error: KafkaError) -> None:
        """From now on ``poll`` raises ``error`` (as the client does after a fatal error, such
        as being fenced by a newer producer with the same ``transactional.id``)."""
        self._fatal = error

    def poll(self, timeout: float = -1) -> int:
        if self._fatal is not None:
            raise KafkaException(self._fatal)
        if self.hold.is_set():
            time.sleep(min(max(timeout, 0.0), 0.05))
            return 0
        with self._lock:
            reports, self._reports = self._reports, []
        for callback, error, message in reports:
            if callback is not None:
                callback(error, message)
        if not reports and timeout > 0:
            time.sleep(min(timeout, 0.005))
        return len(reports)

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return 0

    def init_transactions(self, timeout: float = -1) -> None:
        pass

    def begin_transaction(self) -> None:
        self._in_transaction = True

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None:
        self._offsets.append((str(group_metadata), list(positions)))

    def commit_transaction(self, timeout: float = -1) -> None:
        if self._fail_commits:
            raise KafkaException(self._fail_commits.pop(0))
        self.flush()
        offsets = [((tp.topic, tp.partition), tp.offset) for _, ps in self._offsets for tp in ps]
        with self._lock:
            self.committed_transactions.append((self.open_outputs, offsets))
            self.open_outputs = []
        with self._cluster._cond:
            for group, positions in self._offsets:
                for tp in positions:
                    self._cluster._commits[(group, (tp.topic, tp.partition))] = (
                        tp.offset,
                        tp.metadata,
                    )
        self._offsets.clear()
        self._in_transaction = False
        self.commits += 1

    def abort_transaction(self, timeout: float = -1) -> None:
        with self._lock:
            self.aborted_transactions.append(self.open_outputs)
            self.open_outputs = []
        self._offsets.clear()
        self._in_transaction = False
        self.aborts += 1
