"""The data of a fake Kafka cluster: topics (records per partition), committed offsets per
group, and whether its brokers are reachable. :class:`~parallel_consumer.testing.fakes.FakeCluster`
adds the clients' factories; the fake clients read and write it under its condition.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from confluent_kafka import Message

__all__ = ["TP", "FakeTopics", "offset_of"]

TP = tuple[str, int]


class FakeTopics:
    """Topics (lists of records per partition), committed offsets per group and whether the
    brokers are reachable. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._logs: dict[str, list[list[Message]]] = {}
        self._commits: dict[tuple[str, TP], tuple[int, str | None]] = {}
        self._time_ms = 1_700_000_000_000
        #: Set: an admin client's create_topics fails (as under a policy or an ACL).
        self.refuse_topic_creation = False
        #: Cleared by brokers_down(): consumers then fetch nothing, and report it once.
        self._reachable = True

    def create_topic(self, name: str, partitions: int = 1) -> None:
        with self._cond:
            if name in self._logs:
                raise ValueError(f"topic {name!r} exists")
            self._logs[name] = [[] for _ in range(partitions)]

    def brokers_down(self) -> None:
        """Every broker goes down: a consumer reports ``_ALL_BROKERS_DOWN`` to its
        ``error_cb`` once (inside ``consume()``, like librdkafka), then fetches nothing, serves
        no callback and answers no metadata request until :meth:`brokers_up`."""
        with self._cond:
            self._reachable = False
            self._cond.notify_all()

    def brokers_up(self) -> None:
        """The brokers are back (see :meth:`brokers_down`)."""
        with self._cond:
            self._reachable = True
            self._cond.notify_all()

    def delete_topic(self, name: str) -> None:
        """Remove a topic and its records (producing to it fails until it is created again)."""
        with self._cond:
            del self._logs[name]

    def records(self, topic: str) -> list[Message]:
        """Every record of ``topic``, partition by partition."""
        with self._cond:
            return [m for log in self._logs[topic] for m in log]

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
            offset = offset_of(log[-1]) + 1 if log else 0
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
            log[:] = [m for m in log if offset_of(m) not in gone]

    def committed(self, group: str, topic: str, partition: int) -> tuple[int, str | None] | None:
        with self._cond:
            return self._commits.get((group, (topic, partition)))

    def set_committed(
        self, group: str, topic: str, partition: int, offset: int, metadata: str | None = None
    ) -> None:
        with self._cond:
            self._commits[(group, (topic, partition))] = (offset, metadata)

    # -- used by FakeConsumer, under the condition --

    def _metadata(self) -> Any:
        """What ``list_topics()`` answers: every topic with its partitions."""
        with self._cond:
            topics = {
                name: SimpleNamespace(
                    topic=name, error=None, partitions={i: i for i in range(len(logs))}
                )
                for name, logs in self._logs.items()
            }
        return SimpleNamespace(topics=topics)

    def _topics(self) -> list[str]:
        return list(self._logs)

    def _partitions(self, topic: str) -> int:
        return len(self._logs[topic])

    def _read(self, tp: TP, position: int, limit: int) -> list[Message]:
        log = self._logs[tp[0]][tp[1]]
        start = bisect.bisect_left(log, position, key=offset_of)  # offsets increase, with gaps
        return log[start : start + limit]

    def _end(self, tp: TP) -> int:
        log = self._logs[tp[0]][tp[1]]
        return offset_of(log[-1]) + 1 if log else 0


def offset_of(message: Message) -> int:
    offset = message.offset()
    assert offset is not None
    return offset
