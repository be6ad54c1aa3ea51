"""The fake producer and admin client over a fake cluster, with confluent-kafka's interfaces
(see :mod:`parallel_consumer.testing.fakes`)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from parallel_consumer.testing._fake_topics import TP, FakeTopics

__all__ = ["FakeAdmin", "FakeProducer"]


class FakeAdmin:
    """The two admin calls the library makes (``list_topics`` and ``create_topics``)."""

    def __init__(self, cluster: FakeTopics) -> None:
        self._cluster = cluster

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self._cluster._metadata()

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

    def __init__(self, cluster: FakeTopics, config: dict[str, Any]) -> None:
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
        """From now on ``poll`` and the transactional calls raise ``error`` (as the client
        does after a fatal error, such as being fenced by a newer producer with the same
        ``transactional.id``)."""
        self._fatal = error

    def _raise_if_fatal(self) -> None:
        if self._fatal is not None:
            raise KafkaException(self._fatal)

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
        self._raise_if_fatal()
        self._offsets.append((str(group_metadata), list(positions)))

    def commit_transaction(self, timeout: float = -1) -> None:
        self._raise_if_fatal()
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
        self._raise_if_fatal()
        with self._lock:
            self.aborted_transactions.append(self.open_outputs)
            self.open_outputs = []
        self._offsets.clear()
        self._in_transaction = False
        self.aborts += 1
