"""The benchmark's own broker traffic: reachability, topics, producing, watching commits."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from parallel_consumer.bench.model import DataSet
from parallel_consumer.client_config import FETCH_QUEUE_BACKOFF_MS
from parallel_consumer.testing import create_topic

__all__ = [
    "LOCAL_BROKER_CONFIG",
    "BrokerUnreachable",
    "base_consumer_config",
    "check_reachable",
    "end_offsets",
    "prepare_topic",
    "wait_committed",
]


class BrokerUnreachable(Exception):
    """``--bootstrap`` names no broker that answers."""


def base_consumer_config(bootstrap: str, group: str) -> dict[str, Any]:
    """What every Python contestant's consumer shares (KAFKA.md's fast-test settings).

    ``fetch.queue.backoff.ms`` is this library's default (librdkafka's is 1000): with
    librdkafka's, a loop that reads slower than the client fetches (``serial``, and ``raw``
    with its log) finds the prefetch queue full, and the client waits a whole second before it
    fetches again. The peers get the setting a user tuning them would give them."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 1000,
        "fetch.wait.max.ms": 50,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
    }


def new_group(prefix: str) -> str:
    return f"bench-{prefix}-{uuid.uuid4().hex[:8]}"


#: How long ``--bootstrap`` gets to answer before the run gives up.
REACH_TIMEOUT = 5.0


def check_reachable(bootstrap: str, timeout: float | None = None) -> None:
    """Raise :class:`BrokerUnreachable` unless a broker answers a metadata request in time."""
    from confluent_kafka.admin import AdminClient

    # log_level 0: librdkafka's own connection-refused lines would repeat what we say once.
    timeout = REACH_TIMEOUT if timeout is None else timeout
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnreachable(
            f"no Kafka broker answers at {bootstrap} within {timeout:g} s ({exc.args[0]}); "
            "check --bootstrap, or leave it out to start a local broker"
        ) from exc


def prepare_topic(bootstrap: str, data: DataSet, prefix: str) -> tuple[str, float]:
    """Create a topic and produce ``data`` to it round-robin over its partitions; returns the
    topic and the produce time in seconds (reported apart from every contestant's clock)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions=data.partitions)
    keys = data.key_list()
    value = b"x" * data.value_size
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            # A fresh broker answers the first idempotent producer with "coordinator load in
            # progress", which the client retries by itself.
            "log_level": 3,
        }
    )
    started = time.perf_counter()
    for i, key in enumerate(keys):
        while True:
            try:
                producer.produce(topic, value, key, partition=i % data.partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError(f"could not produce {data.records} records to {topic}")
    return topic, time.perf_counter() - started


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": new_group("watermarks")})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def wait_committed(
    bootstrap: str,
    group: str,
    topic: str,
    ends: dict[int, int],
    *,
    timeout: float,
    interval: float = 0.005,
) -> float:
    """Poll the group's committed offsets until they reach ``ends``; return when (epoch).

    For contestants that do not tell when their commits were acknowledged: the figure is late
    by at most ``interval`` plus one OffsetFetch round trip.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    wanted = [TopicPartition(topic, p) for p, end in ends.items() if end > 0]
    deadline = time.monotonic() + timeout
    try:
        while True:
            committed = consumer.committed(wanted, timeout=10)
            if all(tp.offset == ends[tp.partition] for tp in committed):
                return time.time()
            if time.monotonic() > deadline:
                got = {tp.partition: tp.offset for tp in committed}
                raise RuntimeError(f"commits of {group} did not reach {ends} in time: {got}")
            time.sleep(interval)
    finally:
        consumer.close()


#: The local broker's settings beyond LocalKafka's: a share-group member heartbeats every 5 s by
#: default and its first assignment waits for a heartbeat; start-up is not on the clock, but a
#: quick run should not spend its minutes there.
LOCAL_BROKER_CONFIG = {
    "group.share.min.heartbeat.interval.ms": "500",
    "group.share.heartbeat.interval.ms": "500",
}
