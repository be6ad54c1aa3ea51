"""Small blocking helpers for tests: create a topic, produce records, read a topic back.

They talk to any broker by its bootstrap address (a :class:`LocalKafka` or an external one) and
raise :class:`LocalKafkaError` with what went wrong.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from parallel_consumer.testing._broker_process import LocalKafkaError

__all__ = ["TopicRecord", "create_topic", "produce_records", "read_topic"]

Payload = str | bytes | None


class TopicRecord(NamedTuple):
    """One record as stored in a topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def _as_bytes(data: Payload) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _stored(msg: Any) -> TopicRecord:
    # partition and offset are always set on delivered and consumed (non-error) messages.
    return TopicRecord(msg.partition(), msg.offset(), msg.key(), msg.value())


def create_topic(
    bootstrap_servers: str,
    name: str,
    *,
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    exist_ok: bool = False,
    client_config: Mapping[str, Any] | None = None,
    replication_factor: int | None = None,
) -> str:
    """Create topic ``name`` and wait until it is usable; return ``name``.

    ``replication_factor`` None takes the broker's ``default.replication.factor``: 1 on a
    single broker, 3 on ``LocalKafka(brokers=3)`` (whose ``min.insync.replicas`` is 2).

    A topic that already exists raises :class:`LocalKafkaError`, unless ``exist_ok``: then it is
    used as it is if it has ``partitions`` partitions (its ``config`` is not compared), and
    raises if it has another number of them. ``client_config``: more settings of the admin
    client (credentials, for a secured broker)."""
    # NewTopic's documented home; the package's stubs re-export it without marking it public.
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({**(client_config or {}), "bootstrap.servers": bootstrap_servers})
    replicas = -1 if replication_factor is None else replication_factor
    new = NewTopic(
        name, num_partitions=partitions, replication_factor=replicas, config=dict(config or {})
    )
    exists = False
    try:
        admin.create_topics([new], operation_timeout=timeout, request_timeout=timeout)[name].result(
            timeout
        )
    except KafkaException as exc:
        exists = exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
        if not (exists and exist_ok):
            hint = " (exist_ok=True uses it as it is)" if exists else ""
            raise LocalKafkaError(f"could not create topic {name!r}: {exc}{hint}") from exc
    except Exception as exc:
        raise LocalKafkaError(f"could not create topic {name!r}: {exc}") from exc
    # The controller has it; wait until the broker's metadata shows every partition with a leader.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=timeout).topics.get(name)
        found = 0 if topic is None or topic.error is not None else len(topic.partitions)
        if exists and found and found != partitions:
            raise LocalKafkaError(
                f"topic {name!r} exists with {found} partition(s), not {partitions}"
            )
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        ):
            return name
        time.sleep(0.05)
    raise LocalKafkaError(f"topic {name!r} was created but has no leaders after {timeout} s")


def produce_records(
    bootstrap_servers: str,
    topic: str,
    n: int,
    *,
    keys: Sequence[Payload] | None = None,
    values: Sequence[Payload] | None = None,
    partitions: Sequence[int] | None = None,
    producer_config: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
) -> list[TopicRecord]:
    """Produce ``n`` records and return where each landed, in the order they were sent.

    Record ``i`` gets ``keys[i % len(keys)]`` (default: no key), ``values[i % len(values)]``
    (default ``"value-<i>"``) and partition ``partitions[i % len(partitions)]`` (default: the
    partitioner's choice). The producer is idempotent, so retries never duplicate or reorder.
    """
    from confluent_kafka import Producer

    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "enable.idempotence": True,
        "linger.ms": 5,
    }
    config.update(producer_config or {})
    producer = Producer(config)
    results: list[TopicRecord | None] = [None] * n
    errors: list[str] = []

    def delivered(index: int) -> Any:
        def callback(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(f"record {index}: {err}")
            else:
                results[index] = _stored(msg)

        return callback

    for i in range(n):
        kwargs: dict[str, Any] = {
            "key": _as_bytes(keys[i % len(keys)]) if keys else None,
            "value": _as_bytes(values[i % len(values)]) if values else f"value-{i}".encode(),
            "on_delivery": delivered(i),
        }
        if partitions:
            kwargs["partition"] = partitions[i % len(partitions)]
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:  # local queue full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(timeout)
    if remaining or errors:
        detail = "; ".join(errors[:5]) or f"{remaining} still queued after {timeout} s"
        raise LocalKafkaError(f"producing {n} records to {topic!r} failed: {detail}")
    return [r for r in results if r is not None]


def read_topic(
    bootstrap_servers: str,
    topic: str,
    *,
    isolation: Literal["read_committed", "read_uncommitted"] = "read_committed",
    timeout: float = 30.0,
    client_config: Mapping[str, Any] | None = None,
) -> list[TopicRecord]:
    """Read every partition of ``topic`` from the beginning to its current end.

    Uses no consumer group (nothing is committed). Returns records ordered by partition, then
    offset. With ``read_committed`` the end is the last stable offset: aborted records and
    records of still-open transactions are not returned. ``client_config``: more settings of
    the consumer (credentials, for a secured broker).
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **(client_config or {}),
            "bootstrap.servers": bootstrap_servers,
            "group.id": "pc-read-topic-unused",  # required by the client; never joined
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if metadata is None or metadata.error is not None:
            problem = "no such topic" if metadata is None else metadata.error
            raise LocalKafkaError(f"cannot read topic {topic!r}: {problem}")
        pending = set(metadata.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
        records: list[TopicRecord] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise LocalKafkaError(
                    f"reading {topic!r} did not reach the end of partitions {sorted(pending)} "
                    f"within {timeout} s"
                )
            for msg in consumer.consume(500, timeout=0.2):
                err = msg.error()
                if err is None:
                    records.append(_stored(msg))
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                else:
                    raise LocalKafkaError(f"reading {topic!r} failed: {err}")
        records.sort(key=lambda r: (r.partition, r.offset))
        return records
    finally:
        consumer.close()
