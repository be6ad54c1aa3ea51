"""The fake consumer: one group member over a fake cluster, with confluent-kafka's interface
(see :mod:`parallel_consumer.testing.fakes`)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from parallel_consumer.testing._fake_topics import TP, FakeTopics, offset_of

__all__ = ["FakeConsumer"]


class FakeConsumer:
    """A single group member over a :class:`FakeCluster`, with confluent-kafka's interface."""

    def __init__(self, cluster: FakeTopics, config: dict[str, Any]) -> None:
        self._cluster = cluster
        self._cond = cluster._cond
        self._group = str(config["group.id"])
        self._on_commit: Callable[[Any, list[TopicPartition]], None] | None = config.get(
            "on_commit"
        )
        self._error_cb: Callable[[KafkaError], None] | None = config.get("error_cb")
        #: librdkafka reports every broker down once per outage.
        self._down_reported = False
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
        deadline = time.monotonic() + (timeout if timeout >= 0 else 3600.0)
        if self._unreachable(deadline):
            return []
        self._serve_callbacks()
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

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """Cluster metadata (of every topic: ``topic`` is not looked at); raises while the
        brokers are down (see :meth:`FakeCluster.brokers_down`)."""
        self._check_open()
        if not self._cluster._reachable:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "all brokers are down"))
        return self._cluster._metadata()

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

    def _unreachable(self, deadline: float) -> bool:
        """While the brokers are down: report it once, wait until they are back or the
        deadline passes; True if they are still down."""
        with self._cond:
            if self._cluster._reachable:
                self._down_reported = False
                return False
            report = not self._down_reported
            self._down_reported = True
        if report and self._error_cb is not None:
            self._error_cb(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
        with self._cond:
            while not self._cluster._reachable:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return True
                self._cond.wait(remaining)
            self._down_reported = False
            return False

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
                self._assigned[tp] = offset_of(got[-1]) + 1
                out.extend(got)
        return out

    def __repr__(self) -> str:
        return f"<FakeConsumer group={self._group} assigned={len(self._assigned)}>"
